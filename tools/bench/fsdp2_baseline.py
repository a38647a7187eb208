#!/usr/bin/env python3
"""PyTorch FSDP2 with CPU offload in the benchmark harness, configured as its documentation
configures it to train a model larger than the GPU on one GPU: each decoder layer and the
whole model `fully_shard`ed with `CPUOffloadPolicy(pin_memory=True)` (parameters, gradients and
the optimizer's state on the host; the optimizer steps there), bf16 compute with fp32 gradient
reduction (`MixedPrecisionPolicy`), AdamW, clipping at 1.0, activation checkpointing optional. The
model is torch_baseline.py's (--hf: transformers' LlamaForCausalLM of that shape; --bf16: pure bf16
parameters and state), the data the same bytes. One process, world size 1 (a gloo+nccl
group on 127.0.0.1). Prints one JSON line at the end in torch_baseline.py's form (peak_alloc_bytes:
the most GPU memory PyTorch held reserved).

  python3 tools/bench/fsdp2_baseline.py --model_size=1.3b --batch_size=8 --data=FILE
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baseline import PRESETS, Decoder, hf_llama, init_like_tierd, nvml_mib, random_batch, timed_steps  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_size", default="1.3b", choices=sorted(PRESETS))
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--grad_accum_steps", type=int, default=1)
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--timing_skip", type=int, default=2)
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--hf", action="store_true", help="transformers' LlamaForCausalLM of the preset's shape")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 parameters, gradients and AdamW state (pure bf16): 8 bytes a parameter on the host "
                        "instead of 16, what makes a 7B fit a 125 GiB host")
    p.add_argument("--data", required=True, help="a text file; its bytes are the tokens")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup", type=int, default=0, help="steps of linear learning-rate warm-up (0: none)")
    a = p.parse_args()
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29534"}.items():
        os.environ.setdefault(key, value)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    torch.distributed.init_process_group("cpu:gloo,cuda:nccl")
    torch.cuda.set_device(0)
    layers, c, h, f, v, kv = PRESETS[a.model_size]
    torch.manual_seed(a.seed)
    data = torch.frombuffer(bytearray(open(a.data, "rb").read()), dtype=torch.uint8).long()
    dtype = torch.bfloat16 if a.bf16 else torch.float32
    if a.hf:  # initialised on the GPU (minutes faster than on the host at 7B), then handed to FSDP on the host
        model = hf_llama(a.model_size, a.seq_len, a.checkpointing, dtype).cpu()
        torch.cuda.empty_cache()
        blocks = model.model.layers
    else:
        model = Decoder(layers, c, h, f, v, a.checkpointing, a.seq_len, kv)
        init_like_tierd(model, layers)
        model = model.to(dtype)
        blocks = model.layers
    params = sum(x.numel() for x in model.parameters())
    policy = dict(offload_policy=CPUOffloadPolicy(pin_memory=True),
                  mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=dtype))
    for layer in blocks:
        fully_shard(layer, **policy)
    fully_shard(model, **policy)
    if not a.hf:
        model.cos, model.sin = model.cos.cuda(), model.sin.cuda()
    else:  # its rotary tables are buffers, not parameters: FSDP leaves them on the host
        for name, buf in list(model.named_buffers()):
            owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            owner._buffers[name.rsplit(".", 1)[-1]] = buf.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / a.warmup)) if a.warmup else None
    torch.cuda.reset_peak_memory_stats()
    tokens = a.batch_size * a.grad_accum_steps * a.seq_len
    def one_step():
        total = 0.0
        for _ in range(a.grad_accum_steps):
            batch = random_batch(data, a.batch_size, a.seq_len)
            if a.hf:
                out = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss / a.grad_accum_steps
            else:
                out = model(batch[:, :-1], batch[:, 1:]) / a.grad_accum_steps
            out.backward()
            total += out.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
        return total

    timed, loss = timed_steps(a.steps, a.timing_skip, one_step, "fsdp2")
    mine, every = nvml_mib()
    tps = tokens * (a.steps - a.timing_skip) / timed if timed > 0 else 0.0
    run = "fsdp2 cpu offload" + (" hf" if a.hf else "") + (" bf16" if a.bf16 else "") + (" +ckpt" if a.checkpointing else "")
    print(json.dumps({"run": run, "model": a.model_size, "nvml_mib": mine, "nvml_all_mib": every,
                      "params": params, "batch": a.batch_size, "micro_batches": a.grad_accum_steps,
                      "seq": a.seq_len, "tokens_per_s": tps, "tflops_6n": 6 * params * tps / 1e12,
                      "peak_alloc_bytes": torch.cuda.max_memory_reserved(), "final_loss": loss}), flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
