#!/usr/bin/env bash
# Runs on the lent GPU machine: issue 44's 7B target in one call (carry .carry from
# tools/python/bundle_python.sh; .whl with DeepSpeed's sdist and wheels for DEEPSPEED=1):
#   device run: command="tools/device/python_7b_check.sh", carry=[".carry"]
# transformers' LlamaForCausalLM at the 7B shape, bf16 weights, BATCH x 2048 tokens a step,
# activation checkpointing, by a plain PyTorch loop:
# 1. through tierd: tierd.torch.offload(model, units=each decoder layer) with a QUOTA GPU quota
#    for the weights and the 8-bit OffloadOptimizer (fp32 master on the host), no clipping;
#    COMPILE=1 compiles each layer; SHARE=F steps that share of the parameters on the GPU (their
#    state moved through the same QUOTA by tierd: raise TIERD_GPU and QUOTA with it); SHARE="0 F":
#    both runs, one after the other (0: all on the host); DETERMINISTIC=1: runs that repeat their bits
#    (deterministic algorithms, eager attention), so ours and the twin differ only where offloading
#    changed the arithmetic;
# 2. PyTorch FSDP2 + CPUOffloadPolicy, pure bf16 (fp32 state, ~108 GB, does not fit a 125 GiB
#    host), the same model, batch and checkpointing;
# 3. DEEPSPEED=1: DeepSpeed ZeRO-3 with parameters and optimizer offloaded, the same transformers
#    Llama (deepspeed_baseline.py --hf), or how it ended.
# Then one table: tokens/s, nvidia-smi's GPU memory over every process, and our ratio to each.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
batch="${BATCH:-4}"; steps="${STEPS:-20}"; status=0
# First the same loop without offload, the whole model on the GPU, for the losses of every step
# beside ours. LOSSES=twin (default): its optimizer is ours (8-bit AdamW, fp32 master) stepped wholly
# on the GPU (gpu_share=1, the host step's bits; ~54 GB of state in tierd's GPU tier, so tierd's
# GPU budget is raised to TWIN_GPU for the call): the same arithmetic, so the losses are ours to
# the bit where the forward and backward repeat theirs. LOSSES=1: fp32 weights under bf16 autocast
# and PyTorch's fused AdamW (~110 GB); from random weights under a warm-up learning rate the first
# updates are below a bf16 weight's spacing, where the fp32 run moves at once (session 34), so the
# two part at step 2. LOSSES=bf16: PyTorch's AdamW on bf16 weights (bf16 moments). LOSSES=0: none.
case "${LOSSES:-twin}" in
  twin) baseline=--baseline_twin; TIERD_GPU="${TIERD_GPU:-${TWIN_GPU:-72GiB}}" ;;
  1) baseline=--baseline_fp32 ;; bf16) baseline="" ;; *) baseline=--no_baseline ;;
esac
corpus=/tmp/tierd-7b-corpus.txt
find "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" -maxdepth 1 -name '*.py' | sort |
  xargs cat > "$corpus"
# One tierd session holds the weights (13.5 GB) and the optimizer's state and gradients (~54 GB):
# its DRAM quota must hold both, or tierd compacts DRAM on every acquire (2026-12-04, call4).
variants=""
for share in ${SHARE:-0}; do
  variants="$variants${variants:+,}adamw8bit:noclip:offload$([ "$share" = 0 ] || echo ":gpu=$share")"
done
SKIP_TESTS=1 BENCH=0 TIERD_GPU="${TIERD_GPU:-10GiB}" TIERD_DRAM="${TIERD_DRAM:-90GiB}" \
  BENCH2_FLAGS="--hf --model_size=7b --batch_size=$batch --checkpointing --steps=$steps --skip=2 --warmup=${WARMUP:-10} --bf16 $baseline \
  --variants=$variants --dram=${SESSION_DRAM:-80GiB} --gpu_quota=${QUOTA:-8GiB} ${COMPILE:+--compile_layers} \
  ${DETERMINISTIC:+--deterministic}" \
  AFTER="timeout ${PEER_TIMEOUT:-400} python3 tools/bench/fsdp2_baseline.py --hf --bf16 --model_size=7b --batch_size=$batch \
  --checkpointing --steps=4 --timing_skip=1 --warmup=${WARMUP:-10} --data=$corpus > $out/fsdp2.raw 2>&1; \
  echo \$? > $out/fsdp2.exit; grep -v Warn $out/fsdp2.raw | tee $out/fsdp2.log | tail -n 5" \
  tools/device/python_check.sh || status=1
if [ "${DEEPSPEED:-0}" = 1 ]; then  # DeepSpeed ZeRO-3, parameters and optimizer offloaded, the same transformers Llama
  free -g | head -n 2
  if ! python3 -c "import deepspeed" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target /tmp/site \
      .whl/*.whl .whl/deepspeed-*.tar.gz && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  fi
  timeout "${PEER_TIMEOUT:-400}" python3 tools/bench/deepspeed_baseline.py --hf --model_size=7b --micro_batch="$batch" \
    --stage=3 --steps=4 --timing_skip=1 --data="$corpus" > "$out/deepspeed.log" 2>&1
  code=$?; echo "$code" > "$out/deepspeed.exit"
  echo "deepspeed: exit $code (137: killed, as by the OOM killer; 124: out of time)"; grep -v Warn "$out/deepspeed.log" | tail -n 4
  free -g | head -n 2
fi
python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
rows = []
bench2 = open(f"{out}/bench2.log").read()
base = re.search(r"^(?:PyTorch fused AdamW on the GPU|the same loop without offload).*?: ([\d,]+) tokens/s.*?([\d.]+) GiB "
                 r"every process", bench2, re.M)
ours = re.findall(r"^tierd OffloadOptimizer (\S+?): ([\d,]+) tokens/s.*?([\d.]+) GiB every process", bench2, re.M)
for variant, tps, gib in ours:
    share = variant.partition("gpu=")[2]
    rows.append((f"tierd (offload + 8-bit OffloadOptimizer{f', {share} of it stepped on the GPU' if share else ''})",
                 float(tps.replace(",", "")), float(gib)))
best = max((r[1] for r in rows), default=None)
for name, path in (("FSDP2 CPU offload, pure bf16", "fsdp2.log"), ("DeepSpeed ZeRO-3 offload", "deepspeed.log")):
    try:
        line = [l for l in open(f"{out}/{path}") if l.startswith("{")][-1]
        r = json.loads(line)
        rows.append((name, r["tokens_per_s"], r.get("nvml_all_mib", float("nan")) / 1024))
    except (OSError, IndexError):
        try:
            code = int(open(f"{out}/{path.split('.')[0]}.exit").read())
            how = {137: "killed (the OOM killer?)", 124: "out of time"}.get(code, "failed")
            rows.append((f"{name}: {how}, exit {code}", None, None))
        except (OSError, ValueError):
            rows.append((name, None, None))
if base:
    if base.group(0).startswith("the same loop"):
        what = "the same loop without offload, whole GPU, our 8-bit AdamW stepped there (gpu_share=1)"
    else:
        weights = "fp32 weights + bf16 autocast" if "(fp32 weights)" in base.group(0) else "bf16 weights (bf16 moments)"
        what = f"PyTorch without offload, {weights}, fused AdamW, whole GPU"
    rows.append((what, float(base.group(1).replace(",", "")), float(base.group(2))))
print("| run (7B, the same call) | tokens/s | GPU GiB, every process | our best against it |")
print("|---|---|---|---|")
for i, (name, tps, gib) in enumerate(rows):
    ratio = f"{best / tps:.2f}x" if ours and tps and i >= len(ours) else "-"
    print(f"| {name} | {f'{tps:,.0f}' if tps else 'no result'} | {f'{gib:.1f}' if gib else '-'} | {ratio} |")
for line in re.findall(r"^ratio: .*", bench2, re.M):
    print(line)
PY
exit $status
