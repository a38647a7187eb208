#!/usr/bin/env bash
# Runs on the lent GPU machine: a refactor that must not change a bit, checked on the GPU.
#   dev box: tools/device/bundle.sh; cp the binaries from before the change into .carry/before/
#   device run: command="tools/device/fingerprint_check.sh", carry=[".carry"]
# tools/loss_fingerprint.sh's GPU matrix (bf16, fp8, every optimizer, checkpointing, the model
# family, tierd budgets with the optimizer on either side, compact state, dynamic
# checkpointing) with the binaries from before (.carry/before) and after (.carry/bin), one
# line per run; then the same with the after binaries again (the runs' own repeatability).
# Exit 1 when before and after differ in any run.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
echo "== machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader)"
for which in before after again; do
  dir=.carry/bin; [ "$which" = before ] && dir=.carry/before
  start=$SECONDS
  tools/loss_fingerprint.sh "$dir/tierd-train" "$dir/tierd" gpu > "$out/fingerprint-$which.txt" 2> "$out/fingerprint-$which.err"
  echo "== $which ($dir): $(wc -l < "$out/fingerprint-$which.txt") runs, $(grep -c 'rc=0' "$out/fingerprint-$which.txt") finished, $((SECONDS - start)) s"
done
cut -c1-160 "$out/fingerprint-after.txt"
if diff "$out/fingerprint-before.txt" "$out/fingerprint-after.txt" > "$out/fingerprint-diff.txt"; then
  echo "PASS: before and after give the same losses and final checkpoints in every run"
else
  echo "FAIL: before and after differ:"; head -20 "$out/fingerprint-diff.txt"; rc=1
fi
if diff -q "$out/fingerprint-after.txt" "$out/fingerprint-again.txt" > /dev/null; then
  echo "PASS: after, run twice, is the same (the matrix is repeatable)"
else
  echo "NOTE: after, run twice, differs: the comparison above is no better than the runs' own repeatability"
fi
exit ${rc:-0}
