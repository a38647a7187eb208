#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry, and .whl with torchao for the peer):
#   device run: command="tools/device/big_models_check.sh", carry=[".carry", ".whl"]
# The large models side by side in one call, each in a GPU budget of BUDGET (default 23.5GiB:
# issue 43's bound on nvidia-smi's figure for every process) with FP8 and 8-bit
# AdamW, layer-major with checkpointing: 7B (4 x 8 micro-batches, BENCHMARKS row B's settings)
# beside torchao float8 + torch.compile with the whole GPU (PEER=0: not), then 13B as row E
# (4 x 3) and 13B over 6 micro-batches with its checkpoints kept in bf16
# (--checkpoint_precision=bf16: the same 18.8 GiB of saved inputs for twice the tokens). Prints
# each run's tokens/s and TFLOP/s (6N), 13B's against 7B's, 7B's against the peer. EXTRA: flags
# added to every run of ours (default --attention=cudnn-fast, PyTorch's own kind of attention).
# RUNS13: the 13B runs, "name=accum:flags;..." (default "k3=3:;k6bf16=6:--checkpoint_precision=bf16";
# "none": 7B alone). RUNS7: more 7B runs after b7, "name=flags;..." (each against the peer too).
# TRAINER_BINS="name=path;...": those runs with that trainer binary (e.g.
# "old7=.carry/bin/tierd-train-old", the trainer before a change, side by side).
set -uo pipefail
cd "$(dirname "$0")/../.."
final="${OUT:-/tmp/tierd-out}"; mkdir -p "$final"
work=/tmp/big-models; rm -rf "$work"; mkdir -p "$work/logs"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
source tools/device/cudnn_env.sh
echo "== machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader); $(free -g | awk '/Mem:/{print $2}') GiB host memory"
flags="--grad_checkpointing --step_order=layer --opt=adamw8bit --precision=fp8 ${EXTRA:---attention=cudnn-fast}"
status=0
run() {  # name, model, accum, DRAM, torch (0/1), flags
  local name=$1 model=$2 accum=$3 dram=$4 torch=$5 extra=$6 trainer=.carry/bin/tierd-train t
  IFS=';' read -ra trainer_bins <<< "${TRAINER_BINS:-}"
  for t in "${trainer_bins[@]}"; do [ "${t%%=*}" = "$name" ] && trainer="${t#*=}"; done
  env TIERD_TRAIN_BIN="$trainer" OUT="$work/$name" MODELS="$model" TORCH="$torch" TORCH_RUNS=float8 TORCH_BATCH=2 NONE=0 PROFILE=0 BUDGETS="${BUDGET:-23.5GiB}" \
    TIERD_DRAM="$dram" TIERD_NVME=40GiB BATCH=4 STEPS="${STEPS:-6}" SKIP="${SKIP:-2}" \
    OURS_FLAGS="--grad_accum_steps=$accum $flags $extra" tools/bench/run_bench.sh > "$work/logs/bench-$name.txt" 2>&1 || status=1
  cp "$work/$name"/ours-*.log "$work/logs/ours-$name.log" 2>/dev/null
  cp "$work/$name"/tierd-*.log "$work/logs/tierd-$name.log" 2>/dev/null
  echo "== $name: $model, $accum micro-batches, $extra ($trainer)"
  grep -hE '^(state|activations|done): |^\s+activations ' "$work/logs/ours-$name.log" | cut -c1-400
  grep -hE '^\{"run": "pytorch' "$work/logs/bench-$name.txt" | cut -c1-300
}
peer="${PEER:-1}"
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$peer" = 1 ] && [ "${gpu_mib:-0}" -lt 110000 ]; then  # torchao's 7B at batch 2 holds ~101 GiB
  echo "== the peer is not run: torchao float8 + compile's 7B at batch 2 needs ~101 GiB, this GPU has $gpu_mib MiB"
  peer=0
fi
run b7 7b 8 64GiB "$peer" ""
names=(b7)
IFS=';' read -ra runs7 <<< "${RUNS7:-}"
for r in "${runs7[@]}"; do
  run "${r%%=*}" 7b 8 64GiB 0 "${r#*=}"
  names+=("${r%%=*}")
done
export SEVEN_B="${names[*]}"
IFS=';' read -ra runs13 <<< "${RUNS13:-k3=3:;k6bf16=6:--checkpoint_precision=bf16}"
[ "${RUNS13:-}" = none ] && runs13=()
for r in "${runs13[@]}"; do
  name="${r%%=*}"; spec="${r#*=}"
  run "$name" 13b "${spec%%:*}" 100GiB 0 "${spec#*:}"
  names+=("$name")
done
python3 - "$work/logs" "${names[@]}" <<'PY'
import json, os, sys
sys.path.insert(0, "tools/device")
from ours_results import load
logs, names = sys.argv[1], sys.argv[2:]
rows, peer = load(logs, names), None
for name in names:
    try:
        for line in open(f"{logs}/bench-{name}.txt"):
            if line.startswith('{"run": "pytorch'):
                peer = json.loads(line)
    except OSError:
        pass
for name, r in rows.items():
    print(f"{name}: {r['model']}, {r['micro_batches']} x {r['batch']} x 2048, {r['tokens_per_s']:,.0f} tokens/s, "
          f"{r['tflops_6n']:.0f} TFLOP/s (6N), PCIe in {r['h2d_bytes'] / 1e9:.0f} GB, out {r['d2h_bytes'] / 1e9:.0f} GB a "
          f"step of {r['step_seconds']:.2f} s, the host waited in acquire {r['acquire_wait_seconds']:.2f} s; "
          f"device {r['device_bytes'] / 2**30:.1f} GiB (NVML, every process)")
seven = os.environ["SEVEN_B"].split()
for name in seven:
    if peer and name in rows:
        print(f"7B {name}: {rows[name]['tokens_per_s'] / peer['tokens_per_s']:.3f}x {peer['run']} ({peer['tokens_per_s']:,.0f} "
              f"tokens/s, batch {peer['batch']}, the whole GPU)")
for name in names:
    if name not in seven and name in rows and "b7" in rows:
        print(f"13B {name}: {rows[name]['tflops_6n'] / rows['b7']['tflops_6n']:.3f}x 7B's TFLOP/s (6N)")
PY
tar czf "$final/big-models.tgz" -C "$work" logs
exit $status
