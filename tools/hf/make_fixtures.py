#!/usr/bin/env python3
"""Makes the Hugging Face test fixtures under tests/data/hf with `transformers` itself.

Each fixture is a small random model of a family tierd-train reads with --init_from, saved
by `save_pretrained` (safetensors), and what `transformers` computes for it on fixed
tokens: the logits (expected.safetensors, fp32) and the mean cross-entropy of the next
token (fixture.json). The C++ tests load each checkpoint and compare (trainer_ref/hf).

    pip install -r tools/hf/requirements.txt
    python3 tools/hf/make_fixtures.py            # rewrites tests/data/hf

The fixtures:
  llama2   multi-head attention, untied head, fp32 weights            (Llama 2)
  llama3   grouped-query attention (8 heads, 2 key/value), llama3 RoPE scaling
           written the Hub's way (rope_scaling + rope_theta), bf16 weights in 3 shards
           with an index (Llama 3.1)
  mistral  grouped-query attention, head_dim 32 with hidden 64 (q 128 wide), a sliding
           window longer than the sequence, fp16 weights                (Mistral, Nemo-like)
  qwen2    q/k/v biases, tied embeddings, grouped-query attention, linear RoPE scaling,
           fp32 weights                                                  (Qwen2 / 2.5)
  tokenizer  a byte-level BPE of 320 tokens trained by `tokenizers` on a short text, with
           BOS/EOS and a Llama-3-style chat template (tools/tokenize.py's test)
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "hf")
BATCH, SEQ = 2, 24
COMMON = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, vocab_size=320, max_position_embeddings=256,
              rms_norm_eps=1e-6)


def fixtures():
    yield "llama2", LlamaForCausalLM, LlamaConfig(**COMMON, num_attention_heads=4, num_key_value_heads=4,
                                                  tie_word_embeddings=False), torch.float32, None
    llama3 = LlamaConfig(**COMMON, num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                         rope_theta=500000.0)
    yield "llama3", LlamaForCausalLM, llama3, torch.bfloat16, "60KB"
    yield "mistral", MistralForCausalLM, MistralConfig(**COMMON, num_attention_heads=4, num_key_value_heads=2,
                                                       head_dim=32, sliding_window=64, tie_word_embeddings=False,
                                                       rope_theta=1000000.0), torch.float16, None
    yield "qwen2", Qwen2ForCausalLM, Qwen2Config(**COMMON, num_attention_heads=4, num_key_value_heads=2,
                                                 tie_word_embeddings=True, use_sliding_window=False,
                                                 rope_scaling={"rope_type": "linear", "factor": 2.0}), \
        torch.float32, None


def hub_style(config_path):
    """transformers 5 writes RoPE as rope_parameters; checkpoints on the Hub have rope_scaling
    and rope_theta beside it. The llama3 fixture is written the Hub's way, so both are read."""
    with open(config_path) as f:
        config = json.load(f)
    params = config.pop("rope_parameters", None)
    if params is not None:
        config["rope_theta"] = params.pop("rope_theta")
        config["rope_scaling"] = params if params.get("rope_type", "default") != "default" else None
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start|>{{ m['role'] }}<|sep|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|sep|>{% endif %}")


def tokenizer_fixture():
    """A byte-level BPE trained on a short text (320 tokens: what the fixtures' models take)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    where = os.path.join(OUT, "tokenizer")
    os.makedirs(where)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|bos|>", "<|eos|>", "<|start|>", "<|sep|>", "<|end|>"]
    text = ["the cat sees the red ball in the garden.", "a dog finds an apple near the sea.",
            "what is two and two? it is four.", "hello, how are you? i am well, thank you."] * 50
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=320, special_tokens=special,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(where, "tokenizer.json"))
    with open(os.path.join(where, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
                   "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False}, f, indent=1)
    print(f"tokenizer: {tok.get_vocab_size()} tokens")


def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    for old in os.listdir(OUT):  # the fixtures, not the BUILD file beside them
        if os.path.isdir(os.path.join(OUT, old)):
            shutil.rmtree(os.path.join(OUT, old))
    tokenizer_fixture()
    for name, cls, config, dtype, shard in fixtures():
        torch.manual_seed(sum(map(ord, name)))
        model = cls(config).to(torch.float32).eval()
        with torch.no_grad():  # the norms and biases away from 1 and 0, so their mapping is checked
            for n, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        model = model.to(dtype)
        where = os.path.join(OUT, name)
        model.save_pretrained(where, **({"max_shard_size": shard} if shard else {}))
        if name == "llama3":
            hub_style(os.path.join(where, "config.json"))
        # What transformers computes, in fp32 from the saved (rounded) weights.
        reloaded = cls.from_pretrained(where, torch_dtype=torch.float32).eval()
        g = torch.Generator().manual_seed(7)
        tokens = torch.randint(0, config.vocab_size, (BATCH, SEQ + 1), generator=g)
        inputs, targets = tokens[:, :-1], tokens[:, 1:].clone()
        targets[1, 5] = -100  # one ignored position (tierd's -1)
        with torch.no_grad():
            logits = reloaded(inputs).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), targets.reshape(-1),
                                                 ignore_index=-100)
        save_file({"logits": logits.contiguous()}, os.path.join(where, "expected.safetensors"))
        fixture = {"inputs": inputs.tolist(), "targets": [[-1 if t == -100 else t for t in row]
                                                          for row in targets.tolist()],
                   "loss": loss.item(), "dtype": str(dtype).replace("torch.", ""),
                   "made_by": f"tools/hf/make_fixtures.py with transformers {transformers.__version__}, "
                              f"torch {torch.__version__}"}
        with open(os.path.join(where, "fixture.json"), "w") as f:
            json.dump(fixture, f, indent=1)
        files = sorted(os.listdir(where))
        print(f"{name}: {', '.join(files)}; loss {loss.item():.6f}")


if __name__ == "__main__":
    sys.exit(main())
