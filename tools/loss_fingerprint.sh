#!/usr/bin/env bash
# The losses of a fixed matrix of short tierd-train runs, one line per run: for a refactor
# that must not change a bit. Run it with the binaries from before and after, then diff.
#   tools/loss_fingerprint.sh TIERD_TRAIN TIERD cpu|gpu > after.txt; diff before.txt after.txt
# cpu: tiny models, every optimizer, checkpointing, accumulation, the model family, through
# a real tierd (fake GPU). gpu: the same on the GPU with bf16/fp8, host and deferred
# optimizers, compact state and tierd budgets. Each line: the run's flags, the hash of its
# final checkpoint (every weight and moment), then its losses.
set -u
train="$1"; tierd="$2"; device="${3:-cpu}"
work="$(mktemp -d)"; rt="/tmp/fp-$$"  # short: a socket path has 108 bytes
trap 'kill $tierd_pid 2> /dev/null; rm -rf "$work" "$rt"' EXIT

cat > "$work/family.json" <<'JSON'
{"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "intermediate_size": 176, "vocab_size": 256, "max_position_embeddings": 64, "tie_word_embeddings": true,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 32}}
JSON
if [ "$device" = gpu ]; then
  mkdir -p "$rt/nvme"
  "$tierd" --gpu=cuda --gpu_bytes=8GiB --dram_bytes=24GiB --nvme_dir="$rt/nvme" --nvme_bytes=16GiB \
    --runtime_dir="$rt/run" > "$work/tierd.log" 2>&1 &
else
  mkdir -p "$rt/nvme"
  "$tierd" --gpu=fake --gpu_bytes=64MiB --dram_bytes=256MiB --nvme_dir="$rt/nvme" --nvme_bytes=256MiB \
    --runtime_dir="$rt/run" > "$work/tierd.log" 2>&1 &
fi
tierd_pid=$!
for _ in $(seq 200); do [ -S "$rt/run/tierd.grpc.sock" ] && break; sleep 0.1; done
tierd_flags="--offload_policy=tierd --tierd_dir=$rt/run"

if [ "$device" = gpu ]; then
  common="--device=gpu --steps=8 --warmup=2 --eval_every=4 --seed=7"
  small="--model_size=124m --batch_size=4 --seq_len=256"
  runs=(
    "$small --precision=bf16"
    "$small --precision=fp8"
    "$small --precision=fp8 --opt=adamw8bit"
    "$small --precision=bf16 --opt=lion"
    "$small --precision=bf16 --opt=adafactor"
    "$small --precision=bf16 --grad_checkpointing=full --grad_accum_steps=2"
    "--model_config=$work/family.json --batch_size=4 --seq_len=64 --precision=bf16"
    "$small --precision=fp8 $tierd_flags --gpu_budget=3GiB"
    "$small --precision=fp8 $tierd_flags --gpu_budget=3GiB --optimizer_place=cpu"
    "$small --precision=fp8 $tierd_flags --gpu_budget=3GiB --optimizer_place=gpu --optimizer_deferred=false"
    "$small --precision=bf16 $tierd_flags --gpu_budget=3GiB --compact_state=on --step_order=layer --grad_accum_steps=2"
    "$small --precision=fp8 $tierd_flags --gpu_budget=3GiB --grad_checkpointing=dynamic"
    "$small --precision=bf16 $tierd_flags --gpu_budget=3GiB --optimizer_place=cpu --opt=lion"
    "$small --precision=bf16 $tierd_flags --gpu_budget=3GiB --optimizer_place=cpu --opt=adafactor"
    "$small --precision=bf16 $tierd_flags --gpu_budget=3GiB --optimizer_place=cpu --opt=adamw8bit --adamw8bit_min_size=4096"
    "$small --precision=bf16 $tierd_flags --gpu_budget=3GiB --compact_state=on --step_order=layer --grad_accum_steps=2 --opt=lion"
    "$small --precision=bf16 $tierd_flags --gpu_budget=3GiB --compact_state=on --step_order=layer --grad_accum_steps=2 --opt=adafactor"
    "$small --precision=fp8 $tierd_flags --gpu_budget=3GiB --compact_state=on --step_order=layer --grad_accum_steps=2 --opt=adamw8bit --adamw8bit_min_size=4096"
  )
else
  common="--device=cpu --steps=6 --warmup=2 --batch_size=2 --seq_len=32 --eval_every=3 --seed=7"
  runs=(
    ""
    "--opt=adamw8bit"
    "--opt=lion"
    "--opt=adafactor"
    "--grad_checkpointing=full --grad_accum_steps=2"
    "--model_config=$work/family.json"
    "$tierd_flags --tierd_dram=16MiB"
    "$tierd_flags --tierd_dram=16MiB --opt=adamw8bit"
  )
fi
for extra in "${runs[@]}"; do
  metrics="$work/m.jsonl"; rm -rf "$metrics" "$work/ck"
  "$train" $common $extra --metrics="$metrics" --checkpoint_dir="$work/ck" --checkpoint_every=1000 > "$work/run.log" 2>&1
  rc=$?
  # The losses, without the times and the memory figures that change from run to run.
  losses="$(grep -o '"\(loss\|val_loss\|grad_norm\)": [^,}]*' "$metrics" 2> /dev/null | tr '\n' ' ')"
  # The final checkpoint's bytes: every weight and moment, bit for bit.
  weights="$(cat "$work"/ck/ckpt-*.bin 2> /dev/null | sha256sum | cut -c1-16)"
  line="${extra//$work\//}"; echo "${line//$rt/RT} | rc=$rc | checkpoint $weights | $losses"
  [ "$rc" = 0 ] || tail -3 "$work/run.log" | sed 's/^/    /' >&2
done
