#!/usr/bin/env python3
"""Turns text into the token shards tierd-train reads (--data=DIR), with the model's own tokenizer.

    pip install -r tools/hf/requirements.txt          # transformers (or just tokenizers)
    python3 tools/tokenize.py --tokenizer Llama-3.1-8B --out shards/ corpus/ chats.jsonl
    tierd-train --init_from=Llama-3.1-8B --data=shards/ ...

Inputs (files, or directories of them):
  .txt    one document each: BOS + its tokens + EOS, every token trained;
  .jsonl  a document a line: {"text": ...} as a .txt; {"prompt": ..., "response": ...} or
          {"messages": [{"role": "user"|"assistant"|"system", "content": ...}, ...]}: instruction
          data, rendered with the tokenizer's chat template when it has one (its BOS and turn
          ends included; needs transformers), else as "role: content" lines between BOS and EOS,
          with a loss mask so that only the responses (the assistant's turns with their end) are
          trained.
--tokenizer: a directory with tokenizer.json (a --init_from checkpoint's), a tokenizer.json, or
"bytes" (the reference trainer's byte-level vocabulary of 256, no BOS or EOS: no library needed).

Writes DIR/shard-00000.u32 (token ids, little-endian uint32), DIR/shard-00000.mask beside a shard
that has untrained tokens (a byte a token: 1 trained as a target, 0 not) and DIR/index.json
(the tokenizer, its vocabulary size, BOS/EOS ids, each shard's tokens, trained tokens and
documents). A progress bar on stderr.
"""
import os
import sys

# This file's name is the standard library's `tokenize` too: with its folder first on the path,
# transformers' `import tokenize` would find this script. The folder goes off the path first.
_here = {os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.realpath(__file__))}
sys.path = [p for p in sys.path if os.path.realpath(p or ".") not in _here and os.path.abspath(p or ".") not in _here]

import argparse  # noqa: E402
import array  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402


class ByteTokenizer:
    """The reference trainer's own: a token is a byte."""
    name, vocab_size, bos_id, eos_id, chat_template = "bytes", 256, None, None, None

    def encode(self, text):
        return list(text.encode("utf-8"))


class HfTokenizer:
    """A Hugging Face tokenizer: transformers' AutoTokenizer when installed (chat templates),
    else the tokenizers library on tokenizer.json."""

    def __init__(self, where):
        self.name = where
        path = where if os.path.isdir(where) else os.path.dirname(os.path.abspath(where))
        self._hf = None
        try:
            from transformers import AutoTokenizer
            self._hf = AutoTokenizer.from_pretrained(path)
            self.vocab_size = len(self._hf)
            self.bos_id, self.eos_id = self._hf.bos_token_id, self._hf.eos_token_id
            self.chat_template = getattr(self._hf, "chat_template", None)
            return
        except ImportError:
            pass
        from tokenizers import Tokenizer
        file = os.path.join(where, "tokenizer.json") if os.path.isdir(where) else where
        self._tok = Tokenizer.from_file(file)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        config = {}
        config_file = os.path.join(path, "tokenizer_config.json")
        if os.path.exists(config_file):
            with open(config_file) as f:
                config = json.load(f)
        token_id = lambda t: self._tok.token_to_id(t if isinstance(t, str) else (t or {}).get("content", "")) \
            if t else None
        self.bos_id, self.eos_id = token_id(config.get("bos_token")), token_id(config.get("eos_token"))
        self.chat_template = None  # rendering a template needs transformers (jinja)

    def encode(self, text):
        if self._hf is not None:
            return self._hf.encode(text, add_special_tokens=False)
        return self._tok.encode(text, add_special_tokens=False).ids

    def render(self, messages, generation_prompt):
        return self._hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def pieces(tok, record):
    """A record as (text, trained) pieces, in order."""
    if "text" in record:
        return [(record["text"], True)], False
    if "prompt" in record and "response" in record:
        messages = [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["response"]}]
    elif "messages" in record:
        messages = record["messages"]
    else:
        raise ValueError("a record needs 'text', 'prompt' and 'response', or 'messages'")
    out = []
    if tok.chat_template:
        # Each assistant turn is what its render adds to the render of the turns before it.
        done = ""
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                before = tok.render(messages[:i], generation_prompt=True)
                upto = tok.render(messages[:i + 1], generation_prompt=False)
                if not before.startswith(done) or not upto.startswith(before):
                    raise ValueError("the chat template does not render turns as a prefix of the next")
                out += [(before[len(done):], False), (upto[len(before):], True)]
                done = upto
        rest = tok.render(messages, generation_prompt=False)[len(done):]
        if rest:
            out.append((rest, False))
        return out, True
    for m in messages:
        trained = m["role"] == "assistant"
        out += [(f"{m['role']}: ", False), (m["content"] + "\n", trained)]
    return out, True


def input_files(paths):
    """The files to read: each file given, and a directory's .txt and .jsonl files by name."""
    for path in paths:
        if not os.path.isdir(path):
            yield path
            continue
        for name in sorted(os.listdir(path)):
            if name.endswith((".txt", ".jsonl")):
                yield os.path.join(path, name)


def documents(paths):
    for file in input_files(paths):
        if file.endswith(".txt"):
            with open(file, encoding="utf-8", errors="replace") as f:
                yield file, 0, {"text": f.read()}
        elif file.endswith(".jsonl"):
            with open(file, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            yield file, number, json.loads(line)
                        except json.JSONDecodeError as e:
                            raise SystemExit(f"tokenize: {file}, line {number}: not JSON ({e})")
        else:
            raise SystemExit(f"tokenize: {file}: give .txt or .jsonl files")


class Shards:
    def __init__(self, out, shard_tokens):
        self.out, self.limit = out, shard_tokens
        self.index, self.ids, self.mask, self.docs = [], array.array("I"), bytearray(), 0

    def add(self, ids, mask):
        self.ids.extend(ids)
        self.mask.extend(mask)
        self.docs += 1
        if len(self.ids) >= self.limit:
            self.flush()

    def flush(self):
        if not self.ids:
            return
        name = f"shard-{len(self.index):05d}"
        if sys.byteorder != "little":
            self.ids.byteswap()
        for suffix, data in ((".u32", self.ids.tobytes()), (".mask", bytes(self.mask))):
            if suffix == ".mask" and all(self.mask):
                continue  # every token trained: no mask
            with open(os.path.join(self.out, name + suffix + ".partial"), "wb") as f:
                f.write(data)
            os.replace(os.path.join(self.out, name + suffix + ".partial"), os.path.join(self.out, name + suffix))
        self.index.append({"file": name + ".u32", "tokens": len(self.ids), "trained": sum(self.mask),
                           "documents": self.docs, "mask": None if all(self.mask) else name + ".mask"})
        self.ids, self.mask, self.docs = array.array("I"), bytearray(), 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help=".txt and .jsonl files, or directories of them")
    p.add_argument("--tokenizer", required=True, help="a directory with tokenizer.json, a tokenizer.json, or 'bytes'")
    p.add_argument("--out", required=True, help="a new (or empty) directory for the shards")
    p.add_argument("--shard_tokens", type=int, default=100_000_000, help="tokens a shard (at least)")
    p.add_argument("--no_bos", action="store_true", help="no BOS token before each document")
    p.add_argument("--no_eos", action="store_true", help="no EOS token after each document")
    a = p.parse_args()
    if os.path.isdir(a.out) and os.listdir(a.out):
        raise SystemExit(f"tokenize: {a.out} holds files already; give a new or empty directory")
    os.makedirs(a.out, exist_ok=True)
    tok = ByteTokenizer() if a.tokenizer == "bytes" else HfTokenizer(a.tokenizer)
    bos = None if a.no_bos else tok.bos_id
    eos = None if a.no_eos else tok.eos_id
    total_bytes = sum(os.path.getsize(f) for f in input_files(a.inputs) if os.path.isfile(f))
    try:
        from tqdm import tqdm
        bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenize", file=sys.stderr)
    except ImportError:
        bar = None
    shards, start, seen, said = Shards(a.out, a.shard_tokens), time.time(), 0, 0
    for file, line, record in documents(a.inputs):
        try:
            parts, instruction = pieces(tok, record)
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"tokenize: {file}" + (f", line {line}" if line else "") + f": {e}")
        ids, mask = [], bytearray()
        templated = instruction and tok.chat_template  # the template writes its own BOS and turn ends
        if bos is not None and not templated:
            ids.append(bos)
            mask.append(0 if instruction else 1)
        for text, trained in parts:
            piece = tok.encode(text)
            ids += piece
            mask += bytes([1 if trained else 0]) * len(piece)
        if eos is not None and not templated and (not ids or ids[-1] != eos):
            ids.append(eos)
            mask.append(1)  # the end of a response (or a document) is learned too
        if any(i >= tok.vocab_size or i < 0 for i in ids):
            raise SystemExit(f"tokenize: {file}: a token id outside the tokenizer's vocabulary of {tok.vocab_size}")
        shards.add(ids, mask)
        size = len(json.dumps(record)) if line else len(record["text"])
        seen += size
        if bar is not None:
            bar.update(size)
        elif seen - said > 10_000_000 or said == 0:
            said = seen
            print(f"tokenize: {seen / 1e6:.0f} of {total_bytes / 1e6:.0f} MB", file=sys.stderr, flush=True)
    shards.flush()
    if bar is not None:
        bar.close()
    tokens = sum(s["tokens"] for s in shards.index)
    trained = sum(s["trained"] for s in shards.index)
    index = {"tokenizer": tok.name, "vocab_size": tok.vocab_size, "bos_token_id": bos, "eos_token_id": eos,
             "total_tokens": tokens, "trained_tokens": trained,
             "documents": sum(s["documents"] for s in shards.index), "shards": shards.index,
             "made_by": "tools/tokenize.py"}
    with open(os.path.join(a.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"tokenize: {index['documents']} documents, {tokens} tokens ({100 * trained / max(tokens, 1):.1f}% trained) "
          f"in {len(shards.index)} shard(s) in {a.out}, {time.time() - start:.1f} s; tierd-train --data={a.out}")


if __name__ == "__main__":
    main()
