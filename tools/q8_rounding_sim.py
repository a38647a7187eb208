#!/usr/bin/env python3
"""Does rounding the 8-bit second moment to its nearest code bias it? One block of 2048
values (gradient scales spread over 3 decades), v's root kept as 8-bit codes of the unsigned
dynamic map with the block's absmax (as trainer_ref/adamw8bit.cc keeps it), beside fp32 v, for
nearest and stochastic rounding. Prints sqrt(v_8bit / v_fp32): median, 10th and 90th
percentiles, at a few steps. Needs numpy.

  python3 tools/q8_rounding_sim.py --beta2=0.999   # small per-step changes: nearest runs low
  python3 tools/q8_rounding_sim.py --beta2=0.95    # the trainer's: nearest is unbiased
"""
import argparse

import numpy as np


def dynamic_map(signed):
    """adamw8bit.cc's MakeDynamicMap: 7 decades below 1, 2^i (or 2^(i+1)) midpoints each, 0 and 1."""
    values = [0.0, 1.0]
    for i in range(7):
        fractions = (1 << i) if signed else (1 << (i + 1))
        for k in range(fractions):
            mid = 10.0 ** (i - 6) * (0.1 + 0.9 * (k + 0.5) / fractions)
            values += [mid, -mid] if signed else [mid]
    return np.array(sorted(values), dtype=np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--beta2", type=float, default=0.95)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    umap = dynamic_map(False)
    thresholds = ((umap[:-1].astype(np.float64) + umap[1:]) / 2).astype(np.float32)
    rng = np.random.default_rng(args.seed)
    n = 2048
    scale = np.exp(rng.uniform(np.log(1e-3), 0, n)).astype(np.float32)

    def nearest(x):
        absmax = x.max()
        normalized = (x * np.float32(1 / absmax)).astype(np.float32)
        return np.searchsorted(thresholds, normalized, side="left"), absmax  # thresholds below: ties down

    def stochastic(x):
        absmax = x.max()
        normalized = (x * np.float32(1 / absmax)).astype(np.float32)
        below = np.clip(np.searchsorted(umap, normalized, side="right") - 1, 0, len(umap) - 2)
        up = (normalized - umap[below]) / (umap[below + 1] - umap[below])
        return below + (rng.random(n) < up), absmax

    print(f"beta2 {args.beta2}, one block of {n}; sqrt(v 8-bit / v fp32): median (p10, p90)")
    for name, quantize in (("nearest", nearest), ("stochastic", stochastic)):
        v32 = np.zeros(n, np.float32)
        codes, absmax = np.zeros(n, int), np.float32(0)
        for t in range(1, args.steps + 1):
            g = (rng.standard_normal(n) * scale).astype(np.float32)
            v32 = args.beta2 * v32 + (1 - args.beta2) * g * g
            root = umap[codes] * absmax
            v = args.beta2 * root * root + (1 - args.beta2) * g * g
            codes, absmax = quantize(np.sqrt(v).astype(np.float32))
            if t in (10, 100, 300, args.steps):
                ratio = (umap[codes] * absmax) / np.sqrt(v32)
                print(f"  {name:10s} step {t:5d}: {np.median(ratio):.3f} "
                      f"({np.percentile(ratio, 10):.3f}, {np.percentile(ratio, 90):.3f})")


if __name__ == "__main__":
    main()
