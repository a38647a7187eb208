#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry, made by tools/device/bundle.sh):
#   device run: command="tools/device/attention_check.sh", carry=[".carry"]
# cuDNN's fused attention in the trainer (--attention), checked:
#   1. without cuDNN on the library path --attention=auto falls back to ours, and the GPU
#      fingerprint matrix gives the bits of the binaries in .carry/before (when there);
#   2. with cuDNN: its kernels against the CPU reference (cudnn_attention_test, required);
#   3. training with cuDNN's attention against ours: 124M (12 heads of 64) and a grouped-query
#      shape (8 heads of 64, 2 key/value heads), 30 steps each, the largest loss difference;
#   4. kill -9 and --resume give the straight run's losses bit for bit with cuDNN's attention.
# At most 8 files in $OUT. Exit 1 if a check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
work=/var/tmp/attention-check; rm -rf "$work"; mkdir -p "$work"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
status=0
if [ -d .carry/before ]; then
  echo "== 1. without cuDNN: the fingerprint against .carry/before"
  OUT="$work/fp" tools/device/fingerprint_check.sh > "$out/fingerprint.log" 2>&1 || status=1
  grep -E '^(==|PASS|FAIL|NOTE)' "$out/fingerprint.log"
fi
source tools/device/cudnn_env.sh
echo "== 2. cudnn_attention_test"
TIERD_REQUIRE_CUDNN=1 .carry/bin/cudnn_attention_test > "$out/cudnn_attention_test.log" 2>&1 || status=1
grep -E 'cuDNN [0-9]|PASSED|FAILED|Failure|mismatch' "$out/cudnn_attention_test.log" | head -12
echo "== 3. training: cuDNN's attention against ours"
cat > "$work/gqa.json" <<'JSON'
{"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2,
 "intermediate_size": 1408, "vocab_size": 32000, "max_position_embeddings": 1024}
JSON
common="--device=gpu --batch_size=4 --seq_len=512 --steps=30 --warmup=3 --eval_every=-1"
: > "$out/training.txt"
for shape in "--model_size=124m" "--model_config=$work/gqa.json"; do
  name=$([ "$shape" = "--model_size=124m" ] && echo 124m || echo gqa)
  for attention in ours cudnn; do
    .carry/bin/tierd-train $common $shape --attention=$attention --metrics="$work/$name-$attention.jsonl" \
      > "$work/$name-$attention.log" 2>&1 || { echo "FAIL: $name --attention=$attention"; tail -n 5 "$work/$name-$attention.log"; }
    grep '^attention:' "$work/$name-$attention.log"
  done
  python3 - "$work/$name-ours.jsonl" "$work/$name-cudnn.jsonl" "$name" <<'PY' || echo "FAIL: $name: no losses to compare"
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if l.startswith('{"step"')]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(x - y) / x for x, y in zip(a, b))
ok = len(a) == len(b) == 30 and worst < 0.02 and b[-1] < b[0] - 0.5
print(f"{'PASS' if ok else 'FAIL'}: {sys.argv[3]}: {len(a)} steps, loss {a[0]:.4f} -> {a[-1]:.4f} (ours) and {b[0]:.4f} -> {b[-1]:.4f} (cuDNN); "
      f"largest relative difference {worst:.2e}")
PY
done 2>&1 | tee -a "$out/training.txt"
grep -q '^FAIL' "$out/training.txt" && status=1
echo "== 4. kill -9 and --resume with cuDNN's attention"
CHECKS=2 OUT="$work/resume" tools/device/trainer_check.sh > "$out/resume.log" 2>&1 || status=1
grep -E '^(PASS|FAIL)' "$out/resume.log"
grep -h '^attention:' "$work"/resume/*.log 2>/dev/null | sort | uniq -c
exit $status
