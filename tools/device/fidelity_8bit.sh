#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry, made by tools/device/bundle.sh):
#   device run: command="tools/device/fidelity_8bit.sh", carry=[".carry"]
# The fidelity of 8-bit blockwise moments at 1.3B (a benchmark row of docs/BENCHMARKS.md): the same run
# twice — the Python-stdlib corpus, the same seed and data order, $STEPS steps (300) of
# $BATCH (4) x 2048 tokens, the whole model on the GPU — with fp32 AdamW and with
# --opt=adamw8bit; prints both runs' mean training loss over the last 50 steps and their
# ratio. MODEL overrides 1.3b. Logs and per-step metrics (JSONL) in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
model="${MODEL:-1.3b}"; steps="${STEPS:-300}"; batch="${BATCH:-4}"
corpus=/tmp/tierd-bench-corpus; mkdir -p "$corpus"
py_lib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$py_lib" -maxdepth 1 -name '*.py' | sort | xargs cat > "$corpus/stdlib.txt"
for opt in adamw adamw8bit; do
  echo "== $model, $steps steps, --opt=$opt"
  .carry/bin/tierd-train --device=gpu --model_size="$model" --batch_size="$batch" --seq_len=2048 --steps="$steps" \
    --data="$corpus" --opt="$opt" --metrics="$out/metrics-$opt.jsonl" > "$out/fidelity-$opt.log" 2>&1
  echo "exit $?"; grep -E '^done' "$out/fidelity-$opt.log"
done
python3 - "$out" <<'PY'
import json, sys
def last50(path):
    losses = [json.loads(l)["loss"] for l in open(path) if l.strip()]
    return sum(losses[-50:]) / len(losses[-50:]), len(losses)
a, n = last50(sys.argv[1] + "/metrics-adamw.jsonl")
b, m = last50(sys.argv[1] + "/metrics-adamw8bit.jsonl")
print(f"mean training loss, last 50 of {n} / {m} steps: fp32 AdamW {a:.4f}, 8-bit {b:.4f} ({100 * (b - a) / a:+.2f}%)")
PY
