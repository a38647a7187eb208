#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry, made by tools/device/bundle.sh):
#   device run: command="tools/device/hf_check.sh", carry=[".carry"]
# Hugging Face checkpoints on the GPU, each with a verdict line:
#   1. the kernels, the GPU model and the GPU model through tierd (tools/device/kernels_check.sh:
#      the family's kernels, the family against the CPU, transformers' fixtures on the GPU);
#   2. tierd-train --device=gpu --init_from a transformers checkpoint (Qwen2: biases, tied,
#      GQA), --export, and transformers on this GPU takes the trainer's validation loss from
#      the export (tools/hf/check_export.py, bf16, within 0.5%);
#   3. the same through tierd (Llama 3 fixture, GQA + llama3 RoPE) in a GPU budget that counts
#      the CUDA contexts, checkpointed; tierd-train export of the GPU checkpoint gives the
#      --export's bytes.
# CHECKS="2 3" runs only those. Logs in $OUT. Exit 1 if a check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=.carry/bin/tierd-train
work=/var/tmp/hf-check; rm -rf "$work"; mkdir -p "$work"
pass=0; fail=0
verdict() { if [ "$2" = 0 ]; then pass=$((pass+1)); echo "PASS: $1"; else fail=$((fail+1)); echo "FAIL: $1"; fi; }
checks=" ${CHECKS:-1 2 3} "
want() { [[ "$checks" == *" $1 "* ]]; }
echo "== machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader)"

if want 1; then
  echo "== 1. kernels, GPU model, through tierd"
  OUT="$out" bash tools/device/kernels_check.sh > "$out/kernels.log" 2>&1
  rc=$?
  grep -E '^\[  (PASSED|FAILED) |^\[  FAILED|tests? ran' "$out/kernels.log" | head -30
  grep -E 'on the GPU: loss|: loss cpu .* gpu .*worst' "$out/kernels.log" | head -20
  verdict "kernels_check (gpu_ops, fp8_ops, gpu_model, gpu_trainer_tierd)" $rc
fi

if want 2; then
  echo "== 2. --init_from a transformers checkpoint on the GPU, --export, transformers' loss of the export"
  $bin --device=gpu --init_from=tests/data/hf/qwen2 --steps=8 --batch_size=4 --seq_len=128 --eval_every=4 \
    --export="$work/qwen2-out" --validation_out="$work/qwen2-val.json" > "$out/qwen2.log" 2>&1
  rc=$?
  grep -E '^(init|schedule|model|validation|done|export|exported)' "$out/qwen2.log"
  python3 tools/hf/check_export.py --export "$work/qwen2-out" --validation "$work/qwen2-val.json" --dtype bf16 \
    > "$out/qwen2-check.log" 2>&1
  rc2=$?
  grep '^check_export' "$out/qwen2-check.log" || tail -5 "$out/qwen2-check.log"
  verdict "Qwen2 fixture fine-tuned on the GPU, exported, loss agreed by transformers" $(( rc | rc2 ))
fi

if want 3; then
  echo "== 3. through tierd in a budget that counts the contexts; tierd-train export of the GPU checkpoint"
  tierd_dir=/tmp/hf-check-tierd; rm -rf "$tierd_dir" "$work/nvme"; mkdir -p "$work/nvme"
  .carry/bin/tierd --gpu=cuda --gpu_bytes=3GiB --dram_bytes=4GiB --nvme_dir="$work/nvme" --nvme_bytes=2GiB \
    --runtime_dir="$tierd_dir" > "$out/tierd-3.log" 2>&1 &
  tierd_pid=$!
  for _ in $(seq 300); do [ -S "$tierd_dir/tierd.grpc.sock" ] && break; sleep 0.1; done
  $bin --device=gpu --init_from=tests/data/hf/llama3 --steps=8 --batch_size=4 --seq_len=128 --eval_every=-1 \
    --offload_policy=tierd --gpu_budget=2GiB --tierd_dir="$tierd_dir" --tierd_dram=1GiB --step_order=layer \
    --grad_accum_steps=2 --checkpoint_dir="$work/ck" --checkpoint_every=4 --export="$work/llama3-out" \
    > "$out/llama3-tierd.log" 2>&1
  rc=$?
  kill -TERM $tierd_pid; wait $tierd_pid
  grep -E '^(init|offload|device memory|done|exported)' "$out/llama3-tierd.log"
  $bin export --checkpoint="$work/ck" --to="$work/llama3-export" --init_from=tests/data/hf/llama3 \
    > "$out/llama3-export.log" 2>&1
  rc2=$?
  cat "$out/llama3-export.log"
  cmp "$work/llama3-out/model.safetensors" "$work/llama3-export/model.safetensors"
  rc3=$?
  verdict "Llama 3 fixture through tierd, the budget's split said, the GPU checkpoint exported to the same bytes" \
    $(( rc | rc2 | rc3 ))
fi
echo "hf_check: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
