#!/usr/bin/env bash
# The benchmark harness, on the lent GPU machine (carry .carry, made by
# tools/device/bundle.sh):  device run: command="tools/bench/run_bench.sh", carry=[".carry"]
# Same call, same shapes (Llama-style, sequence 2048), same text (the bytes of Python's
# standard library sources, on every machine with Python): the PyTorch baseline (bf16
# autocast + fused AdamW, with and without activation checkpointing) and our trainer with
# --offload_policy=none (tierd-train --device=gpu), and with tierd (a fresh daemon on the GPU per
# run) at each GPU budget in BUDGETS. One table at the end; logs in $OUT.
# MODELS (presets, or config.json paths: a shape of your own, both sides read it), BATCH, STEPS, SKIP (untimed warm-up steps), BUDGETS ("" skips the tierd runs), TIERD_DRAM, TIERD_NVME override
# the defaults; TORCH_RUNS picks PyTorch's rows (default "eager compile checkpointing"; float8: torchao's float8
# training + torch.compile, carry .whl with torchao's wheel); TORCH=0 skips PyTorch;
# NONE=0 skips our no-offload run (a 7B does not fit the H200 without offload); OURS_FLAGS
# adds flags to our runs (e.g. --grad_checkpointing), TIERD_RUN_FLAGS to our tierd runs only, TIERD_DAEMON_FLAGS
# to the tierd daemon (e.g. --planner_gpu_headroom_fraction=0.08), TIERD_BIN picks its binary (default
# .carry/bin/tierd: another build side by side), TIERD_TRAIN_BIN the trainer's for the tierd runs (default
# .carry/bin/tierd-train). DUMP_GRAPH_AT=N: once each tierd run logs step N,
# the trainer's graph as planned (tierctl plan --dump_graph; carry tierctl) into graph-MODEL-BUDGET.yaml. DEEPSPEED="2 3" adds
# DeepSpeed's rows at those ZeRO stages with CPU offload (DS_BATCH x DS_ACCUM micro-batches; carry .whl: its sdist
# and hjson, pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions wheels). PyTorch runs at the largest batch that
# fits (a power of two, probed first; TORCH_BATCH=N fixes it, TORCH_ACCUM=K accumulates K of them a step), ours at
# BATCH (default 8). FSDP2=1 adds PyTorch FSDP2 with CPU offload (FSDP2_BATCH x FSDP2_ACCUM, FSDP2_FLAGS
# e.g. --checkpointing; presets only). PROFILE=0 runs ours without
# --profile (no per-step breakdown, none of its CUDA events) and PyTorch without its profiled
# extra step; with it, a second table gives each run's GPU time and TFLOP/s by kernel class.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/torchao_env.sh
out="${OUT:-/tmp/tierd-out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
models="${MODELS:-1.3b}"; batch="${BATCH:-8}"; steps="${STEPS:-8}"; seq=2048
corpus=/tmp/tierd-bench-corpus; mkdir -p "$corpus"
py_lib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$py_lib" -maxdepth 1 -name '*.py' | sort | xargs cat > "$corpus/stdlib.txt"
echo "== machine: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader); corpus $(du -h "$corpus/stdlib.txt" | cut -f1)"
results="$out/bench.jsonl"; : > "$results"
profiles="$out/profile.jsonl"; : > "$profiles"
budgets="${BUDGETS-24GiB 40GiB}"; tierd_dram="${TIERD_DRAM:-100GiB}"; tierd_nvme="${TIERD_NVME:-40GiB}"
nvme_dir=/var/tmp/tierd-bench-nvme; tierd_dir=/tmp/tierd-bench
profile="--profile"; [ "${PROFILE:-1}" = 0 ] && profile=""  # PROFILE=0: no CUDA events around each kernel
keep_profile() { grep '^profile: ' "$1" | sed 's/^profile: //' >> "$profiles"; }
for spec in $models; do
  # A preset name, or a config.json (a shape of one's own: both sides read it; named by its file).
  if [[ "$spec" == *.json ]]; then model_flag="--model_config=$spec"; m=$(basename "$spec" .json)
  else model_flag="--model_size=$spec"; m="$spec"; fi
  if [ "${TORCH:-1}" = 1 ]; then
    for run in ${TORCH_RUNS:-eager compile checkpointing}; do
      flags=""; [ "$run" = compile ] && flags="--compile --timing_skip=4"
      [ "$run" = checkpointing ] && flags="--checkpointing"
      [ "$run" = float8 ] && flags="--float8 --timing_skip=4"
      if [ "$run" = float8 ]; then use_torchao || exit 1; fi
      echo "== pytorch $m $run"
      python3 tools/bench/torch_baseline.py "$model_flag" --batch_size="${TORCH_BATCH:-max}" --seq_len=$seq --steps="$steps" \
        --grad_accum_steps="${TORCH_ACCUM:-1}" \
        --data="$corpus/stdlib.txt" $flags $profile 2>&1 | tee "$out/torch-$m-$run.log" | tail -n 3
      tail -n 1 "$out/torch-$m-$run.log" | grep '^{' >> "$results"
      keep_profile "$out/torch-$m-$run.log"
    done
  fi
  for stage in ${DEEPSPEED:-}; do
    if [[ "$spec" == *.json ]]; then echo "DEEPSPEED: presets only, not $spec"; continue; fi
    if ! python3 -c "import deepspeed" 2>/dev/null; then
      [ -d .whl ] || { echo "DEEPSPEED=$stage: carry .whl (DeepSpeed's sdist and the wheels it lacks)"; exit 1; }
      python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl .whl/deepspeed-*.tar.gz || exit 1
      export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
    fi
    echo "== deepspeed $m ZeRO-$stage with CPU offload"
    python3 tools/bench/deepspeed_baseline.py --model_size="$m" --micro_batch="${DS_BATCH:-$batch}" \
      --grad_accum_steps="${DS_ACCUM:-1}" --stage="$stage" --steps="$steps" --timing_skip="${SKIP:-3}" \
      --data="$corpus/stdlib.txt" 2>&1 | tee "$out/deepspeed-$m-$stage.log" | tail -n 3
    grep '^{' "$out/deepspeed-$m-$stage.log" | tail -n 1 >> "$results"
  done
  if [ "${FSDP2:-0}" = 1 ] && [[ "$spec" == *.json ]]; then echo "FSDP2: presets only, not $spec"; fi
  if [ "${FSDP2:-0}" = 1 ] && [[ "$spec" != *.json ]]; then  # PyTorch FSDP2 + CPUOffloadPolicy (fsdp2_baseline.py)
    echo "== fsdp2 $m with CPU offload"
    python3 tools/bench/fsdp2_baseline.py "$model_flag" --batch_size="${FSDP2_BATCH:-$batch}" \
      --grad_accum_steps="${FSDP2_ACCUM:-1}" --steps="$steps" --timing_skip="${SKIP:-3}" ${FSDP2_FLAGS:-} \
      --data="$corpus/stdlib.txt" 2>&1 | tee "$out/fsdp2-$m.log" | tail -n 3
    grep '^{' "$out/fsdp2-$m.log" | tail -n 1 >> "$results"
  fi
  if [ "${NONE:-1}" = 1 ]; then
    echo "== tierd-train --device=gpu $m (--offload_policy=none)"
    .carry/bin/tierd-train --device=gpu "$model_flag" --batch_size="$batch" --seq_len=$seq --steps="$steps" \
      --timing_skip="${SKIP:-3}" --eval_every=-1 --data="$corpus" $profile ${OURS_FLAGS:-} 2>&1 | tee "$out/ours-$m.log" | tail -n 4
    grep '^result: ' "$out/ours-$m.log" | sed 's/^result: //' >> "$results"
    keep_profile "$out/ours-$m.log"
  fi
  for budget in $budgets; do
    echo "== tierd-train --device=gpu $m (--offload_policy=tierd, GPU budget $budget)"
    rm -rf "$nvme_dir"; mkdir -p "$nvme_dir"
    "${TIERD_BIN:-.carry/bin/tierd}" --gpu=cuda --gpu_bytes="$budget" --dram_bytes="$tierd_dram" --nvme_dir="$nvme_dir" \
      --nvme_bytes="$tierd_nvme" --runtime_dir="$tierd_dir" ${TIERD_DAEMON_FLAGS:-} > "$out/tierd-$m-$budget.log" 2>&1 &
    tierd_pid=$!
    for _ in $(seq 300); do [ -S "$tierd_dir/tierd.grpc.sock" ] && break; sleep 0.1; done
    if [ -n "${DUMP_GRAPH_AT:-}" ]; then  # the trainer's registered graph with its measured op times, for planreplay
      (for _ in $(seq 1200); do
         grep -qE "^step +$DUMP_GRAPH_AT/" "$out/ours-$m-tierd-$budget.log" 2>/dev/null && break; sleep 0.1
       done
       for s in 1 2 3; do
         .carry/bin/tierctl --runtime_dir="$tierd_dir" plan --session=$s --dump_graph > "$out/graph-$m-$budget.yaml" 2>&1 && break
       done) &
    fi
    "${TIERD_TRAIN_BIN:-.carry/bin/tierd-train}" --device=gpu "$model_flag" --batch_size="$batch" --seq_len=$seq --steps="$steps" \
      --timing_skip="${SKIP:-3}" --eval_every=-1 --data="$corpus" $profile --offload_policy=tierd --gpu_budget="$budget" \
      --tierd_dir="$tierd_dir" --tierd_dram="$tierd_dram" --tierd_nvme="$tierd_nvme" ${OURS_FLAGS:-} \
      ${TIERD_RUN_FLAGS:-} 2>&1 |
      tee "$out/ours-$m-tierd-$budget.log" | tail -n 6
    grep '^result: ' "$out/ours-$m-tierd-$budget.log" | sed 's/^result: //' >> "$results"
    keep_profile "$out/ours-$m-tierd-$budget.log"
    kill -TERM $tierd_pid; wait $tierd_pid
    tail -n 3 "$out/tierd-$m-$budget.log"
  done
done
echo "== table"
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {r["model"]: r["tokens_per_s"] for r in rows if r["run"] == "pytorch"}
compiled = {r["model"]: r["tokens_per_s"] for r in rows if r["run"] == "pytorch compiled"}
float8 = {r["model"]: r["tokens_per_s"] for r in rows if r["run"].startswith("pytorch float8")}
deepspeed = {r["model"]: r["tokens_per_s"] for r in rows if r["run"].startswith("deepspeed")}
gib = lambda b: f"{b / 2**30:.1f} GiB"
print("| model | run | peak GPU memory | tokens/s | vs PyTorch eager | vs compiled | vs float8 + compile | vs DeepSpeed | TFLOP/s (6N) | step s | host waited in acquire, s/step | GPU<-host, GPU->host per step | NVMe read, write per step | GPU-Util (NVML); PCIe busy in, out | loss after the run |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    mem = gib(r.get("peak_gpu_bytes") or r.get("peak_alloc_bytes"))
    ratio = f'{r["tokens_per_s"] / base[r["model"]]:.2f}x' if base.get(r["model"]) else "-"
    ratio_c = f'{r["tokens_per_s"] / compiled[r["model"]]:.2f}x' if compiled.get(r["model"]) else "-"
    ratio_d = f'{r["tokens_per_s"] / deepspeed[r["model"]]:.2f}x' if deepspeed.get(r["model"]) else "-"
    ratio_8 = f'{r["tokens_per_s"] / float8[r["model"]]:.2f}x' if float8.get(r["model"]) else "-"
    moves = f'{gib(r["h2d_bytes"])}, {gib(r["d2h_bytes"])}' if "h2d_bytes" in r else "-"
    nvme = f'{gib(r["nvme_read_bytes"])}, {gib(r["nvme_write_bytes"])}' if "nvme_read_bytes" in r else "-"
    step = f'{r["step_seconds"]:.2f}' if "step_seconds" in r else "-"
    wait = f'{r["acquire_wait_seconds"]:.2f}' if "acquire_wait_seconds" in r else "-"
    use = f'{r["gpu_util"]:.0f}%' if r.get("gpu_util", -1) >= 0 else "-"
    if r.get("h2d_bytes"):
        use += f'; {100 * r.get("pcie_in_busy", 0):.0f}%, {100 * r.get("pcie_out_busy", 0):.0f}%'

    run = r["run"] + (f' (batch {r["batch"]}' + (f' x {r["micro_batches"]} micro-batches' if r.get("micro_batches", 1) > 1 else "") + ")"
                      if "batch" in r else "")
    print(f'| {r["model"]} | {run} | {mem} | {r["tokens_per_s"]:.0f} | {ratio} | {ratio_c} | {ratio_8} | {ratio_d} | {r["tflops_6n"]:.0f} | {step} | {wait} | {moves} | {nvme} | {use} | {r["final_loss"]:.3f} |')
PY
echo "== where the GPU time goes (ms a step, and TFLOP/s of the work done: recomputed forwards count)"
python3 - "$profiles" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
classes = ["gemm", "attention", "norm+elementwise", "loss", "optimizer", "fp8 casts", "ranks' gradient sums", "idle"]
print("| model | run | step ms | " + " | ".join(c.replace("ranks' gradient sums", "comm") for c in classes) + " |")
print("|---|---|---|" + "---|" * len(classes))
for r in rows:
    cells = []
    for c in classes:
        e = r.get(c)
        cells.append("-" if e is None else f'{e["ms"]:.0f}' + (f' ({e["tflops"]:.0f} TF/s)' if e.get("tflops") else ""))
    print(f'| {r["model"]} | {r["run"]} | {r["step_ms"]:.0f} | ' + " | ".join(cells) + " |")
PY
