#!/usr/bin/env bash
# tierd-train-gpu's refusals, which come before it touches a GPU (so they run anywhere the
# binary builds): each bad flag exits 1 with a message that says what to do. The training
# itself is checked on the lent GPU machine (tools/device/kernels_check.sh, run_bench.sh).
# Prints "N passed, M failed"; exit 1 on a failure.
set -u
bin="$1"
dir="${TEST_TMPDIR:-/tmp}/gpu_train_main_test.$$"
mkdir -p "$dir"
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED: $1"; cat "$dir/out.log"; fi; }
run() { "$bin" "$@" > "$dir/out.log" 2>&1; echo $? > "$dir/rc"; }

run --offload_policy=tiered
check "an unknown offload policy" "[ \$(cat '$dir/rc') = 1 ] && grep -q 'is none or tierd, not .tiered.' '$dir/out.log'"
run --optimizer_place=host
check "an unknown optimizer place" "[ \$(cat '$dir/rc') = 1 ] && grep -q 'is gpu, cpu or auto, not .host.' '$dir/out.log'"
run --optimizer_place=cpu
check "the CPU optimizer without tierd" "[ \$(cat '$dir/rc') = 1 ] && grep -q 'it needs --offload_policy=tierd' '$dir/out.log'"
run --offload_policy=tierd --gpu_budget=1MiB
check "a GPU budget below the workspace, with the numbers" \
  "[ \$(cat '$dir/rc') = 1 ] && grep -q 'leaves nothing for tierd: the trainer.s workspace alone is' '$dir/out.log'"
run --offload_policy=tierd --gpu_budget=lots
check "a size that is not one" "[ \$(cat '$dir/rc') = 1 ] && grep -q 'sizes like 24GiB' '$dir/out.log'"
run --offload_policy=tierd --gpu_budget=8GiB --tierd_dir="$dir/no-tierd-here"
check "no tierd at the runtime directory" "[ \$(cat '$dir/rc') = 1 ] && grep -q '^tierd-train-gpu: tierd: ' '$dir/out.log'"
run --offload_policy=tierd --optimizer_chunks=0
check "no sub-groups at all" "[ \$(cat '$dir/rc') = 1 ] && grep -q 'optimizer_chunks=0: give 1' '$dir/out.log'"
run --optimizer_chunks=4
check "sub-groups without tierd" "[ \$(cat '$dir/rc') = 1 ] && grep -q 'in pieces: it needs --offload_policy=tierd' '$dir/out.log'"
run --batch_size=0
check "a batch of nothing" "[ \$(cat '$dir/rc') = 1 ] && grep -q 'must be at least 1' '$dir/out.log'"
run --help
check "--help lists the trainer's flags" "grep -q -- '--offload_policy' '$dir/out.log' && grep -q -- '--optimizer_place' '$dir/out.log'"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
