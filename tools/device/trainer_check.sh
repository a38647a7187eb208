#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry, made by tools/device/bundle.sh):
#   device run: command="tools/device/trainer_check.sh", carry=[".carry"]
# What a user of tierd-train on a GPU meets first, each with a verdict line:
#   1. the GPU flags' refusals (trainer_ref/gpu/gpu_train_main_test.sh, with the GPU);
#   2. kill -9 mid-run and --resume give the straight run's losses bit for bit: plain GPU
#      buffers, and through tierd (state in its DRAM tier, AdamW on the host) in a budget
#      smaller than the state, also with FP8 weight codes written by the host or by the GPU's
#      AdamW, and split
#      (--optimizer_place=split: the last groups on the host, the rest on the GPU);
#   3. a tierd killed under a training GPU client ends it within 5 s, with its last checkpoint;
#   4. a model shape from a config file trains;
#   5. launch-to-first-step time by phase (STARTUP_MODEL, default 1.3b, through tierd);
#   6. a layer-major step through tierd (3 micro-batches, checkpointing, AdamW on the host)
#      gives the losses of one micro-batch after the other on plain GPU buffers, bit for bit.
# CHECKS="2 5" runs only those. Logs in $OUT. Exit 1 if a check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=.carry/bin/tierd-train
work=/var/tmp/trainer-check; rm -rf "$work"; mkdir -p "$work"
pass=0; fail=0
verdict() { if [ "$2" = 0 ]; then pass=$((pass+1)); echo "PASS: $1"; else fail=$((fail+1)); echo "FAIL: $1"; fi; }
fields() { grep -v '^{"plan": ' "$1" | sed -E 's/, "seconds": [^,]*//; s/, "tokens": [^}]*//'; }
start_tierd() {  # $1: runtime dir, $2: GPU bytes, $3: DRAM bytes
  rm -rf "$work/nvme-$(basename "$1")"; mkdir -p "$work/nvme-$(basename "$1")"
  .carry/bin/tierd --gpu=cuda --gpu_bytes="$2" --dram_bytes="$3" --nvme_dir="$work/nvme-$(basename "$1")" \
    --nvme_bytes=16GiB --runtime_dir="$1" > "$out/tierd-$(basename "$1").log" 2>&1 &
  tierd_pid=$!
  for _ in $(seq 300); do [ -S "$1/tierd.grpc.sock" ] && break; sleep 0.1; done
}
echo "== machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader)"
checks=" ${CHECKS:-1 2 3 4 5 6} "
want() { [[ "$checks" == *" $1 "* ]]; }

if want 1; then
echo "== 1. refusals"
bash trainer_ref/gpu/gpu_train_main_test.sh "$bin" > "$out/refusals.log" 2>&1
rc_=$?
grep -A12 '^FAILED: ' "$out/refusals.log" | cut -c1-400
verdict "GPU flag refusals ($(tail -n 1 "$out/refusals.log"))" $rc_

fi
if want 2; then
echo "== 2. kill -9 and --resume, bit for bit"
common="--device=gpu --model_size=124m --batch_size=4 --seq_len=512 --steps=12 --warmup=2 --eval_every=-1"
resume_pair() {  # $1: name, rest: flags
  local name=$1; shift
  $bin $common "$@" --metrics="$work/$name-straight.jsonl" > "$out/$name-straight.log" 2>&1
  TIERD_TRAIN_SIGKILL_AT_STEP=10 $bin $common "$@" --metrics="$work/$name.jsonl" --checkpoint_dir="$work/ck-$name" \
    --checkpoint_every=4 > "$out/$name-killed.log" 2>&1
  local killed=$?
  $bin $common "$@" --metrics="$work/$name.jsonl" --checkpoint_dir="$work/ck-$name" --checkpoint_every=4 --resume \
    > "$out/$name-resumed.log" 2>&1
  grep -E '^(resumed|checkpoint|startup)' "$out/$name-resumed.log" "$out/$name-killed.log"
  [ "$killed" = 137 ] && grep -q 'resumed from .*ckpt-00000008.bin at step 8' "$out/$name-resumed.log" &&
    [ "$(grep -c '^{"step": ' "$work/$name.jsonl")" = 12 ] && diff <(fields "$work/$name-straight.jsonl") <(fields "$work/$name.jsonl")
}
resume_pair plain
verdict "plain GPU buffers: killed at step 10, resumed from step 8, 12 losses equal the straight run's" $?
start_tierd "$work/run-resume" 3GiB 16GiB
resume_pair tierd --offload_policy=tierd --tierd_dir="$work/run-resume" --gpu_budget=3GiB --tierd_dram=8GiB \
  --tierd_nvme=8GiB --optimizer_place=cpu
verdict "through tierd (3 GiB GPU budget, AdamW on the host): the same" $?
resume_pair codes --offload_policy=tierd --tierd_dir="$work/run-resume" --gpu_budget=3GiB --tierd_dram=8GiB \
  --tierd_nvme=8GiB --optimizer_place=cpu --precision=fp8 --fp8_weight_codes
verdict "through tierd, FP8 weight codes written by the host's AdamW (remade on the GPU after the resume): the same" $?
grep -h '^FP8 weight codes' "$out/codes-resumed.log"
resume_pair gpucodes --offload_policy=tierd --tierd_dir="$work/run-resume" --gpu_budget=3GiB --tierd_dram=8GiB \
  --tierd_nvme=8GiB --optimizer_place=gpu --precision=fp8 --fp8_weight_codes
verdict "through tierd, FP8 weight codes written by the GPU's AdamW (the checkpoint's bf16 weights from the master copy): the same" $?
grep -h '^FP8 weight codes' "$out/gpucodes-resumed.log"
resume_pair split --offload_policy=tierd --tierd_dir="$work/run-resume" --gpu_budget=3GiB --tierd_dram=8GiB \
  --tierd_nvme=8GiB --optimizer_place=split
grep -q '^optimizer: split: .* the last [0-9]* of [0-9]* groups' "$out/split-straight.log"
verdict "through tierd, the optimizer split (the last groups on the host, the rest on the GPU): the same" $?
grep -h '^optimizer: split' "$out/split-straight.log"
diff <(fields "$work/plain-straight.jsonl") <(fields "$work/tierd-straight.jsonl") > /dev/null &&
  diff <(fields "$work/plain-straight.jsonl") <(fields "$work/split-straight.jsonl") > /dev/null
verdict "plain, tierd and split runs give the same losses" $?
kill -TERM $tierd_pid; wait $tierd_pid

fi
if want 3; then
echo "== 3. tierd killed under a GPU trainer"
start_tierd "$work/run-kill" 4GiB 16GiB
$bin --device=gpu --model_size=350m --batch_size=4 --seq_len=1024 --steps=100000 --eval_every=0 \
  --offload_policy=tierd --tierd_dir="$work/run-kill" --gpu_budget=3GiB --tierd_dram=12GiB --tierd_nvme=8GiB \
  --checkpoint_dir="$work/ck-kill" --checkpoint_every=2 > "$out/kill.log" 2>&1 &
train_pid=$!
for _ in $(seq 1800); do grep -q '^checkpoint .*ckpt-00000004' "$out/kill.log" && break; sleep 0.1; done
t0=$(date +%s.%N); kill -9 $tierd_pid
for _ in $(seq 100); do kill -0 $train_pid 2>/dev/null || break; sleep 0.1; done
wait $train_pid; rc=$?; t1=$(date +%s.%N)
grep -A1 '^tierd-train: ' "$out/kill.log"
secs=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
[ "$rc" = 1 ] && grep -q 'tierd closed session' "$out/kill.log" && grep -q '  last checkpoint .*ckpt-0000000' "$out/kill.log" &&
  python3 -c "import sys; sys.exit(0 if $t1 - $t0 < 5 else 1)"
verdict "the trainer stopped ${secs} s after tierd was killed, exit $rc, with its last checkpoint" $?

fi
if want 4; then
echo "== 4. a model shape from a config file"
cat > "$work/model.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 12,
 "intermediate_size": 4096, "vocab_size": 32000, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
 "rope_theta": 500000.0, "num_key_value_heads": 12, "tie_word_embeddings": false}
JSON
$bin --device=gpu --model_config="$work/model.json" --batch_size=8 --steps=30 --warmup=5 --lr=1e-3 \
  --plot="$out/config-model.png" > "$out/config-model.log" 2>&1
grep -E '^(model|step +(1|30)/|done)' "$out/config-model.log"
awk '/^step +1\//{a=$4} /^step +30\//{b=$4} END{exit !(a > b + 1)}' "$out/config-model.log"
verdict "the config file's model (6 layers, d_model 1536, rope_theta 5e5) trains: loss falls by more than 1" $?

fi
if want 5; then
echo "== 5. startup"
model="${STARTUP_MODEL:-1.3b}"
start_tierd "$work/run-startup" 24GiB 100GiB
$bin --device=gpu --model_size="$model" --batch_size=8 --seq_len=2048 --steps=3 --grad_checkpointing \
  --offload_policy=tierd --tierd_dir="$work/run-startup" --gpu_budget=24GiB --tierd_nvme=8GiB \
  > "$out/startup.log" 2>&1
grep -E '^(startup|optimizer|tierd:|step|done)' "$out/startup.log" | cut -c1-300
kill -TERM $tierd_pid; wait $tierd_pid
grep -E 'session|took|pinned|reserv' "$out/tierd-run-startup.log" | head -5

fi
if want 6; then
echo "== 6. layer-major through tierd = one micro-batch after the other on plain buffers"
lm="--device=gpu --model_size=124m --batch_size=2 --seq_len=512 --grad_accum_steps=3 --steps=6 --warmup=2 --grad_checkpointing"
$bin $lm --step_order=micro --metrics="$work/micro.jsonl" > "$out/lm-micro.log" 2>&1
start_tierd "$work/run-lm" 2GiB 16GiB
$bin $lm --step_order=layer --offload_policy=tierd --tierd_dir="$work/run-lm" --gpu_budget=3GiB --tierd_dram=8GiB \
  --tierd_nvme=8GiB --optimizer_place=cpu --metrics="$work/layer.jsonl" > "$out/lm-layer.log" 2>&1
grep -E '^(step|done|tierd: planned)' "$out/lm-layer.log" | cut -c1-220
kill -TERM $tierd_pid; wait $tierd_pid
[ "$(grep -c '"loss"' "$work/layer.jsonl")" = 6 ] && diff <(fields "$work/micro.jsonl") <(fields "$work/layer.jsonl")
verdict "layer-major through tierd gives the one-at-a-time losses bit for bit" $?
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
