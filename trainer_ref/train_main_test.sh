#!/usr/bin/env bash
# tierd-train end to end: a run, the same run interrupted and resumed (the exact curve),
# and bad flags that must be explained. Prints "N passed, M failed"; exit 1 on a failure.
set -u
bin="$1"
dir="${TEST_TMPDIR:-/tmp}/train_main_test.$$"
mkdir -p "$dir"
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED: $1"; fi; }
# The steps' lines (not the run plan's) without what differs between runs that compute the same.
fields() { grep -v '^{"plan": ' "$1" | sed -E 's/, "seconds": [^,]*//; s/, "tokens": [^}]*//'; }

common="--steps=6 --warmup=2 --batch_size=2 --seq_len=32 --eval_every=0"
"$bin" $common --metrics="$dir/a.jsonl" > "$dir/a.log" 2>&1
check "a straight run finishes" "grep -q '^done: 6 steps' '$dir/a.log'"
"$bin" $common --plot="$dir/run.png" > "$dir/p.log" 2>&1
check "the plot is a PNG" "head -c 8 '$dir/run.png' | od -c | grep -q 'P   N   G'"
# kill -9 after step 5 (its metrics line written; the last checkpoint is step 4's), then resume.
TIERD_TRAIN_SIGKILL_AT_STEP=5 "$bin" $common --metrics="$dir/b.jsonl" --checkpoint_dir="$dir/ck" --checkpoint_every=2 \
  > "$dir/b1.log" 2>&1
rc=$?
check "the run was killed by SIGKILL at step 5" "[ $rc = 137 ] && ! grep -q '^done:' '$dir/b1.log' && grep -q '^step     5/6' '$dir/b1.log'"
"$bin" $common --metrics="$dir/b.jsonl" --checkpoint_dir="$dir/ck" --checkpoint_every=2 --resume > "$dir/b2.log" 2>&1
check "the resume says where it starts" "grep -q 'resumed from .*ckpt-00000004.bin at step 4' '$dir/b2.log'"
check "the killed run's step 5 is dropped from the metrics" "grep -q 'lines after step 4 (the stopped run.s) removed' '$dir/b2.log'"
check "the resumed curve is the straight one, bit for bit" "diff <(fields '$dir/a.jsonl') <(fields '$dir/b.jsonl') > /dev/null"
check "the run plan is a table at startup and the metrics' first line, with no auto left" \
  "[ \$(grep -c '^run plan:' '$dir/a.log') = 1 ] && head -1 '$dir/a.jsonl' | grep -q '^{\"plan\": {\"device\": \"cpu' && \
   ! grep -q '\"auto\"' '$dir/a.jsonl' && grep -q '^  optimizer  *AdamW  *default$' '$dir/a.log'"
check "a resume of the same run does not repeat its plan line" "[ \$(grep -c '^{\"plan\": ' '$dir/b.jsonl') = 1 ]"
check "two checkpoints are kept" "[ \$(ls '$dir/ck' | grep -c '^ckpt-.*\\.bin\$') = 2 ]"
printf 'garbage' > "$dir/ck/ckpt-00000009.bin"
"$bin" $common --checkpoint_dir="$dir/ck" --resume > "$dir/b4.log" 2>&1
check "a damaged newest checkpoint is skipped, with the reason" "grep -q 'skipped damaged checkpoints' '$dir/b4.log' && grep -q 'resumed from .*ckpt-0000000[46].bin' '$dir/b4.log'"
"$bin" --model-size=tiny --grad-checkpointing --steps=6 --warmup=2 --batch-size=2 --seq-len=32 --eval-every=0 \
  --metrics="$dir/c.jsonl" > "$dir/c.log" 2>&1
check "dashed flags work, and checkpointing gives the same curve" \
  "grep -q '^done: 6 steps' '$dir/c.log' && diff <(fields '$dir/a.jsonl') <(fields '$dir/c.jsonl') > /dev/null"

cat > "$dir/small.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 3,
 "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 32, "rms_norm_eps": 1e-06,
 "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
JSON
"$bin" --model_config="$dir/small.json" --steps=20 --warmup=2 --batch_size=4 --eval_every=0 > "$dir/m.log" 2>&1
check "a model shape from a config file trains" "grep -q 'model small: 3 layers, d_model 48, 3 heads, d_ff 128' '$dir/m.log' && \
  awk '/^step +1\//{a=\$4} /^step +20\//{b=\$4} END{exit !(a > b + 0.5)}' '$dir/m.log'"
"$bin" --model_size=tiny --num_hidden_layers=1 --hidden_size=32 --steps=2 --eval_every=0 > "$dir/m2.log" 2>&1
check "dimensions from flags override the preset" "grep -q 'model tiny+num_hidden_layers=1,hidden_size=32: 1 layers, d_model 32' '$dir/m2.log'"
echo '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 176, "vocab_size": 256, "max_position_embeddings": 64, "rope_scaling": {"type": "yarn", "factor": 4.0}}' > "$dir/yarn.json"
"$bin" --model_config="$dir/yarn.json" > "$dir/e6.log" 2>&1
check "a shape the decoder cannot compute is refused by name" "grep -q \"RoPE scaling of type 'yarn' is not computed\" '$dir/e6.log'"
echo '{"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 256, "max_position_embeddings": 64, "tie_word_embeddings": true, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 32}}' > "$dir/family.json"
"$bin" --model_config="$dir/family.json" --steps=20 --warmup=2 --eval_every=0 > "$dir/m3.log" 2>&1
check "grouped-query attention, q/k/v biases, tied embeddings and llama3 RoPE train" \
  "grep -q '4 heads (2 key/value), d_ff 176, vocab 256, q/k/v biases, tied embeddings, RoPE llama3 x8' '$dir/m3.log' && \
  awk '/^step +1\//{a=\$4} /^step +20\//{b=\$4} END{exit !(a > b + 0.5)}' '$dir/m3.log'"
"$bin" --model_config="$dir/nope.json" > "$dir/e7.log" 2>&1
check "a missing config file is explained" "grep -q 'cannot be read' '$dir/e7.log'"
"$bin" --device=cpu --print_device > "$dir/pd.log" 2>&1
check "--print_device says the device and nothing else" "[ \"\$(cat '$dir/pd.log')\" = cpu ]"
"$bin" --device=gpu --steps=1 > "$dir/e8.log" 2>&1 || true
check "the device is said" "grep -q '^device: \|no GPU can be used' '$dir/e8.log'"

"$bin" --opt=sgd > "$dir/e0.log" 2>&1
check "an unknown optimizer is explained" "grep -q \"opt is adamw, adamw8bit, lion or adafactor, not 'sgd'\" '$dir/e0.log'"
"$bin" $common --opt=AdamW8bit --offload_policy=none --metrics="$dir/q.jsonl" > "$dir/q.log" 2>&1
check "8-bit moments train (names as users write them)" "grep -q '^done: 6 steps' '$dir/q.log'"
"$bin" --model_size=70b > "$dir/e1.log" 2>&1
check "an unknown size is explained" "grep -q \"unknown model size '70b'; use tiny\" '$dir/e1.log'"
"$bin" --data=/nonexistent/corpus > "$dir/e2.log" 2>&1
check "missing data is explained" "grep -q \"does not exist\" '$dir/e2.log'"
"$bin" --model_size=7b > "$dir/e3.log" 2>&1
check "a model too big for the CPU is refused with its size" "grep -q '6.74B parameters' '$dir/e3.log'"
"$bin" --offload_policy=tierd --tierd_dir="$dir/no-tierd" > "$dir/e4.log" 2>&1
check "no tierd to talk to is explained" "grep -q 'tierd-train: tierd: ' '$dir/e4.log'"
"$bin" --resume > "$dir/e5.log" 2>&1
check "--resume without a directory is explained" "grep -q 'resume needs --checkpoint_dir' '$dir/e5.log'"
"$bin" --checkpoint_precision=fp16 > "$dir/e11.log" 2>&1
check "an unknown checkpoint precision is explained" "grep -q \"checkpoint_precision is fp32 or bf16, not 'fp16'\" '$dir/e11.log'"
"$bin" --checkpoint_precision=bf16 > "$dir/e12.log" 2>&1
check "bf16 checkpoints without checkpointing are explained" "grep -q 'it needs it' '$dir/e12.log'"
"$bin" --checkpoint_precision=bf16 --grad_checkpointing > "$dir/e13.log" 2>&1
check "bf16 checkpoints on the CPU trainer are explained" "grep -q 'is for the GPU trainer' '$dir/e13.log'"
"$bin" --attention=flash > "$dir/e10.log" 2>&1
check "an unknown attention is explained" "grep -q \"attention is auto, cudnn, cudnn-fast or ours, not 'flash'\" '$dir/e10.log'"
"$bin" --gemm_candidates=0 > "$dir/e9.log" 2>&1
check "no GEMM candidates to time is explained" "grep -q 'gemm_candidates=0: 1 (cuBLASLt.s heuristic first choice) up to 64' '$dir/e9.log'"
"$bin" --gemm_workspace_mib=-1 > "$dir/e14.log" 2>&1
check "a negative GEMM workspace is explained" "grep -q 'gemm_workspace_mib=-1: 0 (algorithms without one) up to 1024' '$dir/e14.log'"
"$bin" --loss_spike_sds=-1 > "$dir/e7.log" 2>&1
check "a negative spike threshold is explained" "grep -q 'loss_spike_sds is a number of standard deviations, 0 or more' '$dir/e7.log'"

# The loss-spike guard on a real spike: a text that repeats one sentence but for 40 characters
# of noise after each 1000 (a fixed LCG), so the model learns the sentence and the step that
# draws a window of noise jumps far above the recent losses. A healthy run flags nothing.
x=7
for i in $(seq 40); do
  yes "the quick brown fox jumps over the lazy dog. " | head -c 1000
  for j in $(seq 40); do x=$(( (x * 1103515245 + 12345) % 2147483648 )); printf "\\$(printf %o $((33 + (x >> 16) % 90)))"; done
done > "$dir/spiky.txt"
"$bin" --data="$dir/spiky.txt" --steps=60 --warmup=2 --batch_size=2 --seq_len=32 --eval_every=0 \
  --metrics="$dir/spiky.jsonl" > "$dir/spiky.log" 2>&1
check "a loss spike is flagged on its progress line, in the metrics and in the last line" \
  "grep -q '^step .*  loss spike: [0-9.]* sd above the last 10 steps. mean' '$dir/spiky.log' && grep -q '\"loss_spike_sds\": ' '$dir/spiky.jsonl' && grep -q '^done: 60 steps.*; [0-9]* loss spikes* flagged (steps* ' '$dir/spiky.log'"
check "a healthy run flags no spike" "! grep -q 'loss spike' '$dir/a.log'"
"$bin" --data="$dir/spiky.txt" --steps=60 --warmup=2 --batch_size=2 --seq_len=32 --eval_every=0 --loss_spike_sds=0 \
  > "$dir/spiky0.log" 2>&1
check "--loss_spike_sds=0 turns the guard off" "grep -q '^done: 60 steps' '$dir/spiky0.log' && ! grep -q 'loss spike' '$dir/spiky0.log'"
rm -rf "$dir"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
