#!/usr/bin/env python3
"""Compares training runs of the same model on the same data (tierd-train --metrics files):
the table of issue 22's fidelity benchmark and, with --png, a plot of the curves.

  tools/fidelity_report.py [--png curves.png] [--noise NAME] [--window 50] NAME=metrics.jsonl ...

The first run is the baseline. For each run: tokens/s (median step), the mean training loss
over the last --window steps and its standard deviation there (the loss's jitter), the final
validation loss, and both as a percentage of the baseline's. The per-step difference from the
baseline over the window (mean and standard deviation) says whether a gap is steady or noise.
--noise names the run that differs from the baseline only in its data order: its gap is the
noise floor, and another run's gap means something only beyond it.

The plot (matplotlib; Debian: apt-get install python3-matplotlib): top, the training loss of
each run smoothed over 20 steps with its validation losses as dots; bottom, each run's
validation loss relative to the baseline's, in percent, against the step.
"""
import argparse
import json
import statistics
import sys


def read(path):
    steps, val = {}, []
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"fidelity_report: {path}:{number}: not JSON ({e})")
                if "validation_loss" in row:
                    val.append((row["step"], row["validation_loss"]))
                elif "loss" in row:
                    steps[row["step"]] = row
    except OSError as e:
        sys.exit(f"fidelity_report: cannot read {path}: {e.strerror}")
    if not steps:
        sys.exit(f"fidelity_report: {path} has no training steps: not a tierd-train metrics file")
    return steps, val


def pct(x, base):
    return 100.0 * (x - base) / base


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="NAME=PATH")
    parser.add_argument("--window", type=int, default=50, help="the last steps the training loss is averaged over")
    parser.add_argument("--noise", help="the run that differs from the first only in its data order")
    parser.add_argument("--png", help="draw the curves here")
    parser.add_argument("--title", default="fidelity: the same model, seed and data, several ways")
    args = parser.parse_args()
    runs = []
    for spec in args.runs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            sys.exit(f"fidelity_report: '{spec}' is not NAME=PATH")
        runs.append((name, *read(path)))
    names = [r[0] for r in runs]
    if args.noise and args.noise not in names:
        sys.exit(f"fidelity_report: --noise={args.noise} is none of the runs ({', '.join(names)})")
    base_name, base_steps, base_val = runs[0]
    last = max(base_steps)
    window = [s for s in range(last - args.window + 1, last + 1)]
    rows = []
    for name, steps, val in runs:
        if max(steps) != last:
            print(f"note: {name} ran {max(steps)} steps, {base_name} {last}: compared over the steps both have",
                  file=sys.stderr)
        w = [s for s in window if s in steps]
        losses = [steps[s]["loss"] for s in w]
        diffs = [pct(steps[s]["loss"], base_steps[s]["loss"]) for s in w if s in base_steps]
        seconds = statistics.median(r["seconds"] for r in steps.values())
        tokens = statistics.median(r["tokens"] for r in steps.values())
        rows.append({
            "name": name, "steps": max(steps), "tokens_per_s": tokens / seconds,
            "train": statistics.fmean(losses), "train_sd": statistics.pstdev(losses),
            "val": val[-1][1] if val else float("nan"),
            "diff_mean": statistics.fmean(diffs) if diffs else float("nan"),
            "diff_sd": statistics.pstdev(diffs) if len(diffs) > 1 else float("nan"),
        })
    base = rows[0]
    print(f"| run | steps | tokens/s | training loss, mean of the last {args.window} steps (sd) | vs {base_name} "
          f"| per-step difference from {base_name}: mean (sd) | final validation loss | vs {base_name} |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r is base:
            vs_train = vs_diff = vs_val = "-"
        else:
            vs_train = f"{pct(r['train'], base['train']):+.2f}%"
            vs_diff = f"{r['diff_mean']:+.2f}% ({r['diff_sd']:.2f}%)"
            vs_val = f"{pct(r['val'], base['val']):+.2f}%"
        print(f"| {r['name']} | {r['steps']} | {r['tokens_per_s']:,.0f} | {r['train']:.4f} ({r['train_sd']:.4f}) | "
              f"{vs_train} | {vs_diff} | {r['val']:.4f} | {vs_val} |")
    if args.noise:
        noise = next(r for r in rows if r["name"] == args.noise)
        floor = abs(pct(noise["val"], base["val"]))
        print(f"noise floor ({args.noise}: another data order, nothing else): validation "
              f"{pct(noise['val'], base['val']):+.2f}%, training {pct(noise['train'], base['train']):+.2f}%")
        for r in rows[1:]:
            if r is noise:
                continue
            gap = pct(r["val"], base["val"])
            verdict = "within the noise floor" if abs(gap) <= floor else f"beyond the noise floor ({floor:.2f}%)"
            print(f"  {r['name']}: validation {gap:+.2f}% of {base_name}'s, {verdict}")
    if args.png:
        draw(args, runs)


def draw(args, runs):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("fidelity_report: --png needs matplotlib (apt-get install python3-matplotlib)")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    fig.suptitle(args.title)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(runs) > len(colors):  # more runs than the default cycle's 10: one colour each all the same
        colors = [plt.get_cmap("tab20")(k) for k in range(20)]
    base_val = dict(runs[0][2])
    lows = []
    for i, (name, steps, val) in enumerate(runs):
        color = colors[i % len(colors)]
        order = sorted(steps)
        losses = [steps[s]["loss"] for s in order]
        smooth, total = [], 0.0
        for k, x in enumerate(losses):  # trailing mean of 20 steps
            total += x - (losses[k - 20] if k >= 20 else 0.0)
            smooth.append(total / min(k + 1, 20))
        top.plot(order, smooth, color=color, linewidth=1.2, label=f"{name}: training (mean of 20 steps)")
        lows.append(min(smooth))
        if val:
            top.plot([s for s, _ in val], [v for _, v in val], "o", color=color, markersize=4,
                     label=f"{name}: validation")
            lows.append(min(v for _, v in val))
            rel = [(s, pct(v, base_val[s])) for s, v in val if s in base_val]
            bottom.plot([s for s, _ in rel], [r for _, r in rel], "o-", color=color, markersize=3, label=name)
    # The early spike would flatten the part that matters.
    top.set_ylim(min(lows) * 0.95, min(lows) * 2.5)
    top.set_ylabel("loss (cross-entropy, nats per token)")
    top.grid(alpha=0.3)
    top.legend(loc="upper right", fontsize=8, ncol=2)
    bottom.axhline(0, color="black", linewidth=0.8)
    bottom.set_ylabel(f"validation loss vs {runs[0][0]} (%)")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)
    print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
