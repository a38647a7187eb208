#!/usr/bin/env python3
"""DeepSpeed in the benchmark harness, configured as its users configure it to train a model
larger than their GPU on one GPU: bf16, ZeRO stage 2 with the optimizer offloaded to the CPU
(DeepSpeedCPUAdam, pinned buffers, overlapped communication), or stage 3 with parameters
offloaded too; activation checkpointing. The model is torch_baseline.py's (fused QKV and
gate/up, torch.nn.RMSNorm, RoPE tables, SDPA), or with --hf transformers' LlamaForCausalLM of the
same shape (as a Hugging Face user trains it with DeepSpeed); the data the same bytes. One process,
world size 1. Prints one JSON line at the end in torch_baseline.py's form (peak_alloc_bytes: the
most GPU memory PyTorch held reserved, which DeepSpeed's buffers live in; nvml_all_mib: nvidia-smi's
figure for every process).

DeepSpeed is not on the lent machine: carry its sdist and the wheels it lacks (see
tools/bench/run_bench.sh's DEEPSPEED=1).
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
    p.add_argument("--model_size", default="1.3b")
    p.add_argument("--micro_batch", type=int, default=8, help="sequences per micro-batch")
    p.add_argument("--grad_accum_steps", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--timing_skip", type=int, default=2)
    p.add_argument("--stage", type=int, default=2, choices=[2, 3],
                   help="2: optimizer state and step on the CPU; 3: parameters offloaded to the CPU too")
    p.add_argument("--data", required=True, help="a text file; its bytes are the tokens")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hf", action="store_true", help="transformers' LlamaForCausalLM of the preset's shape")
    a = p.parse_args()
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29533"}.items():
        os.environ.setdefault(key, value)
    import deepspeed  # noqa: E402  (after the environment: it reads it on import)

    deepspeed.init_distributed()
    layers, c, h, f, v, kv = PRESETS[a.model_size]
    torch.manual_seed(a.seed)
    data = torch.frombuffer(bytearray(open(a.data, "rb").read()), dtype=torch.uint8).long()
    zero = {"stage": a.stage, "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True, "contiguous_gradients": True,
            "reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8}
    if a.stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config = {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": a.grad_accum_steps,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "steps_per_print": 10 ** 9,
    }
    def build():
        if a.hf:  # on the host: DeepSpeed moves (stage 2) or partitions (stage 3) it
            return hf_llama(a.model_size, a.seq_len, checkpointing=True, device="cpu")
        return Decoder(layers, c, h, f, v, True, a.seq_len, kv)

    # Stage 3 builds the model partitioned (its parameters never whole on the GPU).
    if a.stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = build()
    else:
        model = build()
        if not a.hf:
            init_like_tierd(model, layers)
    params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    torch.cuda.reset_peak_memory_stats()
    tokens = a.micro_batch * a.grad_accum_steps * a.seq_len

    def one_step():
        total = 0.0
        for _ in range(a.grad_accum_steps):
            batch = random_batch(data, a.micro_batch, a.seq_len)
            out = (engine(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss if a.hf
                   else engine(batch[:, :-1], batch[:, 1:]))
            engine.backward(out)
            engine.step()
            total += out.item()
        return total / a.grad_accum_steps

    timed, loss = timed_steps(a.steps, a.timing_skip, one_step, "deepspeed")
    mine, every = nvml_mib()
    tps = tokens * (a.steps - a.timing_skip) / timed if timed > 0 else 0.0
    print(json.dumps({"run": f"deepspeed zero-{a.stage} offload{' hf' if a.hf else ''} +ckpt", "model": a.model_size,
                      "params": params, "nvml_mib": mine, "nvml_all_mib": every,
                      "batch": a.micro_batch, "micro_batches": a.grad_accum_steps, "seq": a.seq_len,
                      "tokens_per_s": tps, "tflops_6n": 6 * params * tps / 1e12,
                      "peak_alloc_bytes": torch.cuda.max_memory_reserved(), "final_loss": loss}), flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
