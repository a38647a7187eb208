#!/usr/bin/env python3
"""Why 8-bit moments in blocks of 2048 fell behind fp32 AdamW at 1.3B while blocks of 256 did
not: when most elements' gradients shrink over training while a few outlier elements' do not,
the outliers keep each block's absmax, the others' sqrt(v) moves down into the dynamic map's
coarser codes, and nearest rounding cannot follow a decay smaller than half a code's width.

Both moments are kept as trainer_ref/adamw8bit.cc keeps them (m signed, v as its root, codes of
the dynamic maps, one absmax per block, nearest rounding; --stochastic for stochastic rounding).
N elements with gradient scales over 3 decades, a fraction of outliers at 30x; the others'
scales decay as exp(-t / tau) (tau 0: stationary). Prints, for the non-outliers, at a few
steps: the median of sqrt(v_8bit / v_fp32), the RMS error of the update against fp32 AdamW's
relative to its RMS, and the update's projection on fp32's (1 = the same length on average).
Needs numpy.

  python3 tools/q8_shrink_sim.py --block=2048 --tau=300   # sqrt(v) drifts high, the update low
  python3 tools/q8_shrink_sim.py --block=256 --tau=300
  python3 tools/q8_shrink_sim.py --block=2048 --tau=0     # stationary: no drift
"""
import argparse

import numpy as np

from q8_rounding_sim import dynamic_map


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block", type=int, default=2048)
    parser.add_argument("--tau", type=float, default=300, help="decay time of the non-outliers' gradients; 0: none")
    parser.add_argument("--elements", type=int, default=16384)
    parser.add_argument("--outliers", type=float, default=0.005, help="fraction of elements at 30x")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.95)
    parser.add_argument("--stochastic", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    assert args.elements % args.block == 0, "whole blocks"
    smap, umap = dynamic_map(True), dynamic_map(False)
    thresholds = {id(m): ((m[:-1].astype(np.float64) + m[1:]) / 2).astype(np.float32) for m in (smap, umap)}
    rng = np.random.default_rng(args.seed)

    def quantize(x, code_map):
        blocks = x.reshape(-1, args.block)
        absmax = np.abs(blocks).max(axis=1, keepdims=True)
        normalized = (blocks / np.where(absmax > 0, absmax, 1)).astype(np.float32)
        if args.stochastic:
            below = np.clip(np.searchsorted(code_map, normalized, side="right") - 1, 0, len(code_map) - 2)
            up = (normalized - code_map[below]) / (code_map[below + 1] - code_map[below])
            codes = below + (rng.random(normalized.shape) < up)
        else:
            codes = np.searchsorted(thresholds[id(code_map)], normalized, side="left")  # ties down
        return (code_map[codes] * absmax).reshape(-1)

    n = args.elements
    base = np.exp(rng.uniform(np.log(1e-3), 0, n)).astype(np.float32)
    outlier = rng.random(n) < args.outliers
    base[outlier] *= 30
    m32, v32 = np.zeros(n, np.float32), np.zeros(n, np.float32)
    m8, r8 = np.zeros(n, np.float32), np.zeros(n, np.float32)
    b1, b2 = args.beta1, args.beta2
    print(f"blocks of {args.block}, tau {args.tau:g}, {'stochastic' if args.stochastic else 'nearest'} rounding; "
          "non-outliers: median sqrt(v 8-bit / v fp32), update RMS error, update projection")
    for t in range(1, args.steps + 1):
        decay = np.exp(-t / args.tau) if args.tau > 0 else 1.0
        g = (rng.standard_normal(n) * base * np.where(outlier, 1.0, decay)).astype(np.float32)
        m32 = b1 * m32 + (1 - b1) * g
        v32 = b2 * v32 + (1 - b2) * g * g
        m = b1 * m8 + (1 - b1) * g
        v = b2 * r8 * r8 + (1 - b2) * g * g
        m8, r8 = quantize(m, smap), quantize(np.sqrt(v).astype(np.float32), umap)
        if t % (args.steps // 4) == 0:
            c1, c2 = 1 - b1**t, 1 - b2**t
            u32 = (m32 / c1) / (np.sqrt(v32 / c2) + 1e-8)
            u8 = (m8 / c1) / (r8 / np.sqrt(c2) + 1e-8)
            s = ~outlier
            ratio = np.median(r8[s] / np.sqrt(v32[s]))
            error = np.sqrt(np.mean((u8[s] - u32[s]) ** 2) / np.mean(u32[s] ** 2))
            projection = np.sum(u8[s] * u32[s]) / np.sum(u32[s] ** 2)
            print(f"  step {t:5d}: {ratio:.3f}  {error:.3f}  {projection:.3f}")


if __name__ == "__main__":
    main()
