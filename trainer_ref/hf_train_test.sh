#!/usr/bin/env bash
# tierd-train with Hugging Face checkpoints end to end, on the CPU: fine-tuning one made by
# transformers (tests/data/hf) with --init_from, exporting it (--export, and tierd-train export
# from a checkpoint: the same bytes), and what a user can get wrong, explained. With
# transformers installed, the export is also loaded by it and its validation loss compared.
# Prints "N passed, M failed"; exit 1 on a failure.
set -u
bin="$1"
fixtures="$2"
tools="$3"
dir="${TEST_TMPDIR:-/tmp}/hf_train_test.$$"
mkdir -p "$dir"
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED: $1"; fi; }

common="--steps=8 --batch_size=2 --seq_len=32 --eval_every=4"
"$bin" $common --init_from="$fixtures/llama3" --checkpoint_dir="$dir/ck" --checkpoint_every=4 --export="$dir/out" \
  --validation_out="$dir/val.json" > "$dir/a.log" 2>&1
check "a sharded bf16 checkpoint fine-tunes" "grep -q '^done: 8 steps' '$dir/a.log'"
check "the startup says what it read" "grep -q '^init: weights of .*llama3 (4 files, .* KiB, bf16)' '$dir/a.log'"
check "and the fine-tuning schedule, with why" \
  "grep -q '^schedule: lr 2e-05 (2e-05, full fine-tuning.s usual AdamW rate (--init_from)), warmup 1 steps' '$dir/a.log'"
check "the model is named after the checkpoint, GQA and llama3 RoPE said" \
  "grep -q 'model llama3: 2 layers, d_model 64, 8 heads (2 key/value), d_ff 128, vocab 320, RoPE llama3 x8' '$dir/a.log'"
check "the export is a Hugging Face checkpoint with the source's config" \
  "[ -s '$dir/out/model.safetensors' ] && cmp -s '$dir/out/config.json' '$fixtures/llama3/config.json' && cmp -s '$dir/out/generation_config.json' '$fixtures/llama3/generation_config.json'"
check "the held-out windows are written with the loss" "grep -q '\"validation_loss\": ' '$dir/val.json'"
"$bin" export --checkpoint="$dir/ck" --to="$dir/out2" --init_from="$fixtures/llama3" > "$dir/x.log" 2>&1
check "tierd-train export of the last checkpoint gives the same bytes" \
  "cmp -s '$dir/out/model.safetensors' '$dir/out2/model.safetensors'"
"$bin" $common --init_from="$dir/out" --steps=2 --eval_every=-1 > "$dir/b.log" 2>&1
check "an export fine-tunes again" "grep -q '^done: 2 steps' '$dir/b.log'"

# What a user gets wrong.
"$bin" $common --init_from="$fixtures/llama3" --export="$dir/out" > "$dir/e1.log" 2>&1
check "an export never overwrites, said before training" \
  "grep -q 'directory .*out. holds [0-9]* files already; give a new or empty directory' '$dir/e1.log' && ! grep -q '^step' '$dir/e1.log'"
"$bin" --init_from="$fixtures/llama3" --model_size=124m > "$dir/e2.log" 2>&1
check "--init_from with a shape flag is refused" "grep -q 'takes the model.s shape from .*config.json: give no --model_size' '$dir/e2.log'"
mkdir -p "$dir/cut"
cp "$fixtures/qwen2/config.json" "$dir/cut/"
head -c 200000 "$fixtures/qwen2/model.safetensors" > "$dir/cut/model.safetensors"
"$bin" $common --init_from="$dir/cut" > "$dir/e3.log" 2>&1
check "a cut shard is refused with the file and the byte" \
  "grep -q \"safetensors file '$dir/cut/model.safetensors', byte [0-9]*: tensor .* (the file is cut)\" '$dir/e3.log'"
mkdir -p "$dir/pt"
cp "$fixtures/qwen2/config.json" "$dir/pt/"
"$bin" $common --init_from="$dir/pt" > "$dir/e4.log" 2>&1
check "a directory without safetensors is explained" "grep -q 'neither model.safetensors nor model.safetensors.index.json' '$dir/e4.log'"
sed 's/"intermediate_size": 128/"intermediate_size": 192/' "$fixtures/qwen2/config.json" > "$dir/cut/config.json"
cp "$fixtures/qwen2/model.safetensors" "$dir/cut/"
"$bin" $common --init_from="$dir/cut" > "$dir/e5.log" 2>&1
check "weights of another shape are refused naming the tensor and both shapes" \
  "grep -q \"'model.layers.0.mlp.gate_proj.weight' is \\[128, 64\\] there; this config needs \\[192, 64\\]\" '$dir/e5.log'"
"$bin" $common --init_from="$fixtures/llama3" --eval_every=-1 --validation_out="$dir/v.json" > "$dir/e7.log" 2>&1
check "--validation_out without a validation is refused" "grep -q 'validation_out needs a validation' '$dir/e7.log'"
"$bin" export --checkpoint="$dir/ck" --to="$dir/out3" --model_size=tiny > "$dir/e6.log" 2>&1
check "exporting a checkpoint as another model is refused" "grep -q 'the state holds .* parameters; this model has' '$dir/e6.log'"
"$bin" export --checkpoint="$dir/ck" --init_from="$fixtures/llama3" > "$dir/e8.log" 2>&1
check "export without --to says what it takes" "grep -q '^tierd-train export: give --checkpoint=FILE_OR_DIR --to=NEW_DIR' '$dir/e8.log'"
"$bin" export --checkpoint="$dir/ck" --to="$dir/out4" --init_from="$fixtures/llama3" --export_dtype=fp16 > "$dir/e9.log" 2>&1
check "export to a dtype it does not write is refused" "grep -q '^tierd-train export: --export_dtype is bf16 or fp32' '$dir/e9.log' && [ ! -e '$dir/out4' ]"
"$bin" export --checkpoint="$dir/ck" --to="$dir/out4" --init_from="$fixtures/llama3" --export_shard_size=huge > "$dir/e10.log" 2>&1
check "a shard size that is not a size is refused" "grep -q '^tierd-train export: --export_shard_size: ' '$dir/e10.log' && [ ! -e '$dir/out4' ]"

if python3 -c "import torch, transformers" 2> /dev/null; then
  python3 "$tools/check_export.py" --export "$dir/out" --validation "$dir/val.json" --dtype fp32 --tolerance 0.005 \
    > "$dir/py.log" 2>&1
  rc=$?
  check "transformers loads the export and takes the trainer's validation loss within 0.5% (bf16 weights)" \
    "[ $rc = 0 ] && grep -q '^check_export: ' '$dir/py.log'"
  cat "$dir/py.log" | grep '^check_export'
else
  echo "note: torch and transformers are not installed here: the export's check by transformers is not run (pip install -r tools/hf/requirements.txt)"
fi
rm -rf "$dir"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
