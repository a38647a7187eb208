#!/usr/bin/env bash
# tierd-train's GPU side, before it trains: the device choice, and each bad GPU flag exits 1
# with a message that says what to do. Without a usable GPU (CI) only the device choice can
# be checked and the rest is said skipped; on the lent GPU machine everything runs
# (tools/device/trainer_check.sh). Prints "N passed, M failed"; exit 1 on a failure.
set -u
bin="$1"
dir="${TEST_TMPDIR:-/tmp}/gpu_train_main_test.$$"
mkdir -p "$dir"
"$bin" --help > "$dir/help.log" 2>&1
if [ $? -ge 126 ]; then  # not found, not executable, or a shared library missing: say so, not 21 failures
  echo "cannot run $bin: $(head -n 3 "$dir/help.log")"
  echo "0 passed, 1 failed"
  exit 1
fi
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED: $1"; cat "$dir/out.log"; fi; }
run() { "$bin" "$@" > "$dir/out.log" 2>&1; echo $? > "$dir/rc"; }
refused() { [ "$(cat "$dir/rc")" = 1 ] && grep -q "$1" "$dir/out.log"; }

run --device=tpu
check "an unknown device" "refused 'is auto, gpu or cpu, not .tpu.'"
run --device=gpu --steps=1
if grep -q 'no GPU can be used' "$dir/out.log"; then
  check "--device=gpu without a GPU says why" "refused '^tierd-train: --device=gpu, but no GPU can be used: '"
  run --steps=1 --eval_every=0
  check "auto falls back to the CPU and says so once" \
    "[ \$(grep -c '^device: CPU, the reference (no usable GPU' '$dir/out.log') = 1 ]"
  echo "GPU checks skipped: no usable GPU here"
else
  d="--device=gpu"
  run $d --offload_policy=tiered --tierd_dir="$dir/no-tierd-here"
  check "tiered is tierd: no daemon there is explained" "refused '^tierd-train: tierd: '"
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29731 run $d --steps=1 --comm_timeout=2 --seq_len=64
  check "rank 0 of two GPU ranks whose peer never comes says so within --comm_timeout" \
    "refused 'rank 0: 0 of the other 1 ranks came to MASTER_ADDR:MASTER_PORT = 127.0.0.1:29731 within 2 s'"
  RANK=1 WORLD_SIZE=2 run $d --steps=1 --seq_len=64
  check "a GPU rank without the rendezvous address says what to export" "refused 'export MASTER_ADDR='"
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29732 run $d --offload_policy=tierd --tierd_dir="$dir/none"
  check "GPU ranks through tierd are refused with what to do instead" \
    "refused 'data-parallel GPU ranks through tierd are not built'"
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29733 run $d --sparse_grad_ratio=0.05
  check "the sparse sync is the CPU trainer's" "refused 'GPU ranks sum every gradient (dense)'"
  run $d --optimizer_place=host
  check "an unknown optimizer place" "refused 'is gpu, cpu, split or auto, not .host.'"
  run $d --optimizer_place=cpu
  check "the CPU optimizer without tierd" "refused 'it needs --offload_policy=tierd'"
  run $d --optimizer_place=split
  check "a split optimizer without tierd" "refused 'optimizer_place=split steps part of the state on the host, .* it needs --offload_policy=tierd'"
  run $d --offload_policy=tierd --gpu_budget=1MiB
  check "a GPU budget below the workspace, with the numbers" \
    "refused 'leaves nothing for tierd: the trainer.s workspace is .* for .* tokens and the CUDA contexts '"
  run $d --offload_policy=tierd --gpu_budget=lots
  check "a size that is not one" "refused 'a size like 24GiB'"
  run $d --offload_policy=tierd --optimizer_chunks=0
  check "no sub-groups at all" "refused 'optimizer_chunks=0: give 1'"
  run $d --optimizer_chunks=4
  check "sub-groups without tierd" "refused 'in pieces: it needs --offload_policy=tierd'"
  run $d --opt=adamw8bit --offload_policy=tierd --optimizer_chunks=4 --tierd_dir="$dir/no-tierd-here"
  check "8-bit moments are not leased in sub-groups" "refused 'optimizer_chunks with --opt=adamw8bit'"
  run $d --step_order=sideways
  check "an unknown step order" "refused 'step_order is auto, micro or layer, not .sideways.'"
  run $d --compact_state=yes
  check "an unknown compact state" "refused 'compact_state is auto, on or off, not .yes.'"
  run $d --compact_state=on --grad_accum_steps=2 --step_order=micro
  check "the compact state needs one backward per layer" "refused 'compact_state=on needs one backward per layer'"
  run $d --compact_state=on --steps=2 --batch_size=2 --seq_len=64
  check "the compact state trains and says so" \
    "grep -q '^state: compact, ' '$dir/out.log' && grep -q 'ours none' '$dir/out.log'"
  run $d --compact_state=on --steps=2 --batch_size=2 --seq_len=64 --metrics="$dir/plan.jsonl"
  check "the run plan is one table with nothing left auto, and the metrics' first line" \
    "[ \$(grep -c '^run plan:' '$dir/out.log') = 1 ] && grep -q '^  state  *compact (bf16 gradients' '$dir/out.log' && \
     grep -q '^  device  *GPU 0: ' '$dir/out.log' && head -1 '$dir/plan.jsonl' | grep -q '^{\"plan\": {\"device\": \"GPU 0' && \
     ! head -1 '$dir/plan.jsonl' | grep -q ': \"auto'"
  run $d --steps=2 --batch_size=2 --seq_len=64
  adamw_lr=$(sed -nE 's/^schedule: lr ([0-9.e+-]+) .*/\1/p' "$dir/out.log")
  run $d --opt=Lion --steps=2 --batch_size=2 --seq_len=64
  lion_lr=$(sed -nE 's/^schedule: lr ([0-9.e+-]+) .*/\1/p' "$dir/out.log")
  check "Lion trains on the GPU (its name as users write it) at a third of AdamW's default rate ($lion_lr, $adamw_lr)" \
    "grep -q 'ours none' '$dir/out.log' && [ -n '$lion_lr' ] && [ -n '$adamw_lr' ] && \
     awk 'BEGIN { r = 3 * $lion_lr / $adamw_lr; exit !(r > 0.99 && r < 1.01) }'"
  run $d --opt=Adafactor --steps=2 --batch_size=2 --seq_len=64
  check "Adafactor trains on the GPU" "grep -q 'ours none' '$dir/out.log'"
  run $d --opt=adafactor --offload_policy=tierd --optimizer_chunks=4 --tierd_dir="$dir/no-tierd-here"
  check "Adafactor's factored state is one lease a layer" "refused 'optimizer_chunks with --opt=adafactor'"
  run $d --precision=fp32
  check "fp32 throughout is the CPU's" "refused 'the GPU trainer computes bf16'"
  run $d --precision=fp8 --steps=2 --batch_size=2 --seq_len=64
  check "fp8 trains and says its policy, delayed scaling by default" \
    "grep -q '^precision: fp8 for the .*(delayed scaling; the first step at current scales); a layer falls back to bf16 after 4 steps' '$dir/out.log' && grep -q 'ours none + fp8' '$dir/out.log'"
  run $d --precision=fp8 --fp8_scaling=current --fp8_fallback_after=0 --steps=2 --batch_size=2 --seq_len=64
  check "current scaling trains and says so" \
    "grep -q '^precision: fp8 for the .*at its current scale (--fp8_scaling=current); no fallback' '$dir/out.log' && grep -q 'ours none + fp8' '$dir/out.log'"
  run $d --precision=fp8 --fp8_scaling=fixed --fp8_fixed_scale=16 --fp8_fixed_grad_scale=4096 --steps=2 --batch_size=2 --seq_len=64
  check "fixed scaling trains and says its scales" \
    "grep -q '^precision: fp8 for the .*every weight and input at the fixed scale 16 and every output gradient at 4096, for the whole run (--fp8_scaling=fixed' '$dir/out.log' && grep -q 'ours none + fp8' '$dir/out.log'"
  run $d --precision=fp8 --fp8_fast_accumulation --steps=2 --batch_size=2 --seq_len=64
  check "the forward's fast accumulation trains and says so" \
    "grep -q '^precision: fp8 for the .*; the forward.s matmuls with fast accumulation (--fp8_fast_accumulation)' '$dir/out.log' && grep -q 'ours none + fp8' '$dir/out.log'"
  run $d --precision=fp8 --bf16_layers='layers\.(0' --steps=1
  check "a --bf16_layers that is no regex" "refused 'is not a regular expression'"
  run $d --precision=fp8 --bf16_layers='layers\.0' --steps=1 --batch_size=2 --seq_len=64
  check "the kept layers are said" "grep -q '^precision: fp8 for 1 of the 2 layers.*layers.0 (--bf16_layers)' '$dir/out.log'"
  run $d --steps=1 --batch_size=2 --seq_len=64
  check "auto precision is fp8 on an FP8 GPU, and says why" \
    "grep -q '^precision: fp8 for the .*(--precision=auto: fp8 on this GPU (compute capability' '$dir/out.log' && grep -q 'ours none + fp8' '$dir/out.log'"
  run $d --steps=1 --batch_size=1 --seq_len=60
  check "auto precision is bf16 for shapes FP8 cannot take, and says why" \
    "grep -q '^precision: bf16 .*(--precision=auto: bf16: FP8 tensor cores take dimensions in multiples of 16, and these are 60 rows' '$dir/out.log'"
  run $d --precision=fp8 --batch_size=1 --seq_len=60 --steps=1
  check "fp8 refuses rows FP8 tensor cores do not take" "refused 'multiple of 16'"
  run $d --grad_checkpointing=dynamic --steps=2 --batch_size=2 --seq_len=64
  check "dynamic checkpointing keeps every layer's activations where the GPU has room, and says why" \
    "grep -q '^checkpointing: dynamic: every layer keeps its activations (.*Predicted step: dynamic ' '$dir/out.log' && grep -q 'ours none' '$dir/out.log'"
  run $d --tierd_record --steps=1
  check "a CPU-only flag is noted as ignored" "grep -q 'note: --tierd_record is for the CPU trainer: ignored on the GPU' '$dir/out.log'"
  run $d --eval_every=2 --steps=4 --batch_size=2 --seq_len=64 --metrics="$dir/m.jsonl"
  check "validation losses every 2 steps and at the end, in the metrics too" \
    "[ \$(grep -c '^validation loss ' '$dir/out.log') = 2 ] && grep -q 'done: 4 steps, final loss [0-9.]*, validation loss ' '$dir/out.log' && [ \$(grep -c validation_loss '$dir/m.jsonl') = 2 ]"
  # GPU-Util from NVML (the driver's library): on steps, in the metrics and the done line, a
  # percentage; without NVML one line that says why.
  run $d --model_size=1.3b --steps=24 --timing_skip=2 --batch_size=4 --seq_len=512 --eval_every=-1 --metrics="$dir/u.jsonl"
  if grep -q '^GPU-Util: not shown (' "$dir/out.log"; then
    check "no NVML: GPU-Util is not shown, and the line says why" "grep -q '^GPU-Util: not shown (.*NVML' '$dir/out.log'"
  else
    check "GPU-Util on the steps, in the metrics and the done line, 0-100%" \
      "grep -qE '^step .* tok/s  GPU-Util [0-9]+%  GPU ' '$dir/out.log' && grep -qE '^done: .*, GPU-Util [0-9]+%, GPU memory' '$dir/out.log' && python3 -c \"import json,sys; u=[json.loads(l).get('gpu_util') for l in open('$dir/u.jsonl')]; u=[x for x in u if x is not None]; sys.exit(0 if u and all(0 <= x <= 100 for x in u) else 1)\""
  fi
fi
run --device=cpu --bf16_layers='layers\.0'
check "--bf16_layers without fp8" "refused 'bf16_layers chooses layers to keep out of FP8: give it with --precision=fp8 or auto'"
run --device=cpu --precision=fp8
check "fp8 is the GPU's" "refused 'precision=fp8 is the GPU trainer.s'"
run --fp8_scaling=sometimes
check "an unknown FP8 scaling" "refused 'fp8_scaling is delayed, current or fixed, not .sometimes.'"
run --fp8_scaling=fixed --fp8_fixed_scale=0
check "a fixed FP8 scale of 0" "refused 'fp8_fixed_scale and --fp8_fixed_grad_scale are positive scales between 2^-100 and 2^100 (got 0 and 1)'"
run --fp8_fixed_grad_scale=2
check "a fixed FP8 scale without fixed scaling" "refused 'fp8_fixed_scale and --fp8_fixed_grad_scale go with --fp8_scaling=fixed'"
run --fp8_window=0
check "an amax window of no steps" "refused 'fp8_window is 1..1024 steps'"
run --device=cpu --opt=Adafactor --steps=3 --eval_every=0
check "Adafactor trains on the CPU too" "[ \"\$(cat '$dir/rc')\" = 0 ]"
run --fp8_margin=40
check "an FP8 margin past any range" "refused 'fp8_margin is 0..32'"
run --device=cpu --grad_checkpointing=dynamic
check "dynamic checkpointing is the GPU trainer's" "refused 'grad_checkpointing=dynamic chooses under a GPU.s memory'"
run --adamw8bit_min_size=-1
check "a negative 8-bit size floor" "refused 'adamw8bit_min_size: 0 (every tensor 8-bit) or a count of values'"
run --adamw8bit_min_size=4096
check "the 8-bit size floor without 8-bit moments" "refused 'adamw8bit_min_size goes with --opt=adamw8bit'"
run --grad_checkpointing=sometimes
check "an unknown checkpointing" "refused 'grad_checkpointing is none, full or dynamic, not .sometimes.'"
run --batch_size=0
check "a batch of nothing" "refused 'must be at least 1'"
run --help
check "--help lists the trainer's flags, both devices'" \
  "grep -q -- '--offload_policy' '$dir/out.log' && grep -q -- '--optimizer_place' '$dir/out.log' && grep -q -- '--model_config' '$dir/out.log'"

rm -rf "$dir"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
