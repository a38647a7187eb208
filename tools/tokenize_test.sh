#!/usr/bin/env bash
# tools/tokenize.py end to end: text and instruction data (prompt/response, messages) into
# shards with an index and loss masks, read by tierd-train, which trains on the responses only.
# With the built-in byte tokenizer always; with a Hugging Face tokenizer made by `tokenizers`
# (tests/data/hf/tokenizer) where tokenizers / transformers are installed (said otherwise).
# Prints "N passed, M failed"; exit 1 on a failure.
set -u
tokenize="$1"; bin="$2"; fixture="$3"
dir="${TEST_TMPDIR:-/tmp}/tokenize_test.$$"
mkdir -p "$dir/in"
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED: $1"; fi; }
for i in $(seq 40); do echo "the cat sees the red ball in the garden. a dog finds an apple near the sea."; done > "$dir/in/story.txt"
for i in $(seq 60); do
  echo '{"prompt": "what is two and two?", "response": "it is four."}'
  echo '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi, how are you?"}, {"role": "user", "content": "well"}, {"role": "assistant", "content": "good."}]}'
done > "$dir/in/chat.jsonl"

python3 "$tokenize" --tokenizer bytes --out "$dir/bytes" "$dir/in" > "$dir/t1.log" 2>&1
check "byte tokens: shards and an index" "[ -s '$dir/bytes/shard-00000.u32' ] && grep -q '\"total_tokens\"' '$dir/bytes/index.json'"
python3 - "$dir/bytes" > "$dir/m1.log" 2>&1 <<'PY'
import json, sys, os
d = sys.argv[1]
index = json.load(open(os.path.join(d, "index.json")))
shard = index["shards"][0]
ids = open(os.path.join(d, shard["file"]), "rb").read()
mask = open(os.path.join(d, shard["mask"]), "rb").read()
text = bytes(ids[0::4])  # byte tokens: the low byte of each u32
assert len(mask) * 4 == len(ids) == 4 * shard["tokens"], "a mask byte a token"
trained = bytes(t for t, m in zip(text, mask) if m)
assert trained.count(b"it is four.") == 60, trained[:200]
assert trained.count(b"hi, how are you?") == 60 and trained.count(b"good.") == 60
assert b"what is two" not in trained and b"hello" not in trained and b"be brief" not in trained
assert trained.count(b"the cat sees") == 40, "plain text (one document: the file) is all trained"
assert shard["trained"] == sum(mask) and index["trained_tokens"] == sum(mask)
print("mask ok:", shard["tokens"], "tokens,", shard["trained"], "trained")
PY
check "the loss mask trains the responses and the text, never the prompts" "grep -q '^mask ok' '$dir/m1.log'"
"$bin" --data="$dir/bytes" --seq_len=32 --batch_size=2 --steps=4 --eval_every=-1 > "$dir/r1.log" 2>&1
check "tierd-train reads the shards and says the share trained" \
  "grep -q 'data $dir/bytes ([0-9]* tokens), [0-9.]*% of them trained (a loss mask)' '$dir/r1.log' && grep -q '^done: 4 steps' '$dir/r1.log'"
python3 "$tokenize" --tokenizer bytes --out "$dir/bytes" "$dir/in" > "$dir/t2.log" 2>&1
check "an output directory with files is refused" "grep -q 'holds files already' '$dir/t2.log'"
echo '{"question": "?"}' > "$dir/bad.jsonl"
python3 "$tokenize" --tokenizer bytes --out "$dir/bad" "$dir/bad.jsonl" > "$dir/t3.log" 2>&1
check "a record of no known form is refused with its file and line" "grep -q 'bad.jsonl, line 1: a record needs' '$dir/t3.log'"

if python3 -c "import tokenizers" 2> /dev/null; then
  python3 "$tokenize" --tokenizer "$fixture" --out "$dir/hf" "$dir/in" > "$dir/t4.log" 2>&1
  check "a Hugging Face tokenizer's shards" "grep -q '\"vocab_size\": 320' '$dir/hf/index.json'"
  python3 - "$dir/hf" "$fixture" > "$dir/m2.log" 2>&1 <<'PY'
import array, json, os, sys
from tokenizers import Tokenizer
d, fixture = sys.argv[1:]
tok = Tokenizer.from_file(os.path.join(fixture, "tokenizer.json"))
index = json.load(open(os.path.join(d, "index.json")))
shard = index["shards"][0]
ids = array.array("I", open(os.path.join(d, shard["file"]), "rb").read())
mask = open(os.path.join(d, shard["mask"]), "rb").read()
trained = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
untrained = tok.decode([i for i, m in zip(ids, mask) if not m], skip_special_tokens=False)
assert "it is four." in trained and "good." in trained, trained[:300]
assert "what is two" not in trained and "be brief" not in trained, trained[:300]
assert "what is two" in untrained
bos, eos = index["bos_token_id"], index["eos_token_id"]
assert bos == tok.token_to_id("<|bos|>") and eos == tok.token_to_id("<|eos|>")
assert ids.count(bos) == 121, ids.count(bos)  # each document's: the text file, 120 records (ours or the template's)
templated = "<|start|>user<|sep|>" in untrained
if templated:  # transformers rendered the chat template: each turn's end is learned with it
    assert trained.count("<|end|>") == 180, trained.count("<|end|>")
print("hf mask ok:", shard["tokens"], "tokens,", shard["trained"], "trained;",
      "the chat template rendered (transformers)" if templated else "role: content lines (tokenizers alone)")
PY
  check "its mask trains the responses only (tokens decoded by tokenizers)" "grep -q '^hf mask ok' '$dir/m2.log'"
  cat "$dir/m2.log" | tail -1
  "$bin" --data="$dir/hf" --init_from="$fixture/../qwen2" --seq_len=32 --batch_size=2 --steps=4 --eval_every=-1 \
    > "$dir/r2.log" 2>&1
  check "a model of that vocabulary fine-tunes on them" "grep -q '^done: 4 steps' '$dir/r2.log'"
else
  echo "note: the tokenizers package is not installed here: the Hugging Face tokenizer's checks are not run (pip install -r tools/hf/requirements.txt)"
fi
rm -rf "$dir"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
