#!/usr/bin/env python3
"""Draws a tierd-train metrics file (JSONL, --metrics) with matplotlib, where it is installed
(Debian: apt-get install python3-matplotlib). tierd-train --plot draws the same without it.

  tools/plot_metrics.py run.jsonl run.png [--title TEXT]

Top: the training loss per step. Bottom, when the file has it: the bytes the tiers moved per
step (moved_bytes), or else the step time.
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics")
    parser.add_argument("png")
    parser.add_argument("--title", default="tierd-train")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_metrics: matplotlib is not installed (apt-get install python3-matplotlib); "
                 "tierd-train --plot draws the run without it")
    rows = []
    with open(args.metrics) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"plot_metrics: {args.metrics}:{number}: not JSON ({e})")
                if "step" in row:  # the run plan's line says how the run was made, not a step
                    rows.append(row)
    if not rows:
        sys.exit(f"plot_metrics: {args.metrics} has no steps")
    steps = [r["step"] for r in rows]
    moved = [r.get("moved_bytes") for r in rows]
    has_moved = any(m for m in moved)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    fig.suptitle(args.title)
    top.plot(steps, [r["loss"] for r in rows], color="#1e50dc", label="training loss")
    top.set_ylabel("loss (cross-entropy, nats per token)")
    top.grid(alpha=0.3)
    top.legend(loc="upper right")
    if has_moved:
        bottom.plot(steps, [(m or 0) / 1e6 for m in moved], color="#28a03c", label="bytes the tiers moved")
        bottom.set_ylabel("moved per step (MB)")
    else:
        bottom.plot(steps, [r["seconds"] * 1e3 for r in rows], color="#28a03c", label="step time")
        bottom.set_ylabel("step time (ms)")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)


if __name__ == "__main__":
    main()
