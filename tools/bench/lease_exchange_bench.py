#!/usr/bin/env python3
"""What batching the hot path's lease calls saves, side by side in one process: a host optimizer
update's four acquires and four releases one call each against acquire_all/release_all (one ring
exchange each), alternating rounds; then (--optimizer) tierd.torch.OffloadOptimizer stepping bf16
CPU parameters of a Llama-like shape both ways, the update thread's time outside the optimizer
kernels a step (timings(): updating - update_kernels). Needs a running tierd (TIERD_DIR) and the
tierd package on PYTHONPATH (an -c opt build); torch for --optimizer.

  tierd --gpu=fake --dram_bytes=8GiB --nvme_dir=/var/tmp --nvme_bytes=1GiB --runtime_dir=/tmp/tierd-lease &
  PYTHONPATH=SITE TIERD_DIR=/tmp/tierd-lease python3 tools/bench/lease_exchange_bench.py --optimizer
"""
import argparse
import os
import platform
import time

import tierd


def one_by_one(client):
    """acquire_all/release_all as single calls, what the optimizer did before them."""
    client.acquire_all = lambda items, place="host": [client.acquire(t, a, place) for t, a in items]

    def release_all(tensors, stream=None):
        for t in tensors:
            client.release(t, stream)
    client.release_all = release_all
    return client


def exchange(rounds, updates):
    client = tierd.connect(label="lease-bench", dram="64MiB")
    single = one_by_one(tierd.connect(label="lease-bench-single", dram="64MiB"))
    results = {"one by one": [], "acquire_all/release_all": []}
    for name, c in (("one by one", single), ("acquire_all/release_all", client)):
        c.ts = [c.lease(f"x{i}", (1024,), dtype="float32", tensor_class="opt_state") for i in range(4)]
    for _ in range(rounds):
        for name, c in (("one by one", single), ("acquire_all/release_all", client)):
            items = [(c.ts[0], "write"), (c.ts[1], "read"), (c.ts[2], "write"), (c.ts[3], "write")]
            start = time.perf_counter()
            for _ in range(updates):
                c.acquire_all(items)
                c.release_all(c.ts)
            results[name].append((time.perf_counter() - start) / updates * 1e6)
    for c in (client, single):
        c.close()
    return results


def optimizer_overhead(layers, d, f, steps, batched):
    import torch
    import tierd.torch as tt
    torch.manual_seed(0)
    shapes = [s for _ in range(layers) for s in [(d, d)] * 4 + [(f, d)] * 3 + [(d,)] * 2]
    params = [torch.nn.Parameter(torch.randn(s, dtype=torch.bfloat16) * 0.02) for s in shapes]
    client = tierd.connect(label="lease-bench-opt", dram="6GiB", nvme="64MiB")
    if not batched:
        one_by_one(client)
    opt = tt.OffloadOptimizer(params, opt="adamw8bit", lr=1e-3, client=client)
    coef = [torch.randn(s, dtype=torch.bfloat16) for s in shapes]
    for _ in range(steps):
        sum((p * c).sum() for p, c in zip(params, coef)).backward()  # the cheapest backward: each hook fires
        opt.step()
        opt.zero_grad(set_to_none=True)
    opt.synchronize()
    t = opt.timings()
    opt.close()
    client.close()
    return (t["updating"] - t["update_kernels"]) / steps * 1e3, len(params)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--updates", type=int, default=2000, help="updates a round")
    p.add_argument("--optimizer", action="store_true", help="also OffloadOptimizer both ways")
    p.add_argument("--shape", default="24,512,1376", help="layers,d,d_ff of the parameters for --optimizer")
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs; tierd at {os.environ.get('TIERD_DIR', '/tmp/tierd')}")
    results = exchange(a.rounds, a.updates)
    for name, us in results.items():
        print(f"{name}: " + ", ".join(f"{x:.0f}" for x in us) + " us an update's 4 acquires + 4 releases")
    best = {name: min(us) for name, us in results.items()}
    print(f"ratio: one by one / batched {best['one by one'] / best['acquire_all/release_all']:.2f}x (best rounds)")
    if a.optimizer:
        layers, d, f = (int(x) for x in a.shape.split(","))
        rows = {}
        for batched in (False, True, False, True):  # alternating: the machine's drift hits both alike
            ms, n = optimizer_overhead(layers, d, f, a.steps, batched)
            rows.setdefault(batched, []).append(ms)
            print(f"OffloadOptimizer 8-bit, {n} bf16 parameters, {'batched' if batched else 'one by one'}: "
                  f"{ms:.0f} ms a step in the update thread outside the kernels", flush=True)
        print(f"ratio: one by one / batched {min(rows[False]) / min(rows[True]):.2f}x (best runs)")


if __name__ == "__main__":
    main()
