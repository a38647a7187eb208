#!/usr/bin/env bash
# Fine-tuning a Llama-3.1-8B-shaped model (GQA 32/8, vocab 128256, llama3 RoPE; random weights
# saved as a Hugging Face checkpoint by tools/hf/random_checkpoint.py) on the lent H200, against
# PyTorch with the whole GPU. Carry .carry (tools/device/bundle.sh) and, for the float8 row, .whl
# with torchao's pure-Python wheel:
#   device run: command="PHASE=ours tools/bench/llama3_8b.sh", carry=[".carry"]
#   device run: command="PHASE=torch tools/bench/llama3_8b.sh", carry=[".carry", ".whl"]
# PHASE=ours: tierd-train --init_from the checkpoint through tierd in a GPU budget of BUDGET
#   (default 22GiB: the device memory of the trainer and tierd as nvidia-smi counts it, which is
#   sampled twice a second through the run and its peak above the idle device reported), then
#   --export, and transformers loads the export on this GPU and takes the trainer's validation
#   loss over the same windows (tools/hf/check_export.py).
# PHASE=torch: tools/bench/torch_baseline.py --model_size=llama3-8b, eager, torch.compile, and
#   torchao float8 + compile (TORCH_RUNS to choose), each at the largest batch that fits.
# Both print JSON result lines (also in $OUT/llama3-8b.jsonl).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/torchao_env.sh
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
corpus=/tmp/tierd-bench-corpus; mkdir -p "$corpus"
py_lib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$py_lib" -maxdepth 1 -name '*.py' | sort | xargs cat > "$corpus/stdlib.txt"
results="$out/llama3-8b.jsonl"
echo "== machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader)"
steps="${STEPS:-6}"; skip="${SKIP:-2}"

if [ "${PHASE:-ours}" = ours ]; then
  ckpt=/var/tmp/llama3-8b; export_dir=/var/tmp/llama3-8b-tuned
  rm -rf "$ckpt" "$export_dir" /var/tmp/llama3-nvme; mkdir -p /var/tmp/llama3-nvme
  python3 tools/hf/random_checkpoint.py --config tools/hf/configs/llama-3.1-8b.json --out "$ckpt" 2>&1 | tail -1
  budget="${BUDGET:-22GiB}"; tierd_dir=/tmp/llama3-tierd
  idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  .carry/bin/tierd --gpu=cuda --gpu_bytes="$budget" --dram_bytes=100GiB --nvme_dir=/var/tmp/llama3-nvme \
    --nvme_bytes=4GiB --runtime_dir="$tierd_dir" > "$out/tierd-llama3.log" 2>&1 &
  tierd_pid=$!
  for _ in $(seq 300); do [ -S "$tierd_dir/tierd.grpc.sock" ] && break; sleep 0.1; done
  ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; sleep 0.5; done ) \
    > "$out/smi-llama3.txt" 2>/dev/null &
  sampler=$!
  .carry/bin/tierd-train --device=gpu --init_from="$ckpt" --data="$corpus" --seq_len=2048 --batch_size=4 \
    --grad_accum_steps=8 --grad_checkpointing --step_order=layer --opt=adamw8bit --precision=fp8 \
    --offload_policy=tierd --gpu_budget="$budget" --tierd_dir="$tierd_dir" --tierd_dram=100GiB --tierd_nvme=4GiB \
    --steps="$steps" --timing_skip="$skip" --eval_every=0 --export="$export_dir" \
    --validation_out="$out/llama3-val.json" ${OURS_FLAGS:-} 2>&1 | tee "$out/ours-llama3-8b.log" |
    grep -vE '^step +[0-9]+/' | tail -n 30
  kill $sampler
  kill -TERM $tierd_pid; wait $tierd_pid
  peak=$(sort -n "$out/smi-llama3.txt" | tail -1)
  echo "nvidia-smi: idle ${idle} MiB, the run's peak $peak MiB: the run took $(( peak - idle )) MiB of the device ($budget budget)"
  grep '^step ' "$out/ours-llama3-8b.log" | tail -n 3
  grep '^result: ' "$out/ours-llama3-8b.log" | sed 's/^result: //' |
    python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['nvidia_smi_mib']=$(( peak - idle )); print(json.dumps(r))" |
    tee -a "$results"
  python3 tools/hf/check_export.py --export "$export_dir" --validation "$out/llama3-val.json" --dtype bf16 2>&1 |
    grep -E '^check_export|Error|error' | tail -n 3
  du -sh "$ckpt" "$export_dir"
fi

if [ "${PHASE:-ours}" = torch ]; then
  if [[ " ${TORCH_RUNS:-eager compile float8} " == *" float8 "* ]]; then use_torchao || exit 1; fi
  for run in ${TORCH_RUNS:-eager compile float8}; do
    flags="--timing_skip=$skip"
    [ "$run" = compile ] && flags="--compile --timing_skip=$(( skip > 4 ? skip : 4 ))"
    [ "$run" = float8 ] && flags="--float8 --timing_skip=$(( skip > 4 ? skip : 4 ))"
    echo "== pytorch llama3-8b $run"
    python3 tools/bench/torch_baseline.py --model_size=llama3-8b --batch_size="${TORCH_BATCH:-max}" --seq_len=2048 \
      --steps="$(( steps + 2 ))" --data="$corpus/stdlib.txt" $flags 2>&1 | tee "$out/torch-llama3-8b-$run.log" | tail -n 3
    tail -n 1 "$out/torch-llama3-8b-$run.log" | grep '^{' >> "$results"
  done
fi
