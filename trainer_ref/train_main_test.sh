#!/usr/bin/env bash
# tierd-train end to end: a run, the same run interrupted and resumed (the exact curve),
# and bad flags that must be explained. Prints "N passed, M failed"; exit 1 on a failure.
set -u
bin="$1"
dir="${TEST_TMPDIR:-/tmp}/train_main_test.$$"
mkdir -p "$dir"
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED: $1"; fi; }
fields() { sed -E 's/, "seconds": [^,]*//; s/, "tokens": [^}]*//' "$1"; }

common="--steps=6 --warmup=2 --batch_size=2 --seq_len=32 --eval_every=0"
"$bin" $common --metrics="$dir/a.jsonl" > "$dir/a.log" 2>&1
check "a straight run finishes" "grep -q '^done: 6 steps' '$dir/a.log'"
"$bin" $common --plot="$dir/run.png" > "$dir/p.log" 2>&1
check "the plot is a PNG" "head -c 8 '$dir/run.png' | od -c | grep -q 'P   N   G'"
"$bin" $common --metrics="$dir/b.jsonl" --checkpoint_dir="$dir/ck" --checkpoint_every=3 > "$dir/b1.log" 2>&1
rm -f "$dir"/ck/ckpt-00000006.bin   # as if killed after step 3's checkpoint
head -3 "$dir/b.jsonl" > "$dir/b3.jsonl"
"$bin" $common --metrics="$dir/b3.jsonl" --checkpoint_dir="$dir/ck" --resume > "$dir/b2.log" 2>&1
check "the resume says where it starts" "grep -q 'resumed from .*ckpt-00000003.bin at step 3' '$dir/b2.log'"
check "the resumed curve is the straight one" "diff <(fields '$dir/a.jsonl') <(fields '$dir/b3.jsonl') > /dev/null"
printf 'garbage' > "$dir/ck/ckpt-00000009.bin"
"$bin" $common --checkpoint_dir="$dir/ck" --resume > "$dir/b4.log" 2>&1
check "a damaged newest checkpoint is skipped, with the reason" "grep -q 'skipped damaged checkpoints' '$dir/b4.log' && grep -q 'resumed from .*ckpt-0000000[36].bin' '$dir/b4.log'"
"$bin" --model-size=tiny --grad-checkpointing --steps=6 --warmup=2 --batch-size=2 --seq-len=32 --eval-every=0 \
  --metrics="$dir/c.jsonl" > "$dir/c.log" 2>&1
check "dashed flags work, and checkpointing gives the same curve" \
  "grep -q '^done: 6 steps' '$dir/c.log' && diff <(fields '$dir/a.jsonl') <(fields '$dir/c.jsonl') > /dev/null"

"$bin" --opt=sgd > "$dir/e0.log" 2>&1
check "an unknown optimizer is explained" "grep -q \"opt is adamw .*not 'sgd'\" '$dir/e0.log'"
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
rm -rf "$dir"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
