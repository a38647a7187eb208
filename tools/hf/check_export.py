#!/usr/bin/env python3
"""Loads a checkpoint tierd-train exported (--export) with transformers and takes the loss over
the held-out windows the trainer wrote (--validation_out): the two should agree.

    python3 tools/hf/check_export.py --export DIR --validation val.json [--dtype bf16|fp32] [--tolerance 0.005]

Prints both losses and their relative difference; exits 1 when it is above the tolerance.
The loss is taken as the trainer takes it: each batch's mean over its counted targets (-1:
not counted), then the mean over the batches.
"""
import argparse
import json
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export", required=True, help="the directory tierd-train --export wrote")
    p.add_argument("--validation", required=True, help="the file tierd-train --validation_out wrote")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="the dtype transformers computes in")
    p.add_argument("--tolerance", type=float, default=0.005, help="relative difference allowed (0.5%%)")
    args = p.parse_args()
    with open(args.validation) as f:
        val = json.load(f)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    start = time.time()
    model = AutoModelForCausalLM.from_pretrained(args.export, dtype=dtype).to(device).eval()
    loaded = time.time() - start
    batch, seq = val["batch"], val["seq"]
    losses = []
    with torch.no_grad():
        for b in val["batches"]:
            inputs = torch.tensor(b["inputs"], device=device).view(batch, seq)
            targets = torch.tensor(b["targets"], device=device).view(batch, seq)
            logits = model(inputs).logits.float()
            losses.append(torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1),
                                                            ignore_index=-1).item())
    ours = val["validation_loss"]
    theirs = sum(losses) / len(losses)
    diff = abs(theirs - ours) / abs(ours)
    print(f"check_export: transformers {transformers.__version__} ({model.__class__.__name__}, {args.dtype} on "
          f"{device}, loaded in {loaded:.1f} s): validation loss {theirs:.5f} over {len(losses)} batches of "
          f"{batch} x {seq}; tierd-train's at step {val['step']}: {ours:.5f}; difference {100 * diff:.3f}% "
          f"(tolerance {100 * args.tolerance:.2f}%)")
    return 0 if diff <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
