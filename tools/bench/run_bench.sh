#!/usr/bin/env bash
# The benchmark harness of issue 6, on the lent GPU machine (carry .carry, made by
# tools/device/bundle.sh):  device run: command="tools/bench/run_bench.sh", carry=[".carry"]
# Same call, same shapes (Llama-style, sequence 2048), same text (the bytes of Python's
# standard library sources, on every machine with Python): the PyTorch baseline (bf16
# autocast + fused AdamW, with and without activation checkpointing) and our trainer with
# --offload_policy=none (tierd-train-gpu). One table at the end; logs in $OUT.
# MODELS, BATCH, STEPS override the defaults; TORCH_CKPT=" " skips the checkpointed baseline.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
models="${MODELS:-1.3b}"; batch="${BATCH:-8}"; steps="${STEPS:-8}"; seq=2048
corpus=/tmp/tierd-bench-corpus; mkdir -p "$corpus"
py_lib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$py_lib" -maxdepth 1 -name '*.py' | sort | xargs cat > "$corpus/stdlib.txt"
echo "== machine: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader); corpus $(du -h "$corpus/stdlib.txt" | cut -f1)"
results="$out/bench.jsonl"; : > "$results"
for m in $models; do
  for ckpt in "" ${TORCH_CKPT:-"--checkpointing"}; do
    echo "== pytorch $m $ckpt"
    python3 tools/bench/torch_baseline.py --model_size="$m" --batch_size="$batch" --seq_len=$seq --steps="$steps" \
      --data="$corpus/stdlib.txt" $ckpt 2>&1 | tee "$out/torch-$m$ckpt.log" | tail -n 3
    tail -n 1 "$out/torch-$m$ckpt.log" | grep '^{' >> "$results"
  done
  echo "== tierd-train-gpu $m (--offload_policy=none)"
  .carry/bin/tierd-train-gpu --model_size="$m" --batch_size="$batch" --seq_len=$seq --steps="$steps" \
    --timing_skip=3 --data="$corpus" --profile 2>&1 | tee "$out/ours-$m.log" | tail -n 4
  grep '^done:' "$out/ours-$m.log" | sed -E 's/.*final loss ([0-9.]+), ([0-9]+) tokens\/s.*, ([0-9]+) TFLOP\/s.*GPU memory (.*)$/{"run": "ours none", "model": "'"$m"'", "final_loss": \1, "tokens_per_s": \2, "tflops_6n": \3, "gpu_memory": "\4"}/' >> "$results"
done
echo "== table"
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {r["model"]: r["tokens_per_s"] for r in rows if r["run"] == "pytorch"}
print("| model | run | peak GPU memory | tokens/s | vs PyTorch | TFLOP/s (6N) | loss after the run |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    mem = r.get("gpu_memory") or f'{r["peak_alloc_bytes"] / 2**30:.1f} GiB'
    ratio = r["tokens_per_s"] / base[r["model"]] if base.get(r["model"]) else float("nan")
    print(f'| {r["model"]} | {r["run"]} | {mem} | {r["tokens_per_s"]:.0f} | {ratio:.2f}x | {r["tflops_6n"]:.0f} | {r["final_loss"]:.3f} |')
PY
