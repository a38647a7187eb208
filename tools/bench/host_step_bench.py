#!/usr/bin/env python3
"""The host's share of tierd.torch.OffloadOptimizer's step, value by value, on this machine: the
gradient accumulation (fp32 and bf16 sources, overwrite and add), AdamW and 8-bit AdamW from fp32
and from bf16 gradients, at each thread count of --threads, each the best of 3 over N values (arrays touched once before, so no first-touch page
faults are timed). Needs the tierd package on PYTHONPATH (an -c opt build: fastbuild's loops are
not optimised) and torch for the arrays.

  PYTHONPATH=SITE python3 tools/bench/host_step_bench.py --n 50000000 [--threads 16,8]
"""
import argparse
import time

import torch

from tierd import _tierd


def best(fn, repeats=3):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50_000_000)
    p.add_argument("--threads", default="0", help="thread counts to try, apart by commas (0: the host's default)")
    a = p.parse_args()
    n = a.n
    g32 = torch.randn(n)
    g16 = g32.to(torch.bfloat16)
    acc, master, m, v = torch.ones(n), torch.randn(n), torch.zeros(n), torch.zeros(n)
    m8, v8 = (torch.zeros(_tierd.moment8bit_bytes(n), dtype=torch.uint8) for _ in range(2))
    out = torch.zeros(n, dtype=torch.bfloat16)
    print(f"host threads by default {_tierd.cpu_threads()}, {n:,} values; G values/s (best of 3):")
    for threads in [int(t) for t in a.threads.split(",")]:
        print(f" threads {threads or _tierd.cpu_threads()}:")
        for dtype, src in (("f32", g32), ("bf16", g16)):
            for overwrite in (True, False):
                t = best(lambda: _tierd.accumulate(acc.data_ptr(), src.data_ptr(), dtype, n, overwrite, threads))
                print(f"  accumulate from {dtype:4s} ({'overwrite' if overwrite else 'add'}): {n / t / 1e9:.2f}")
        for dtype, src in (("f32", g32), ("bf16", g16)):
            t = best(lambda: _tierd.adamw(master.data_ptr(), m.data_ptr(), v.data_ptr(), out.data_ptr(), src.data_ptr(),
                                          n, 1e-5, 0.9, 0.95, 1e-8, 0.1, 1, 1.0, True, threads, dtype))
            print(f"  AdamW from {dtype} gradients: {n / t / 1e9:.2f}")
        for dtype, src in (("f32", g32), ("bf16", g16)):
            t = best(lambda: _tierd.adamw8bit(master.data_ptr(), m8.data_ptr(), v8.data_ptr(), out.data_ptr(),
                                              src.data_ptr(), n, 1e-5, 0.9, 0.95, 1e-8, 0.1, 2, 1.0, True, threads, dtype))
            print(f"  8-bit AdamW from {dtype} gradients: {n / t / 1e9:.2f}")


if __name__ == "__main__":
    main()
