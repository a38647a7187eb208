#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry, made by tools/device/bundle.sh):
#   device run: command="tools/device/fidelity.sh", carry=[".carry"]
# Training fidelity at 1.3B (benchmark rows of docs/BENCHMARKS.md): the same run several
# ways — the Python-stdlib corpus, the same seed and data order, $STEPS steps (300) of
# $BATCH (4) x 2048 tokens, the whole model on the GPU — one per entry of RUNS ("name:flags",
# flags comma-separated; default fp32 AdamW against --opt=adamw8bit); prints each run's mean
# training loss over the last 50 steps and final validation loss (8 held-out batches), and
# their differences from the first run's. MODEL
# overrides 1.3b; WARMUP sets --warmup (default: the trainer's 10 steps, where the loss spikes
# early and two runs part for good). E.g. RUNS="bf16: fp8:--precision=fp8". The noise alone:
# RUNS="bf16: bf16-data2:--data_seed=2 fp8:--precision=fp8 fp8-data2:--precision=fp8,--data_seed=2"
# (another data order, the same initial weights): a precision's effect is what exceeds that spread.
# Logs and per-step metrics (JSONL) in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
model="${MODEL:-1.3b}"; steps="${STEPS:-300}"; batch="${BATCH:-4}"
runs="${RUNS:-adamw:--opt=adamw adamw8bit:--opt=adamw8bit}"
corpus=/tmp/tierd-bench-corpus; mkdir -p "$corpus"
py_lib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$py_lib" -maxdepth 1 -name '*.py' | sort | xargs cat > "$corpus/stdlib.txt"
names=()
for run in $runs; do
  name="${run%%:*}"; flags="${run#*:}"; names+=("$name")
  echo "== $model, $steps steps, $name (${flags//,/ })"
  # shellcheck disable=SC2086  # the flags are words
  .carry/bin/tierd-train --device=gpu --model_size="$model" --batch_size="$batch" --seq_len=2048 --steps="$steps" \
    --data="$corpus" --eval_every="${EVAL_EVERY:-100}" ${WARMUP:+--warmup=$WARMUP} --metrics="$out/metrics-$name.jsonl" ${flags//,/ } > "$out/fidelity-$name.log" 2>&1
  echo "exit $?"; grep -E '^(done|precision)' "$out/fidelity-$name.log"
done
python3 - "$out" "${names[@]}" <<'PY'
import json, sys
def read(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return [r["loss"] for r in rows if "loss" in r], [r["validation_loss"] for r in rows if "validation_loss" in r]
def last50(path):
    losses, val = read(path)
    return sum(losses[-50:]) / len(losses[-50:]), len(losses), val[-1] if val else float("nan")
out, names = sys.argv[1], sys.argv[2:]
base, n, base_val = last50(f"{out}/metrics-{names[0]}.jsonl")
print(f"mean training loss over the last 50 of {n} steps, final validation loss: {names[0]} {base:.4f}, {base_val:.4f}")
for name in names[1:]:
    loss, m, val = last50(f"{out}/metrics-{name}.jsonl")
    print(f"  {name} {loss:.4f} ({100 * (loss - base) / base:+.2f}%), validation {val:.4f} "
          f"({100 * (val - base_val) / base_val:+.2f}% of {names[0]}'s; {m} steps)")
PY
