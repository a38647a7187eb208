"""A plain PyTorch training loop with and without tierd.torch.OffloadOptimizer, side by side
in one process (issue 44's first target): the same model (tools/bench/torch_baseline.py's
Llama-style decoder, fp32 weights, bf16 autocast), the same data, clipping at 1.0; PyTorch's
fused AdamW with everything on the GPU, then OffloadOptimizer (master weights and moments in
tierd's DRAM tier, stepped on the host). Prints each run's tokens/s, peak GPU memory and
losses, then the ratio. Needs a running tierd (TIERD_DIR) and the tierd package on PYTHONPATH.

  python3 tools/bench/offload_optimizer_bench.py --model_size=1.3b --batch_size=8 --opt=adamw
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baseline import PRESETS, Decoder  # noqa: E402

import tierd.torch as tt  # noqa: E402


def run(name, make_opt, a, data):
    layers, c, h, f, v, kv = PRESETS[a.model_size]
    torch.manual_seed(0)
    model = Decoder(layers, c, h, f, v, a.checkpointing, a.seq_len, kv).cuda()
    opt = make_opt(model)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    g = torch.Generator().manual_seed(1)
    timed, losses = 0.0, []
    for step in range(a.steps):
        starts = torch.randint(0, len(data) - a.seq_len - 1, (a.batch_size,), generator=g)
        batch = torch.stack([data[s:s + a.seq_len + 1] for s in starts.tolist()]).cuda()
        torch.cuda.synchronize()
        t0 = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        if not isinstance(opt, tt.OffloadOptimizer):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        torch.cuda.synchronize()
        if step >= a.skip:
            timed += time.time() - t0
    if isinstance(opt, tt.OffloadOptimizer):
        opt.synchronize()
        opt.close()
    tps = a.batch_size * a.seq_len * (a.steps - a.skip) / timed
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"{name}: {tps:,.0f} tokens/s, peak allocated {peak:.1f} GiB, losses "
          + " ".join(f"{x:.4f}" for x in losses), flush=True)
    del model, opt
    torch.cuda.empty_cache()
    return tps, losses


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_size", default="1.3b", choices=sorted(PRESETS))
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--skip", type=int, default=3, help="untimed first steps")
    p.add_argument("--opt", default="adamw", choices=["adamw", "adamw8bit", "lion"])
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--dram", default="64GiB", help="the optimizer's tierd DRAM quota")
    a = p.parse_args()
    py_lib = os.path.dirname(os.__file__)
    text = b"".join(open(os.path.join(py_lib, n), "rb").read() for n in sorted(os.listdir(py_lib)) if n.endswith(".py"))
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    print(f"machine: {torch.cuda.get_device_name()}; model {a.model_size}, batch {a.batch_size} x {a.seq_len}, "
          f"bf16 autocast, fp32 weights, clipping at 1.0; host threads {tt._tierd.cpu_threads()}", flush=True)
    base, base_losses = run("PyTorch fused AdamW on the GPU", lambda m: torch.optim.AdamW(
        m.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True), a, data)
    ours, our_losses = run(f"tierd OffloadOptimizer ({a.opt}, state in tierd's DRAM tier)", lambda m: tt.OffloadOptimizer(
        m.parameters(), opt=a.opt, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, max_grad_norm=1.0, dram=a.dram,
        nvme="4GiB"), a, data)
    worst = max(abs(x - y) / abs(y) for x, y in zip(our_losses, base_losses))
    print(f"ratio: OffloadOptimizer {ours / base:.2f}x of PyTorch fused AdamW's tokens/s; losses within "
          f"{100 * worst:.3f}% of its", flush=True)


if __name__ == "__main__":
    main()
