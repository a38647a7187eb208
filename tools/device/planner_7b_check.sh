#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry, made by tools/device/bundle.sh):
#   device run: command="tools/device/planner_7b_check.sh", carry=[".carry"]
# The 7B trainer through tierd in a 24 GiB GPU budget (DRAM $TIERD_DRAM, default 100 GiB),
# activation checkpointing, batch 2, $STEPS steps: per step whether the plan held (NVMe
# bytes, waits), then the daemon's own counters (relocations within DRAM, demand fetches,
# stalls) before it stops, and the session's plan next to what was observed (taken every
# 10 s while it trains). Logs go to $OUT. TIERD_FLAGS: more flags for tierd (TRAIN_FLAGS: for the
# trainer, e.g. --optimizer_chunks=16); TIERD_BIN: another
# tierd binary (an A/B in one call); EXPLAIN="name ...": also `tierctl plan --explain` for those
# tensors and the recorded timeline of the last two laps (`tierctl trace --session`,
# $OUT/trace-7b.json), sampled with the plan. DRAM's free gaps between copies (tierctl map) are
# sampled too, and the graph as planned is kept ($OUT/graph-7b.yaml).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
dram="${TIERD_DRAM:-100GiB}"; steps="${STEPS:-6}"
corpus=/tmp/tierd-bench-corpus; mkdir -p "$corpus"
py_lib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$py_lib" -maxdepth 1 -name '*.py' | sort | xargs cat > "$corpus/stdlib.txt"
dir=/tmp/tierd-7b; nvme=/var/tmp/tierd-7b-nvme; rm -rf "$nvme"; mkdir -p "$nvme"
"${TIERD_BIN:-.carry/bin/tierd}" --gpu=cuda --gpu_bytes=24GiB --dram_bytes="$dram" --nvme_dir="$nvme" --nvme_bytes=40GiB \
  --runtime_dir="$dir" ${TIERD_FLAGS:-} > "$out/tierd-7b.log" 2>&1 &
tierd_pid=$!
for _ in $(seq 300); do [ -S "$dir/tierd.grpc.sock" ] && break; sleep 0.1; done
.carry/bin/tierd-train --device=gpu --model_size=7b --batch_size=2 --seq_len=2048 --steps="$steps" --timing_skip=2 --eval_every=-1 \
  --data="$corpus" --profile --offload_policy=tierd --gpu_budget=24GiB --tierd_dir="$dir" --tierd_dram="$dram" \
  --tierd_nvme=40GiB --grad_checkpointing ${TRAIN_FLAGS:-} > "$out/train-7b.log" 2>&1 &
train_pid=$!
# The session's plan, predicted next to observed (executor counters: late, just in time,
# errors, replans), every 10 s while it trains; the last one is kept.
while kill -0 $train_pid 2>/dev/null; do
  .carry/bin/tierctl --runtime_dir="$dir" plan --session 1 > "$out/plan-7b.next" 2>&1 && mv "$out/plan-7b.next" "$out/plan-7b.txt"
  # The graph as planned (measured op times), to plan offline: tierctl plan --graph ... --simulate.
  .carry/bin/tierctl --runtime_dir="$dir" plan --session 1 --dump_graph > "$out/graph-7b.next" 2>&1 &&
    mv "$out/graph-7b.next" "$out/graph-7b.yaml"
  # DRAM's gaps between copies (fragmentation), one line per sample.
  .carry/bin/tierctl --runtime_dir="$dir" map 1 dram 2>/dev/null | tail -n 1 | sed "s/^/$(date +%T) /" >> "$out/dram-map.txt"
  for name in ${EXPLAIN:-}; do
    .carry/bin/tierctl --runtime_dir="$dir" plan --session 1 --explain "$name" > "$out/explain-$name.next" 2>&1 &&
      mv "$out/explain-$name.next" "$out/explain-$name.txt"
  done
  if [ -n "${EXPLAIN:-}" ]; then
    .carry/bin/tierctl --runtime_dir="$dir" trace --session 1 --out "$out/trace-7b.next" > /dev/null 2>&1 &&
      mv "$out/trace-7b.next" "$out/trace-7b.json"
  fi
  sleep 10
done
wait $train_pid; status=$?
grep -E "^(step|done|tierd|optimizer|offload|startup)" "$out/train-7b.log"
echo "== tierctl plan --session 1 (the last taken while training)"
cat "$out/plan-7b.txt" 2>/dev/null | grep -vE "^ +[0-9]+ " | head -40
echo "== DRAM copies and gaps (tierctl map 1 dram), sampled every 10 s"
cat "$out/dram-map.txt" 2>/dev/null
echo "== tierctl stats"
.carry/bin/tierctl --runtime_dir="$dir" stats | tee "$out/stats-7b.txt"
kill -TERM $tierd_pid; wait $tierd_pid
tail -n 3 "$out/tierd-7b.log"
exit "$status"
