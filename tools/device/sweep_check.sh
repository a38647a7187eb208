#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry; .whl with torchao's wheel for PEERS):
#   device run: command="tools/device/sweep_check.sh", carry=[".carry", ".whl"]
# Which of our settings is fastest for one model in one budget, side by side in one call:
# each line of CONFIGS ("label|micro-batch|flags[|tierd daemon flags]") is a run of ours only (tierd, fp8, 8-bit
# AdamW, no profiling), and one table says tokens/s, the step, how long the host waited for
# tierd's moves, the bytes moved and the GPU memory NVML saw. Then PEERS (model specs: presets
# or config.json paths) run torchao float8 + compile against ours with PEER_FLAGS at
# PEER_BATCH and PEER_DAEMON_FLAGS (run_bench.sh's headline table); PEER_FROM_SWEEP=1: with the
# sweep's fastest setting instead. MODEL (default 1.3b), BUDGET (24GiB); SWEEP=0 runs the peers only.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
work=/tmp/sweep; rm -rf "$work"; mkdir -p "$work"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
source tools/device/cudnn_env.sh
model="${MODEL:-1.3b}"; budget="${BUDGET:-24GiB}"; status=0
base="--opt=adamw8bit --precision=fp8"
default_configs="base|2|--grad_accum_steps=4 --step_order=micro
dynamic|2|--grad_accum_steps=4 --step_order=micro --grad_checkpointing=dynamic
4x2 dynamic|4|--grad_accum_steps=2 --step_order=micro --grad_checkpointing=dynamic
layer-major|2|--grad_accum_steps=4 --step_order=layer --grad_checkpointing=dynamic
dynamic cudnn-fast|2|--grad_accum_steps=4 --step_order=micro --grad_checkpointing=dynamic --attention=cudnn-fast"
echo "== machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader); model $model, budget $budget"
: > "$out/sweep.jsonl"
n=0
while IFS='|' read -r label batch flags daemon_flags; do
  [ -z "$label" ] && continue
  n=$((n + 1)); dir="$work/$n"
  echo "== $label: batch $batch $flags${daemon_flags:+; tierd $daemon_flags}"
  env OUT="$dir" MODELS="$model" NONE=0 TORCH=0 PROFILE=0 BUDGETS="$budget" BATCH="$batch" STEPS="${STEPS:-8}" SKIP=3 \
    TIERD_DRAM="${TIERD_DRAM:-32GiB}" TIERD_RUN_FLAGS="$base $flags" TIERD_DAEMON_FLAGS="${daemon_flags:-}" tools/bench/run_bench.sh > "$dir.txt" 2>&1 || status=1
  log=$(ls "$dir"/ours-*-tierd-*.log 2>/dev/null | head -n 1)
  if ! grep -q '^result: ' "${log:-/dev/null}"; then echo "FAIL: $label"; tail -n 8 "$dir.txt"; status=1; continue; fi
  grep -h '^activations\|^optimizer:\|^device memory' "$log" | cut -c1-240
  nvml=$(grep -o 'this process [^=]*= [0-9.]* GiB' "$log" | grep -o '= [0-9.]* GiB' | tr -d '= ')
  grep '^result: ' "$log" | sed 's/^result: //' | LABEL="$label" NVML="$nvml" python3 -c \
    "import json, os, sys; r = json.loads(sys.stdin.read()); r.update(label=os.environ['LABEL'], nvml=os.environ['NVML']); print(json.dumps(r))" \
    >> "$out/sweep.jsonl"
  cp "$log" "$out/sweep-$n.log" 2>/dev/null
done <<< "$([ "${SWEEP:-1}" = 1 ] && echo "${CONFIGS:-$default_configs}")"
echo "== sweep: $model, $budget, ours only"
python3 - "$out/sweep.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if rows:  # none with SWEEP=0
    first = rows[0]["tokens_per_s"]
    print("| setting | tokens/s | vs the first | step s | host waited in acquire, s/step | GPU<-host, ->host GiB/step | NVML GPU memory |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f'| {r["label"]} (batch {r["batch"]} x {r.get("micro_batches", 1)}) | {r["tokens_per_s"]:.0f} | '
              f'{r["tokens_per_s"] / first:.2f}x | {r["step_seconds"]:.3f} | {r.get("acquire_wait_seconds", 0):.3f} | '
              f'{r.get("h2d_bytes", 0) / 2**30:.2f}, {r.get("d2h_bytes", 0) / 2**30:.2f} | {r["nvml"]} |')
PY
if [ -n "${PEERS:-}" ] && [ "${PEER_FROM_SWEEP:-0}" = 1 ] && [ -s "$out/sweep.jsonl" ]; then
  # The peer against our fastest setting of the sweep, not a guessed one.
  best=$(python3 -c "import json, sys; rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(max(rows, key=lambda r: r['tokens_per_s'])['label'])" "$out/sweep.jsonl")
  while IFS='|' read -r label batch flags daemon_flags; do
    if [ "$label" = "$best" ]; then PEER_BATCH=$batch; PEER_FLAGS=$flags; PEER_DAEMON_FLAGS=$daemon_flags; fi
  done <<< "${CONFIGS:-$default_configs}"
  echo "== the peer against the sweep's fastest: $best (batch $PEER_BATCH $PEER_FLAGS${PEER_DAEMON_FLAGS:+; tierd $PEER_DAEMON_FLAGS})"
fi
if [ -n "${PEERS:-}" ]; then
  env OUT="$work/peers" MODELS="$PEERS" NONE=0 PROFILE=0 BUDGETS="$budget" BATCH="${PEER_BATCH:-2}" STEPS="${STEPS:-8}" \
    SKIP=3 TORCH=1 TORCH_RUNS=float8 TORCH_BATCH="${TORCH_BATCH:-max}" TIERD_DRAM="${TIERD_DRAM:-32GiB}" \
    TIERD_DAEMON_FLAGS="${PEER_DAEMON_FLAGS:-}" TIERD_RUN_FLAGS="$base ${PEER_FLAGS:---grad_accum_steps=4 --step_order=micro --grad_checkpointing=dynamic}" \
    tools/bench/run_bench.sh > "$out/peers.txt" 2>&1 || status=1
  sed -n '/== table/,$p' "$out/peers.txt"
  grep -h 'this process .*GiB budget' "$work"/peers/ours-*.log
fi
exit $status
