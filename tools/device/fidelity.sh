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
# A run's name may say which binary of .carry/bin trains it: "b256@tierd-train-b256:--opt=adamw8bit"
# (a build variant beside the default one, in the same call).
# NOISE names the run that differs from the first only in its data order (the noise floor).
# Logs and per-step metrics (JSONL) in $OUT, packed into $OUT/fidelity.tgz (PACK=0: loose);
# the table and plot by tools/fidelity_report.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
model="${MODEL:-1.3b}"; steps="${STEPS:-300}"; batch="${BATCH:-4}"
runs="${RUNS:-adamw:--opt=adamw adamw8bit:--opt=adamw8bit}"
# CORPUS=all: every .py under the standard library but its tests and installed packages, recursively (~12 MB with
# Python 3.11: 1000 steps of 8k tokens stay under one epoch), in a folder of its own; the
# default is the top folder (~4.7 MB: 1000 steps see it almost twice).
corpus=/tmp/tierd-bench-corpus; [ "${CORPUS:-top}" = all ] && corpus=/tmp/tierd-bench-corpus-all
mkdir -p "$corpus"
py_lib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
depth=(-maxdepth 1); [ "${CORPUS:-top}" = all ] && depth=()
find "$py_lib" "${depth[@]}" -name '*.py' -not -path '*/test*' -not -path '*-packages/*' | sort | xargs cat > "$corpus/stdlib.txt"
echo "== corpus: $(du -h "$corpus/stdlib.txt" | cut -f1) of Python sources (CORPUS=${CORPUS:-top})"
names=()
for run in $runs; do
  name="${run%%:*}"; flags="${run#*:}"
  binary=tierd-train; [[ "$name" == *@* ]] && binary="${name#*@}" && name="${name%%@*}"
  names+=("$name")
  echo "== $model, $steps steps, $name (${flags//,/ }; .carry/bin/$binary)"
  # shellcheck disable=SC2086  # the flags are words
  ".carry/bin/$binary" --device=gpu --model_size="$model" --batch_size="$batch" --seq_len=2048 --steps="$steps" \
    --data="$corpus" --eval_every="${EVAL_EVERY:-100}" ${WARMUP:+--warmup=$WARMUP} --metrics="$out/metrics-$name.jsonl" ${flags//,/ } > "$out/fidelity-$name.log" 2>&1
  echo "exit $?"; grep -E '^(done|precision)' "$out/fidelity-$name.log"
done
specs=(); for name in "${names[@]}"; do specs+=("$name=$out/metrics-$name.jsonl"); done
# The table (and, where matplotlib is installed, the curves); the first run is the baseline.
png=(); python3 -c 'import matplotlib' 2>/dev/null && png=(--png="$out/fidelity.png")
python3 tools/fidelity_report.py ${NOISE:+--noise=$NOISE} "${png[@]}" "${specs[@]}"
# The device brings back at most 8 files a call: the logs, metrics and plot go in one archive
# (PACK=0 leaves them loose).
if [ "${PACK:-1}" != 0 ]; then
  files=()  # those there are (a run that failed has no metrics)
  for name in "${names[@]}"; do
    for f in "fidelity-$name.log" "metrics-$name.jsonl"; do [ -f "$out/$f" ] && files+=("$f"); done
  done
  [ -f "$out/fidelity.png" ] && files+=(fidelity.png)
  tar czf "$out/fidelity.tgz" -C "$out" "${files[@]}" && (cd "$out" && rm -f "${files[@]}") &&
    echo "logs, metrics and plot: $out/fidelity.tgz"
fi
