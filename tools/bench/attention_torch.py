#!/usr/bin/env python3
"""PyTorch's causal SDPA (the flash backend, bf16) at the shapes .carry/bin/attention_bench
times ours at, the same FLOP count (forward 4 b h T^2 d / 2, backward 2.5 times that), each
timed over 20 runs after 3 warm-up ones. Reads ours' JSON lines on stdin and prints a table
with both and the ratio, so both sides come from the same call:
  .carry/bin/attention_bench | python3 tools/bench/attention_torch.py
"""
import contextlib
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(run):
    for _ in range(3):
        run()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        run()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / 20


def sdpa(b, t, h, d, backend=SDPBackend.FLASH_ATTENTION):
    """SDPA's forward and backward ms with one backend (None: PyTorch's own choice, as in a
    model); None for a backend this build or GPU does not have."""
    # Ours keeps (B, T, H, D) rows; the same layout here, viewed as (B, H, T, D).
    q, k, v = (torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
               for _ in range(3))
    dout = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    except RuntimeError:
        return None
    return fwd, bwd


def main():
    rows = [json.loads(line) for line in sys.stdin if line.startswith("{")]
    print(f"causal attention, bf16, on {torch.cuda.get_device_name()}: ours (attention_tc.cu) vs PyTorch "
          f"{torch.__version__} SDPA flash; TFLOP/s nominal (forward 4bhT^2d/2, backward 2.5x)")
    print("| model | b x T x H x d | ours fwd | SDPA fwd | ours/SDPA | ours bwd | SDPA bwd | ours/SDPA |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        fwd, bwd = sdpa(r["b"], r["t"], r["h"], r["d"])
        flops = 4.0 * r["b"] * r["h"] * r["t"] ** 2 * r["d"] / 2
        tf, tb = flops / fwd / 1e9, 2.5 * flops / bwd / 1e9
        print(f"| {r['model']} | {r['b']} x {r['t']} x {r['h']} x {r['d']} | {r['fwd_ms']:.2f} ms "
              f"({r['fwd_tflops']:.0f} TFLOP/s) | {fwd:.2f} ms ({tf:.0f}) | {r['fwd_tflops'] / tf:.2f}x | "
              f"{r['bwd_ms']:.2f} ms ({r['bwd_tflops']:.0f}) | {bwd:.2f} ms ({tb:.0f}) | {r['bwd_tflops'] / tb:.2f}x |")
    # What a model gets: SDPA's own choice of backend, and cuDNN's (Hopper kernels) by name.
    print("\nSDPA's backends at the same shapes, TFLOP/s forward / backward (ours beside them)")
    print("| model | b x T x H x d | ours | flash | cuDNN | PyTorch's own choice |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        flops = 4.0 * r["b"] * r["h"] * r["t"] ** 2 * r["d"] / 2
        cells = []
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, None):
            got = sdpa(r["b"], r["t"], r["h"], r["d"], backend)
            cells.append("-" if got is None else f"{flops / got[0] / 1e9:.0f} / {2.5 * flops / got[1] / 1e9:.0f}")
        print(f"| {r['model']} | {r['b']} x {r['t']} x {r['h']} x {r['d']} | "
              f"{r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f} | " + " | ".join(cells) + " |")
    if rows and "keys_ms" in rows[0]:
        print("\nours' backward kernel by kernel, ms: with dS (the key kernel writes dS, bf16, and dQ = dS K; "
              "as used) and the previous design (the query kernel computes S and dP again)")
        print("| model | b x T x H x d | delta | keys + dS | dQ from dS | keys | dQ recomputing | dS scratch |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['model']} | {r['b']} x {r['t']} x {r['h']} x {r['d']} | {r['delta_ms']:.3f} | "
                  f"{r['keys_ms']:.3f} | {r['queries_ms']:.3f} | {r['keys_recompute_ms']:.3f} | "
                  f"{r['queries_recompute_ms']:.3f} | {r['scratch_mib']:.0f} MiB |")

if __name__ == "__main__":
    main()
