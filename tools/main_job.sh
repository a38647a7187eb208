#!/usr/bin/env bash
# The main job's run, on binaries already built: tools/main_job.sh BIN_DIR [trainer flags]
# (BIN_DIR is bazel-bin, or a folder holding tierd, tierd-train and tierctl, as .carry/bin).
# Starts tierd with small budgets, trains the reference model with every parameter, gradient,
# optimizer moment and saved activation leased from it, its step registered with tierd's
# planner, prints progress and a summary with tierd's stats, draws the run, stops tierd.
#   On a usable GPU: model 350m (~6 GiB of training state) in a 2 GiB GPU budget, the rest
#     in tierd's DRAM tier (12 GiB quota), so every step streams layers through PCIe.
#   Otherwise: the tiny model on the CPU in a 4 MiB DRAM quota (below the ~5 MiB the step
#     touches), so tensors move through NVMe every step.
# TIERD_METRICS / TIERD_PLOT say where the metrics JSONL and the PNG go.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=${1:?usage: tools/main_job.sh BIN_DIR [trainer flags]}; shift
find_bin() {  # bazel-bin/<package>/<name> or BIN_DIR/<name>
  for p in "$bin_dir/$1" "$bin_dir/$(basename "$1")"; do [ -x "$p" ] && { echo "$p"; return; }; done
  echo "main_job: no $1 under $bin_dir" >&2; exit 1
}
tierd=$(find_bin server/tierd); train=$(find_bin trainer_ref/tierd-train); tierctl=$(find_bin tools/tierctl/tierctl)
device=$("$train" --print_device)
work="${TMPDIR:-/tmp}/tierd-main-$$"
mkdir -p "$work/nvme"
metrics="${TIERD_METRICS:-/tmp/tierd-train-metrics.jsonl}"; plot="${TIERD_PLOT:-/tmp/tierd-train.png}"
rm -f "$metrics"
if [ "$device" = gpu ]; then
  echo "== starting tierd on the GPU (GPU 4 GiB, DRAM 16 GiB, NVMe 8 GiB under $work)"
  daemon_flags=(--gpu=cuda --gpu_bytes=4GiB --dram_bytes=16GiB --nvme_bytes=8GiB)
  train_flags=(--model_size=350m --batch_size=8 --seq_len=512 --steps=100 --grad_checkpointing --gpu_budget=2GiB
               --tierd_dram=12GiB --tierd_nvme=4GiB)
else
  echo "== starting tierd (fake GPU: no usable CUDA GPU here; DRAM 64 MiB, NVMe 512 MiB under $work)"
  daemon_flags=(--gpu=fake --gpu_bytes=64MiB --dram_bytes=64MiB --nvme_bytes=512MiB)
  train_flags=(--tierd_dram=4MiB --tierd_nvme=64MiB --steps=300 --eval_every=100)
fi
"$tierd" "${daemon_flags[@]}" --nvme_dir="$work/nvme" --runtime_dir="$work/run" > "$work/tierd.log" 2>&1 &
tierd_pid=$!
stop() { kill -TERM "$tierd_pid" 2>/dev/null && wait "$tierd_pid" 2>/dev/null; rm -rf "$work"; }
trap stop EXIT
# Ready when it says so (its log is flushed then; the socket appears a little earlier).
for _ in $(seq 300); do grep -q '^tierd: ready' "$work/tierd.log" && break; kill -0 "$tierd_pid" 2>/dev/null || break; sleep 0.1; done
grep -q '^tierd: ready' "$work/tierd.log" || { cat "$work/tierd.log"; echo "tierd did not start"; exit 1; }
grep '^tierd:' "$work/tierd.log" | head -6 || true
echo "== training (tierd-train --offload_policy=tierd ${train_flags[*]} $*)"
"$train" --offload_policy=tierd --tierd_dir="$work/run" "${train_flags[@]}" --metrics="$metrics" --plot="$plot" "$@"
echo "== tierd after the run"
"$tierctl" --runtime_dir="$work/run" stats | head -20
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 tools/plot_metrics.py "$metrics" "${plot%.png}-matplotlib.png" && echo "matplotlib plot: ${plot%.png}-matplotlib.png"
fi
echo "metrics: $metrics; plot: $plot"
