#!/usr/bin/env python3
"""Writes a Hugging Face checkpoint of random weights for a config.json: what a benchmark
fine-tunes when the real weights cannot be fetched (same shapes, same files, same loader).

    python3 tools/hf/random_checkpoint.py --config tools/hf/configs/llama-3.1-8b.json --out /var/tmp/llama3-8b

Matrices N(0, 0.02) in bf16 (the output projections / sqrt(2 layers)), norm weights 1, q/k/v
biases 0 (Qwen2); in shards of at most 5 GB with model.safetensors.index.json, as
save_pretrained writes them. Made on the GPU when there is one (seconds for 8B).
"""
import argparse
import json
import math
import os
import shutil
import time

import torch
from safetensors.torch import save_file


def tensors(config):
    c, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    h, layers = config["num_attention_heads"], config["num_hidden_layers"]
    kv = config.get("num_key_value_heads") or h
    d = config.get("head_dim") or c // h
    bias = config.get("model_type") == "qwen2"
    yield "model.embed_tokens.weight", (v, c)
    for l in range(layers):
        p = f"model.layers.{l}."
        yield p + "input_layernorm.weight", (c,)
        yield p + "self_attn.q_proj.weight", (h * d, c)
        yield p + "self_attn.k_proj.weight", (kv * d, c)
        yield p + "self_attn.v_proj.weight", (kv * d, c)
        if bias:
            for n, rows in (("q", h * d), ("k", kv * d), ("v", kv * d)):
                yield p + f"self_attn.{n}_proj.bias", (rows,)
        yield p + "self_attn.o_proj.weight", (c, h * d)
        yield p + "post_attention_layernorm.weight", (c,)
        yield p + "mlp.gate_proj.weight", (f, c)
        yield p + "mlp.up_proj.weight", (f, c)
        yield p + "mlp.down_proj.weight", (c, f)
    yield "model.norm.weight", (c,)
    if not config.get("tie_word_embeddings", False):
        yield "lm_head.weight", (v, c)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--shard_bytes", type=float, default=5e9)
    a = p.parse_args()
    with open(a.config) as f:
        config = json.load(f)
    os.makedirs(a.out, exist_ok=True)
    shutil.copy(a.config, os.path.join(a.out, "config.json"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(a.seed)
    out_scale = 1 / math.sqrt(2 * config["num_hidden_layers"])
    start = time.time()
    shards, shard, size = [], {}, 0
    for name, shape in tensors(config):
        if len(shape) == 1:
            t = (torch.zeros if name.endswith(".bias") else torch.ones)(shape, dtype=torch.bfloat16)
        else:
            std = 0.02 * (out_scale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
            t = (torch.randn(shape, generator=g, device=device) * std).to(torch.bfloat16).cpu()
        nbytes = t.numel() * 2
        if shard and size + nbytes > a.shard_bytes:
            shards.append(shard)
            shard, size = {}, 0
        shard[name], size = t, size + nbytes
    shards.append(shard)
    weight_map, total = {}, 0
    for i, s in enumerate(shards):
        file = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(s, os.path.join(a.out, file), metadata={"format": "pt"})
        for name, t in s.items():
            weight_map[name] = file
            total += t.numel() * 2
    if len(shards) > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    print(f"random_checkpoint: {a.out}: {len(weight_map)} tensors, {total / 1e9:.2f} GB in {len(shards)} shard(s), "
          f"{time.time() - start:.1f} s on the {device}")


if __name__ == "__main__":
    main()
