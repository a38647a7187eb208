#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry, made by tools/device/bundle.sh):
#   device run: command="tools/device/comm_check.sh", carry=[".carry"]
# Data-parallel GPU ranks, as far as the machine's GPUs allow, each with a verdict line:
#   1. every NCCL collective on one rank (nccl_collectives_check);
#   2. with two GPUs or more: every collective on each GPU count up to 4, under torchrun;
#      with one: two ranks under torchrun end with NCCL's refusal of a shared GPU, not a hang;
#   3. with two GPUs or more: tierd-train on 2 ranks x 1 micro-batch gives the losses of one
#      process over 2 micro-batches (the same global batch), to 1e-4 relative; and the rank
#      count's speed (tokens/s of 2 ranks against 1 process's) at the model of $MODEL (350m).
# NCCL is pip's (nvidia-nccl-cu13) where no system one is found. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
nccl_lib=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0] + "/lib")' 2>/dev/null || true)
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${nccl_lib}:${LD_LIBRARY_PATH:-}"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
echo "== machine: $gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
pass=0; fail=0
verdict() { if [ "$2" = 0 ]; then pass=$((pass+1)); echo "PASS: $1"; else fail=$((fail+1)); echo "FAIL: $1"; fi; }
port=$((29600 + RANDOM % 300))

.carry/bin/nccl_collectives_check > "$out/nccl-1.log" 2>&1
rc_=$?
verdict "1 rank: $(tail -n 1 "$out/nccl-1.log")" $rc_

if [ "$gpus" -ge 2 ]; then
  for n in 2 4; do
    [ "$n" -le "$gpus" ] || continue
    timeout 300 torchrun --nproc_per_node="$n" --master_port=$((port += 2)) --no-python .carry/bin/nccl_collectives_check \
      > "$out/nccl-$n.log" 2>&1
    ok=$(grep -c " 0 failed" "$out/nccl-$n.log")
    [ "$ok" = "$n" ]; verdict "$n ranks under torchrun: $ok of $n report 0 failed" $?
  done
else
  timeout 120 torchrun --nproc_per_node=2 --master_port=$((port += 2)) --no-python .carry/bin/nccl_collectives_check \
    > "$out/nccl-2-on-1.log" 2>&1
  rc=$?
  [ "$rc" != 124 ] && grep -q "ncclCommInitRank" "$out/nccl-2-on-1.log"
  rc_=$?
  verdict "2 ranks on 1 GPU end with NCCL's refusal, not a hang (exit $rc): $(grep -m1 -o 'ncclCommInitRank: .*' "$out/nccl-2-on-1.log" | cut -c1-120)" $rc_
fi

if [ "$gpus" -ge 2 ]; then
  bin=.carry/bin/tierd-train; d=/tmp/comm-check; rm -rf "$d"; mkdir -p "$d"
  # bf16: FP8 scales are each rank's own (from its micro-batches only), so FP8 would differ by rounding
  common="--device=gpu --model_size=tiny --precision=bf16 --steps=20 --eval_every=-1 --batch_size=4 --seq_len=128"
  $bin $common --grad_accum_steps=2 --metrics="$d/one.jsonl" > "$out/dp-one.log" 2>&1
  timeout 300 torchrun --nproc_per_node=2 --master_port=$((port += 2)) --no-python $bin $common --grad_accum_steps=1 \
    --metrics="$d/two.jsonl" > "$out/dp-two.log" 2>&1
  python3 - "$d/one.jsonl" "$d/two.jsonl" > "$out/dp-compare.log" 2>&1 <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
print(f"{len(a)} and {len(b)} steps; worst relative loss difference {worst:.2e}")
sys.exit(0 if worst < 1e-4 else 1)
PY
  rc_=$?
  verdict "2 ranks x 1 micro-batch = 1 process x 2: $(cat "$out/dp-compare.log")" $rc_
  model="${MODEL:-350m}"
  common="--device=gpu --model_size=$model --steps=8 --timing_skip=3 --eval_every=-1 --batch_size=4 --grad_accum_steps=2"
  $bin $common > "$out/speed-one.log" 2>&1
  timeout 300 torchrun --nproc_per_node=2 --master_port=$((port += 2)) --no-python $bin $common > "$out/speed-two.log" 2>&1
  one=$(grep -o '[0-9]* tokens/s over' "$out/speed-one.log" | cut -d' ' -f1)
  two=$(grep -o '[0-9]* tokens/s over' "$out/speed-two.log" | cut -d' ' -f1)
  echo "speed ($model, 4 x 2 micro-batches a rank): 1 process ${one:-?} tokens/s, 2 ranks ${two:-?} tokens/s" \
       "($(python3 -c "print(f'{${two:-0}/max(${one:-1},1):.2f}x')"))"
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
