#!/usr/bin/env python3
"""The PyTorch baseline of the benchmark harness: the same Llama-style decoder as the
reference trainer (RMSNorm, RoPE, SwiGLU, untied head; presets as trainer_ref/model_config)
written as PyTorch users write it at its best (fused QKV and gate/up projections,
torch.nn.RMSNorm, RoPE tables computed once, SDPA), bf16 autocast + fused AdamW, optionally
activation checkpointing and torch.compile, trained on the bytes of a text file (byte tokens,
as tierd-train's byte tokenizer). Grouped-query attention through SDPA's enable_gqa (the
llama3-8b preset: Llama 3.1 8B's shape, 8 key/value heads, a 128256-token vocabulary).
--float8: torchao's float8 training (tensorwise scaling, the recipe torchtitan ships) on the
decoder layers' linear maps, the head left in bf16, with torch.compile. Prints one JSON line
at the end: model, batch, checkpointing, compile, tokens/s, TFLOP/s (6N), peak allocated GPU
bytes, final loss. --profile: the last step under torch.profiler, its GPU time by kernel class
(the classes of tierd-train --profile: gemm, attention, norm+elementwise, loss, optimizer,
fp8 casts; idle the rest of the step) with each class's TFLOP/s, as one "profile:" line.
"""
import argparse
import json
import math
import os
import re
import time

import torch
import torch._dynamo
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

PRESETS = {  # layers, C, H, F, V, key/value heads (None: H)
    "tiny": (2, 64, 4, 176, 256, None),
    "124m": (12, 768, 12, 2048, 32000, None),
    "350m": (24, 1024, 16, 2816, 32000, None),
    "1.3b": (24, 2048, 16, 5504, 32000, None),
    "7b": (32, 4096, 32, 11008, 32000, None),
    "13b": (40, 5120, 40, 13824, 32000, None),
    "llama3-8b": (32, 4096, 32, 14336, 128256, 8),
}


def rope_tables(t, d, base=10000.0, device="cuda"):
    """cos and sin (T, D/2) of t * base^(-2i/D), computed once: pairs (2i, 2i+1) turn by them."""
    inv = base ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    ang = torch.arange(t, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def rope(x, cos, sin):  # x (B, H, T, D)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    a, c = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - c * sin, a * sin + c * cos), dim=-1).flatten(-2)


class Layer(torch.nn.Module):
    """PyTorch at its best for this math: fused QKV and gate/up projections (one GEMM each),
    torch.nn.RMSNorm, RoPE from precomputed tables, SDPA (flash attention)."""

    def __init__(self, c, h, f, kv):
        super().__init__()
        self.h, self.f, self.kv = h, f, kv
        self.attn_norm, self.mlp_norm = torch.nn.RMSNorm(c, eps=1e-5), torch.nn.RMSNorm(c, eps=1e-5)
        self.wqkv = torch.nn.Linear(c, c + 2 * kv * (c // h), bias=False)
        self.wo = torch.nn.Linear(c, c, bias=False)
        self.w13 = torch.nn.Linear(c, 2 * f, bias=False)
        self.w2 = torch.nn.Linear(f, c, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        d = c // self.h
        if self.kv == self.h:
            q, k, v = self.wqkv(self.attn_norm(x)).view(b, t, 3, self.h, d).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True)
        else:
            q, k, v = self.wqkv(self.attn_norm(x)).split([c, self.kv * d, self.kv * d], dim=-1)
            q = q.view(b, t, self.h, d).transpose(1, 2)
            k = k.view(b, t, self.kv, d).transpose(1, 2)
            v = v.view(b, t, self.kv, d).transpose(1, 2)
            a = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True,
                                               enable_gqa=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, c))
        gate, up = self.w13(self.mlp_norm(x)).split(self.f, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Decoder(torch.nn.Module):
    def __init__(self, layers, c, h, f, v, checkpointing, seq_len, kv=None):
        super().__init__()
        self.embed = torch.nn.Embedding(v, c)
        self.layers = torch.nn.ModuleList(Layer(c, h, f, kv or h) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(c, eps=1e-5)
        self.head = torch.nn.Linear(c, v, bias=False)
        self.checkpointing = checkpointing
        cos, sin = rope_tables(seq_len, c // h, device="cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        t = tokens.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        for layer in self.layers:
            x = checkpoint(layer, x, cos, sin, use_reentrant=False) if self.checkpointing else layer(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def init_like_tierd(model, layers):
    """As trainer_ref/model.cc: N(0, 0.02), output projections / sqrt(2 L), norms 1 (comparable losses)."""
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if prm.dim() == 1:
                prm.fill_(1.0)
            else:
                prm.normal_(0.0, 0.02)
                if name.endswith("wo.weight") or name.endswith("w2.weight"):
                    prm.mul_(1.0 / math.sqrt(2 * layers))


def random_batch(data, batch_size, seq_len, generator=None):
    """batch_size windows of seq_len + 1 tokens at random places in data, on the GPU."""
    starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()]).cuda()


def hf_llama(preset, seq_len, checkpointing=False, dtype=torch.float32, device="cuda", attention="sdpa"):
    """transformers' LlamaForCausalLM of a preset's shape (random weights, SDPA attention unless
    `attention` names another of transformers' implementations, untied head); activation
    checkpointing non-reentrant (what tierd.torch.offload supports; the reentrant form also runs
    every layer's forward twice)."""
    import transformers
    layers, c, h, f, v, kv = PRESETS[preset]
    config = transformers.LlamaConfig(hidden_size=c, intermediate_size=f, num_hidden_layers=layers,
                                      num_attention_heads=h, num_key_value_heads=kv or h, vocab_size=v,
                                      max_position_embeddings=seq_len, tie_word_embeddings=False,
                                      attn_implementation=attention)
    with torch.device(device):  # built where it runs: a 7B built on the host first takes minutes
        model = transformers.LlamaForCausalLM(config).to(dtype)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def nvml_mib(pid=None):
    """(pid's, every process's) GPU memory in MiB as nvidia-smi lists it: CUDA contexts and other
    processes (a tierd daemon) included. NaN where nvidia-smi cannot be run."""
    import subprocess
    try:
        rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return float("nan"), float("nan")
    used = {int(r.split(",")[0]): float(r.split(",")[1]) for r in rows if r.strip()}
    return used.get(pid or os.getpid(), 0.0), sum(used.values())


def timed_steps(steps, timing_skip, one_step, label):
    """Runs one_step() (returns the step's loss) `steps` times, each between GPU syncs, printing
    each; returns (seconds of the steps after the first timing_skip, the last loss)."""
    timed, loss = 0.0, float("nan")
    for step in range(1, steps + 1):
        torch.cuda.synchronize()
        t0 = time.time()
        loss = one_step()
        torch.cuda.synchronize()
        dt = time.time() - t0
        if step > timing_skip:
            timed += dt
        print(f"{label} step {step}: loss {loss:.4f} {dt * 1e3:.0f} ms", flush=True)
    return timed, loss


def largest_batch(model, seq_len, vocab, limit=64):
    """Doubles the batch from 1 while a whole step (forward, backward, AdamW with its state)
    fits. The probes' AdamW has lr 0 (the weights stay as initialised) and is dropped after,
    so the measured run starts from the same weights and a fresh optimizer."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.0, fused=True)
    best, b = 0, 1
    while b <= limit:
        try:
            batch = torch.randint(0, vocab, (b, seq_len + 1), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(batch[:, :-1], batch[:, 1:])
            out.backward()
            opt.step()
            torch.cuda.synchronize()
            best = b
        except torch.cuda.OutOfMemoryError:
            break
        finally:
            opt.zero_grad(set_to_none=True)
            out = batch = None
            torch.cuda.empty_cache()
        b *= 2
    opt.state.clear()
    del opt
    torch.cuda.empty_cache()
    if best == 0:
        raise SystemExit("torch_baseline: not even one sequence fits on this GPU")
    return best


# Kernel names to tierd-train's profile classes, first match wins. cuBLAS(Lt) and CUTLASS
# kernels, Triton's matmul templates and torch._scaled_mm are GEMMs; SDPA's flash and
# memory-efficient kernels attention; torch.compile's fused Triton kernels that take an amax
# or write float8 are torchao's casts; the rest is element-wise work (norms, RoPE, SwiGLU,
# residual adds, casts to bf16, fused by torch.compile or not).
CLASSES = [
    ("attention", re.compile(r"flash|fmha|attention|sdpa|efficient_attention", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_|_mm_|tem_fused|scaled_mm|matmul", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
    ("loss", re.compile(r"cross_entropy|nll_loss|log_softmax", re.I)),
    ("fp8 casts", re.compile(r"amax|float8|fp8|e4m3|e5m2", re.I)),
]
ORDER = ["gemm", "attention", "norm+elementwise", "loss", "optimizer", "fp8 casts"]


def kernel_class(name):
    for cls, pattern in CLASSES:
        if pattern.search(name):
            return cls
    return "norm+elementwise"


def profile_line(prof, step_ms, run, model_size, flops):
    """One "profile:" JSON line: each class's GPU milliseconds and TFLOP/s in the step."""
    ms = {c: 0.0 for c in ORDER}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(e, "device_time", None)
        if us is None:
            us = e.cuda_time
        ms[kernel_class(e.name)] += us / 1e3
    out = {"run": run, "model": model_size, "step_ms": round(step_ms, 2)}
    for c in ORDER:
        out[c] = {"ms": round(ms[c], 2), "tflops": round(flops.get(c, 0) / (ms[c] * 1e-3) / 1e12, 1) if ms[c] else 0}
    out["idle"] = {"ms": round(max(0.0, step_ms - sum(ms.values())), 2), "tflops": 0}
    return "profile: " + json.dumps(out)


def step_flops(layers, c, h, f, v, kv, tokens, seq_len, checkpointing):
    """The step's GEMM and attention floating-point operations, as tierd-train counts them:
    each linear map 2mnk forward and twice that backward, causal attention 2 b h s^2 d forward
    and 2.5 times that backward; a checkpointed layer's forward twice."""
    d = c // h
    kvd = (kv or h) * d
    layer_weights = c * c + 2 * c * kvd + c * c + 3 * c * f
    passes = 4 if checkpointing else 3  # forward, backward (2x), the recomputed forward
    gemm = 2.0 * tokens * (layers * layer_weights * passes + c * v * 3)
    fwd_attention = 2.0 * (tokens / seq_len) * h * seq_len * seq_len * d
    attention = layers * fwd_attention * (2.5 + (2 if checkpointing else 1))
    return {"gemm": gemm, "attention": attention}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model_size", default="1.3b")
    p.add_argument("--model_config", default="",
                   help="a Hugging Face config.json (as tierd-train --model_config): its layers, hidden size, heads, "
                        "key/value heads, intermediate size and vocabulary instead of --model_size; the model is "
                        "named by the file (model.json: 'model'), as tierd-train names it")
    p.add_argument("--batch_size", default="8",
                   help="sequences per step, or 'max': the largest power of two (from 1, at most 64) whose step fits")
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--grad_accum_steps", type=int, default=1,
                   help="micro-batches of --batch_size a step, gradients accumulated (as tierd-train's flag)")
    p.add_argument("--timing_skip", type=int, default=3)
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each layer (the warm-up steps compile; --timing_skip must cover them)")
    p.add_argument("--float8", action="store_true",
                   help="torchao float8 training (tensorwise) on the layers' linear maps, the head in bf16; "
                        "implies --compile (torchao on PYTHONPATH: its pure-Python wheel)")
    p.add_argument("--data", required=True, help="a text file; its bytes are the tokens")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=10, help="linear warmup, then cosine to lr/10 (as tierd-train)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", action="store_true",
                   help="the last step under torch.profiler: GPU time and TFLOP/s by kernel class (one line)")
    p.add_argument("--init", default="tierd", choices=["tierd", "torch"],
                   help="tierd: the reference trainer's initialisation (comparable losses); torch: PyTorch's defaults")
    a = p.parse_args()
    if a.model_config:
        with open(a.model_config) as f_:
            cfg = json.load(f_)
        kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        PRESETS[a.model_config] = (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
                                   cfg["intermediate_size"], cfg["vocab_size"],
                                   None if kv_heads == cfg["num_attention_heads"] else kv_heads)
        a.model_size = a.model_config
    layers, c, h, f, v, kv = PRESETS[a.model_size]
    if a.model_config:
        a.model_size = os.path.splitext(os.path.basename(a.model_config))[0]
    torch.manual_seed(a.seed)
    data = torch.frombuffer(bytearray(open(a.data, "rb").read()), dtype=torch.uint8).long()
    model = Decoder(layers, c, h, f, v, a.checkpointing, a.seq_len, kv).cuda()
    if a.init == "tierd":
        init_like_tierd(model, layers)
    params = sum(p.numel() for p in model.parameters())
    if a.float8:  # before compile, as torchao's README does it
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(model.layers, module_filter_fn=lambda mod, fqn: isinstance(mod, torch.nn.Linear))
        a.compile = True
    if a.compile:  # per layer (as users do with checkpointing); the first steps compile, untimed
        torch._dynamo.config.cache_size_limit = 256  # one graph per layer must not fall back to eager
        torch._dynamo.config.accumulated_cache_size_limit = 4096
        for layer in model.layers:
            layer.compile()
    if a.batch_size == "max":
        a.batch_size = largest_batch(model, a.seq_len, v)
        print(f"torch: the largest batch that fits is {a.batch_size} x {a.seq_len}", flush=True)
    else:
        a.batch_size = int(a.batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    torch.cuda.reset_peak_memory_stats()
    accum = max(1, a.grad_accum_steps)
    timed, tokens, loss = 0.0, a.batch_size * a.seq_len * accum, float("nan")
    final_loss = float("nan")
    # --profile: one step more, under the profiler, outside the timing and the reported loss.
    for step in range(1, a.steps + 1 + (1 if a.profile else 0)):
        batches = []
        for _ in range(accum):
            starts = torch.randint(0, len(data) - a.seq_len - 1, (a.batch_size,))
            batches.append(torch.stack([data[s:s + a.seq_len + 1] for s in starts.tolist()]).cuda())
        torch.cuda.synchronize()
        prof = None
        if a.profile and step == a.steps + 1:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        t0 = time.time()
        total = 0.0
        for batch in batches[:-1]:  # each micro-batch's gradients added into .grad, scaled by 1/K
            with torch.autocast("cuda", dtype=torch.bfloat16):
                part = model(batch[:, :-1], batch[:, 1:]) / accum
            part.backward()
            total = total + part.detach()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(batches[-1][:, :-1], batches[-1][:, 1:]) / accum
        s = step - 1  # tierd-train's LearningRate(step, warmup, steps, lr, lr / 10)
        if s < a.warmup:
            lr = a.lr * (s + 1) / a.warmup
        elif s >= a.steps or a.steps <= a.warmup:
            lr = a.lr / 10
        else:
            lr = a.lr / 10 + 0.5 * (a.lr - a.lr / 10) * (1 + math.cos(math.pi * (s - a.warmup) / (a.steps - a.warmup)))
        for group in opt.param_groups:
            group["lr"] = lr
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = (total + out.detach()).item()  # waits for the step
        dt = time.time() - t0
        if step == a.steps:
            final_loss = loss
        if prof is not None:
            prof.__exit__(None, None, None)
            run = "pytorch" + (" float8" if a.float8 else "") + (" compiled" if a.compile else "")
            flops = step_flops(layers, c, h, f, v, kv, tokens, a.seq_len, a.checkpointing)
            print(profile_line(prof, dt * 1e3, run, a.model_size, flops), flush=True)
        if a.timing_skip < step <= a.steps:
            timed += dt
        print(f"torch step {step}: loss {loss:.4f} {dt * 1e3:.0f} ms", flush=True)
    tps = tokens * (a.steps - a.timing_skip) / timed if timed > 0 else 0.0
    print(json.dumps({"run": "pytorch" + (" float8" if a.float8 else "") + (" compiled" if a.compile else "")
                      + (" +ckpt" if a.checkpointing else "")
                      + (f" {a.batch_size} x {accum} accumulated" if accum > 1 else ""),
                      "model": a.model_size,
                      "params": params, "batch": a.batch_size * accum, "seq": a.seq_len, "tokens_per_s": tps,
                      "tflops_6n": 6 * params * tps / 1e12, "peak_alloc_bytes": torch.cuda.max_memory_allocated(),
                      "final_loss": final_loss}), flush=True)


if __name__ == "__main__":
    main()
