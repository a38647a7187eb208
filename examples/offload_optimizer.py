"""Train a Hugging Face Llama with its optimizer state in tierd (copy this and change the model).

The fp32 master weights and AdamW's moments live in tierd's DRAM tier (spilling to NVMe under
the quota), not on the GPU: a 1.3B model's 16 GB of optimizer state leaves the card. Gradients
leave the GPU as each one is ready; the host steps them with tierd's vectorised AdamW and the new
weights come back before the next forward needs them.

    tierd --dram_bytes=48GiB --nvme_dir=/var/tmp --nvme_bytes=64GiB &      # once per node
    pip install dist/tierd-*.whl transformers           # in a venv; the wheel: tools/python/build_wheel.sh
    python3 examples/offload_optimizer.py --layers 24 --hidden 2048 --steps 20

A model larger than the GPU: --offload_weights=QUOTA puts the weights in tierd too
(tierd.torch.offload), each decoder layer's fetched for its forward and again for its backward,
with QUOTA of GPU memory for them; bf16 weights (fp32 master on the host), activation
checkpointing and 8-bit AdamW keep the rest small. A 7B Llama (the daemon with --dram_bytes=96GiB):

    python3 examples/offload_optimizer.py --layers 32 --hidden 4096 --heads 32 --kv_heads 32 \
        --vocab 32000 --seq 2048 --batch 4 --accumulate 1 --clip 0 --opt adamw8bit \
        --offload_weights 8GiB --dram 80GiB --steps 20

When the host's optimizer step is slower than the GPU's forward and backward, --gpu_share=F
steps that fraction of the parameters on the GPU instead (the same bits).

Without a GPU it runs on the CPU (tiny by default), which is how its test runs it.
"""
import argparse
import time

import torch
import transformers

import tierd
import tierd.torch


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv_heads", type=int, default=2, help="grouped-query attention: key/value heads")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--accumulate", type=int, default=2, help="micro-batches a step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--clip", type=float, default=1.0, help="max gradient norm; 0: no clipping (more overlap)")
    p.add_argument("--opt", default="adamw", choices=["adamw", "adamw8bit", "lion"])
    p.add_argument("--dram", default="2GiB", help="this job's tierd DRAM quota")
    p.add_argument("--nvme", default="2GiB", help="this job's tierd NVMe quota (where DRAM is not enough)")
    p.add_argument("--offload_weights", default="", metavar="QUOTA",
                   help="the weights in tierd too, with QUOTA of GPU memory for them (e.g. 8GiB); implies bf16 "
                        "weights and activation checkpointing")
    p.add_argument("--gpu_share", type=float, default=0.0, metavar="F",
                   help="step this fraction of the parameters (the first ones: embeddings, first layers) on the GPU "
                        "with the same arithmetic: less host work for GPU memory (their state; with "
                        "--offload_weights it shares QUOTA)")
    a = p.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=a.hidden, intermediate_size=int(a.hidden * 8 / 3) // 16 * 16,
                                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                      num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                                      max_position_embeddings=a.seq)
    weights = None
    if a.offload_weights:
        with torch.device(device):  # built where it runs (a 7B built on the host first takes minutes)
            model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # One session for the weights and the optimizer (the optimizer then writes the new weights
        # straight into the weights' leases); each decoder layer's weights fetched together.
        weights = tierd.torch.offload(model, gpu=a.offload_weights, dram=a.dram, nvme=a.nvme,
                                      units=transformers.models.llama.modeling_llama.LlamaDecoderLayer)
    else:
        model = transformers.LlamaForCausalLM(config).to(device)
    opt = tierd.torch.OffloadOptimizer(model.parameters(), opt=a.opt, lr=1e-3, betas=(0.9, 0.95),
                                       weight_decay=0.1, max_grad_norm=a.clip or None,
                                       accumulation_steps=a.accumulate, dram=a.dram, nvme=a.nvme,
                                       client=weights.client if weights else None, gpu_share=a.gpu_share)
    params = sum(p.numel() for p in model.parameters())
    print(f"{params / 1e6:.1f}M parameters on {device}; optimizer state in tierd at {opt.client.runtime_dir}"
          f"{f'; {opt.gpu_values / params:.0%} of them stepped on the GPU' if opt.gpu_values else ''}")
    for step in range(1, a.steps + 1):
        start, total = time.time(), 0.0
        for _ in range(a.accumulate):
            tokens = torch.randint(0, a.vocab, (a.batch, a.seq), device=device)
            tokens[:, 1::2] = tokens[:, ::2]  # something learnable: every odd token repeats the one before
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                loss = model(input_ids=tokens, labels=tokens).loss / a.accumulate
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        opt.client.report_step(step, total, time.time() - start, a.batch * a.seq * a.accumulate)
        print(f"step {step}: loss {total:.4f}, |g| {opt.last_grad_norm:.3f}, {time.time() - start:.2f} s")
    opt.synchronize()  # the last step's weights, before the model is read outside a forward
    # Offloaded, the model's own parameters are placeholders between uses: the handle has the weights.
    state = weights.state_dict() if weights else model.state_dict()
    torch.save({"model": state, "optimizer": opt.state_dict()}, "/tmp/offload_example.pt")
    dram = [t for t in opt.client.usage()["tiers"] if t["tier"] == "TIER_DRAM"][0]
    print(f"saved /tmp/offload_example.pt; tierd DRAM peak of this job {dram.get('peak_bytes', 0) / 2**20:.1f} MiB")
    opt.close()
    if weights:
        weights.client.close()


if __name__ == "__main__":
    main()
