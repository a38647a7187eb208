#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry with tierd, tierd-train and gpu_trainer_tierd_test):
#   device run: command="tools/device/split_check.sh", carry=[".carry"]
# --optimizer_place=split (the last groups stepped on the host in tierd's DRAM, the rest on the
# GPU before each group's next forward) against the default (every group on the GPU before its
# next forward, the state that does not fit streaming through PCIe), one after the other in this
# call: MODEL (default 1.3b) in a BUDGET (default 23.5GiB) budget with BENCHMARKS row C2's flags (fp8, 8-bit AdamW,
# 4 micro-batches of 2, cuDNN's attention), profiled. First the split's GPU tests (TESTS=0: not);
# RESUME=1 adds trainer_check.sh's kill -9 and --resume pairs (check 2, a split among them).
# RUNS: "name=flags;..." (default "gpu=--optimizer_place=gpu;split=--optimizer_place=split"; the
# first is the baseline each other run's ratio is to), e.g. with
# "codes=--optimizer_place=gpu --fp8_weight_codes" (the GPU's optimizer writes the codes). A name
# "name@path" runs that tierd binary (e.g. "old@.carry/bin/tierd-old=--optimizer_place=gpu": the
# daemon before a change, side by side). DAEMON_RUN_FLAGS="name=flags;..." gives those runs' tierd
# daemons flags of their own (e.g. "lead1=--planner_load_lead_ops=1"). DUMP_GRAPH_AT=N: each
# run's graph as tierd planned it, at step N (logs/graph-NAME.yaml; planreplay --graph replays it).
# EXTRA: flags added to every run (BENCHMARKS row H0's: "--grad_checkpointing=dynamic
# --attention=cudnn-fast"). UNPROFILED="name ...": those runs without --profile's CUDA events
# around each kernel (~10% of a 1.3B step), for a throughput to quote. PEER=1 (carry .whl too) first runs torchao float8 + torch.compile,
# batch 8, the whole GPU, and prints each run's ratio to it: the issue's peer in the same call;
# PEER_PROFILE=1: its time split by kernel class too (torch.profiler, on an extra step after the timed ones).
# TRAINER_BINS="name=path;...": those runs with that trainer binary (e.g.
# "old=.carry/bin/tierd-train-old", the trainer before a change, side by side). BATCHES="name=4;...":
# those runs at that micro-batch (default 2; give the run --grad_accum_steps to keep the step's tokens).
# KPROF="name ...": those runs under tools/kernel_profile (CUPTI; its tables, kernel by kernel,
# a step's share each, in logs/kprof-NAME/; a few % slower: not a throughput to quote). Bundle
# with BUNDLE_KPROF=1 for it. KPROF_HOST=1 in the environment: the profile also says which gaps
# between kernels the host caused (tools/kernel_profile/kernel_profile.cc).
set -uo pipefail
cd "$(dirname "$0")/../.."
final="${OUT:-/tmp/tierd-out}"; mkdir -p "$final"
work=/tmp/split-check; rm -rf "$work"; mkdir -p "$work/logs"
out="$work/logs"  # tarred into $OUT/split-check.tgz at the end: the device returns 8 files at most
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
source tools/device/cudnn_env.sh
model="${MODEL:-1.3b}"; status=0
echo "== machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader)"
if [ "${TESTS:-1}" = 1 ]; then
  mkdir -p /var/tmp/tierd-test
  TIERD_BIN=.carry/bin/tierd TEST_TMPDIR=/var/tmp/tierd-test timeout 200 .carry/bin/gpu_trainer_tierd_test \
    --gtest_filter='*Split*:*OnTheHostTracks*:*EightBitMomentsOnTheHost*:*FP8WeightCodes*' > "$out/split_test.log" 2>&1 || status=1
  grep -E '^\[ *(OK|FAILED|PASSED) |Failure|Expected|Which is|planned' "$out/split_test.log" | cut -c1-300 | head -n 30
fi
if [ "${RESUME:-0}" = 1 ]; then
  OUT="$work/resume" CHECKS=2 tools/device/trainer_check.sh > "$out/resume.log" 2>&1 || status=1
  grep -E '^(PASS|FAIL|optimizer: split)' "$out/resume.log"
fi
budget="${BUDGET:-23.5GiB}"  # issue 43: nvidia-smi's figure for every process <= 23.5 GiB
flags="--grad_accum_steps=4 --step_order=micro --opt=adamw8bit --precision=fp8 --attention=auto ${EXTRA:-}"
if [ "${PEER:-0}" = 1 ]; then
  env OUT="$work/peer" MODELS="$model" NONE=0 BUDGETS="" STEPS="${STEPS:-8}" SKIP=3 PROFILE="${PEER_PROFILE:-0}" TORCH=1 TORCH_RUNS=float8 \
    TORCH_BATCH=8 tools/bench/run_bench.sh > "$out/bench-peer.txt" 2>&1 || status=1
  grep -hE '^\{"run": "pytorch' "$out/bench-peer.txt" | tail -n 1 | tee "$work/peer.json"
fi
# Each run: a name and its flags (RUNS="name=flags;name=flags"; the first is the baseline).
runs="${RUNS:-gpu=--optimizer_place=gpu;split=--optimizer_place=split}"
IFS=';' read -ra run_list <<< "$runs"
names=()
for run in "${run_list[@]}"; do
  name="${run%%=*}"; extra="${run#*=}"; bin=.carry/bin/tierd
  if [[ "$name" == *@* ]]; then
    # Under the name tierd: the trainer finds the daemon's GPU memory (NVML) by process name.
    name_bin="${name#*@}"; name="${name%%@*}"
    mkdir -p "$work/bin-$name"; cp "$name_bin" "$work/bin-$name/tierd"; bin="$work/bin-$name/tierd"
  fi
  names+=("$name")
  daemon_flags="${TIERD_DAEMON_FLAGS:-}"
  IFS=';' read -ra daemon_runs <<< "${DAEMON_RUN_FLAGS:-}"
  for d in "${daemon_runs[@]}"; do [ "${d%%=*}" = "$name" ] && daemon_flags="$daemon_flags ${d#*=}"; done
  profile=1; [[ " ${UNPROFILED:-} " == *" $name "* ]] && profile=0
  kprof=()
  if [[ " ${KPROF:-} " == *" $name "* ]] && [ ! -f .carry/lib/libkernel_profile.so ]; then
    echo "== $name: no per-kernel profile: .carry/lib/libkernel_profile.so is missing (bundle with BUNDLE_KPROF=1)"
    status=1
  elif [[ " ${KPROF:-} " == *" $name "* ]]; then
    mkdir -p "$out/kprof-$name"
    kprof=(CUDA_INJECTION64_PATH="$PWD/.carry/lib/libkernel_profile.so" KPROF_OUT="$out/kprof-$name" KPROF_STEPS="${STEPS:-8}")
  fi
  batch=2
  IFS=';' read -ra batches <<< "${BATCHES:-}"
  for b in "${batches[@]}"; do [ "${b%%=*}" = "$name" ] && batch="${b#*=}"; done
  trainer=.carry/bin/tierd-train
  IFS=';' read -ra trainer_bins <<< "${TRAINER_BINS:-}"
  for t in "${trainer_bins[@]}"; do [ "${t%%=*}" = "$name" ] && trainer="${t#*=}"; done
  env "${kprof[@]}" TIERD_TRAIN_BIN="$trainer" OUT="$work/$name" PROFILE="$profile" TIERD_BIN="$bin" TIERD_DAEMON_FLAGS="$daemon_flags" MODELS="$model" NONE=0 BUDGETS="$budget" BATCH="$batch" STEPS="${STEPS:-8}" SKIP="${SKIP:-3}" TIERD_DRAM=32GiB TORCH=0 \
    TIERD_RUN_FLAGS="$flags $extra" tools/bench/run_bench.sh > "$out/bench-$name.txt" 2>&1 || status=1
  log="$work/$name/ours-$model-tierd-$budget.log"
  cp "$log" "$out/ours-$name.log" 2>/dev/null
  cp "$work/$name/tierd-$model-$budget.log" "$out/tierd-$name.log" 2>/dev/null
  cp "$work/$name/graph-$model-$budget.yaml" "$out/graph-$name.yaml" 2>/dev/null
  echo "== $name: $extra ($bin, $trainer${daemon_flags:+, tierd $daemon_flags})"
  grep -E '^(optimizer: |FP8 weight codes|where a step|done: )' "$log" | cut -c1-700
  grep -E '^result: ' "$log" | cut -c1-400
  grep -hE 'hot path served|joining free space' "$out/tierd-$name.log" | cut -c1-1100
  for f in "$out/kprof-$name"/kprof-tierd-train-*.txt; do [ -f "$f" ] && head -n 40 "$f" && tail -n 9 "$f"; done
done
python3 - "$out" "${names[@]}" <<'PY'
import json, sys
sys.path.insert(0, "tools/device")
from ours_results import load
out, names = sys.argv[1], sys.argv[2:]
rows = load(out, names)
try:
    peer = json.loads(open("/tmp/split-check/peer.json").read())
    for name, r in rows.items():
        print(f"{name}: {r['tokens_per_s']:,.0f} tokens/s against {peer['run']} {peer['tokens_per_s']:,.0f} "
              f"(batch {peer['batch']}, the whole GPU): {r['tokens_per_s'] / peer['tokens_per_s']:.3f}x")
except (OSError, ValueError, KeyError):
    pass
base = names[0]
for name in names[1:]:
    if base not in rows or name not in rows:
        continue
    g, s = rows[base], rows[name]
    print(f"{name} {s['tokens_per_s']:,.0f} tokens/s against {base}'s {g['tokens_per_s']:,.0f}: "
          f"{s['tokens_per_s'] / g['tokens_per_s']:.3f}x; the host waited in acquire {s['acquire_wait_seconds'] * 1e3:.0f} "
          f"against {g['acquire_wait_seconds'] * 1e3:.0f} ms a step; PCIe in {s['h2d_bytes'] / 1e9:.1f} against "
          f"{g['h2d_bytes'] / 1e9:.1f} GB, out {s['d2h_bytes'] / 1e9:.1f} against {g['d2h_bytes'] / 1e9:.1f} GB a step; "
          f"device {s['device_bytes'] / 2**30:.1f} against {g['device_bytes'] / 2**30:.1f} GiB")
PY
tar czf "$final/split-check.tgz" -C "$work" logs $([ -d "$work/resume" ] && echo resume)
exit $status
