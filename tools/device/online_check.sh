#!/usr/bin/env bash
# The GPU trainer through tierd without a plan (--tierd_plan=false: tierd's online policy
# moves tensors as they are asked for), twice: thrash lock off, then on (a tierd config with
# thrash: {lock: true}). While each runs, `tierctl stats` shows the trainer's session with its
# step time and loss window (ReportStep); after, `tierctl leases` lists refetched and locked
# tensors. On the lent GPU machine, carry .carry (tools/device/bundle.sh). MODEL, BUDGET,
# DRAM, STEPS, FLAGS override the defaults; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
model="${MODEL:-1.3b}"; budget="${BUDGET:-11GiB}"; dram="${DRAM:-32GiB}"; steps="${STEPS:-6}"
flags="${FLAGS:---batch_size=2 --grad_accum_steps=4 --precision=auto --opt=adamw8bit --grad_checkpointing=full --step_order=layer --compact_state=on}"
corpus=/tmp/tierd-bench-corpus; mkdir -p "$corpus"
py_lib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$py_lib" -maxdepth 1 -name '*.py' | sort | xargs cat > "$corpus/stdlib.txt"
dir=/tmp/tierd-online; nvme=/var/tmp/tierd-online-nvme
for lock in false true; do
  echo "== $model, GPU budget $budget, tierd's online policy (no plan), thrash lock $lock"
  rm -rf "$nvme" "$dir"; mkdir -p "$nvme"
  printf 'thrash: {lock: %s, warmup_acquires: 2000, refetches: 3, max_locked_fraction: 0.5}\n' "$lock" > /tmp/tierd-online.yaml
  .carry/bin/tierd --config=/tmp/tierd-online.yaml --gpu=cuda --gpu_bytes="$budget" --dram_bytes="$dram" \
    --nvme_dir="$nvme" --nvme_bytes=20GiB --runtime_dir="$dir" > "$out/tierd-lock-$lock.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do [ -S "$dir/tierd.grpc.sock" ] && break; sleep 0.1; done
  .carry/bin/tierd-train --device=gpu --model_size="$model" --seq_len=2048 --steps="$steps" --timing_skip=2 \
    --eval_every=-1 --data="$corpus" --offload_policy=tierd --gpu_budget="$budget" --tierd_dir="$dir" \
    --tierd_dram="$dram" --tierd_nvme=20GiB --tierd_plan=false $flags > "$out/train-lock-$lock.log" 2>&1 &
  train=$!
  # The session table once the trainer has reported a few steps.
  for _ in $(seq 600); do grep -q '^step     3/' "$out/train-lock-$lock.log" 2>/dev/null && break; sleep 0.5; done
  .carry/bin/tierctl --runtime_dir="$dir" stats > "$out/stats-lock-$lock.txt" 2>&1
  .carry/bin/tierctl --runtime_dir="$dir" leases > "$out/leases-lock-$lock.txt" 2>&1
  wait $train; echo "trainer exit $?"
  grep -E '^(step|done|result)' "$out/train-lock-$lock.log" | cut -c1-260
  sed -n '/session/,$p' "$out/stats-lock-$lock.txt" | head -12
  grep -ciE 'thrashed' "$out/leases-lock-$lock.txt" | sed 's/^/locked tensors: /'
  kill -TERM $pid; wait $pid; tail -n 2 "$out/tierd-lock-$lock.log"
done
