#!/usr/bin/env bash
# Data-parallel training of the CPU trainer under mpirun, on the tiny model, against one
# process with the same global batch. $1: tierd-train, $2: comm/mpirun_local.sh, $3: tierd.
# One PASS/FAIL line per check; the last line counts them.
set -uo pipefail
bin=$1 mpirun=$2 tierd=$3
dir=${TEST_TMPDIR:-/tmp}/dp; rm -rf "$dir"; mkdir -p "$dir"
export TIERD_CPU_THREADS=1  # two cores shared by up to four ranks
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass+1)); echo "PASS: $1"; else fail=$((fail+1)); echo "FAIL: $1"; fi; }
common="--device=cpu --steps=10 --warmup=2 --batch_size=2 --seq_len=32 --eval_every=-1"
# The step's numbers a run must share with another (not its time, tokens or bytes).
# The steps' lines (not the run plan's) without what differs between runs that compute the same.
fields() { grep -v '^{"plan": ' "$1" | sed -E 's/, "seconds": [^,]*//; s/, "tokens": [^,]*//; s/, "comm_seconds": [^,]*//; s/, "bytes_sent": [^}]*//'; }
# The largest relative difference of loss and grad_norm between two metrics files.
max_rel() {
  paste -d' ' <(sed -E 's/.*"loss": ([^,]*).*"grad_norm": ([^,]*).*/\1 \2/' "$1") \
              <(sed -E 's/.*"loss": ([^,]*).*"grad_norm": ([^,]*).*/\1 \2/' "$2") |
    awk 'function a(x) { return x < 0 ? -x : x } { for (i = 1; i <= 2; i++) { d = a($i - $(i+2)) / a($(i+2)); if (d > m) m = d } }
         END { printf "%.2g\n", m + 0 }'
}
lines() { grep -c '^{"step": ' "$1"; }
bytes() { sed -E 's/.*"bytes_sent": ([0-9.]+).*/\1/' "$1" | awk '{ s += $1 } END { printf "%.0f\n", s / NR }'; }
dp() { local n=$1; shift; "$mpirun" -np "$n" "$bin" $common "$@"; }

# 1. Dense data-parallel = one process with the same global batch, up to the order of the
#    reduction: the ranks sum their own micro-batches' gradients, then each other's, where one
#    process adds them one after the other (its GEMMs accumulate into the gradient). Bound:
#    1e-5 relative on every loss and gradient norm over 10 steps (measured: ~1e-6).
"$bin" $common --grad_accum_steps=2 --metrics="$dir/one2.jsonl" > "$dir/one2.log" 2>&1
"$bin" $common --grad_accum_steps=4 --metrics="$dir/one4.jsonl" > "$dir/one4.log" 2>&1
dp 2 --metrics="$dir/dp2.jsonl" > "$dir/dp2.log" 2>&1
dp 4 --metrics="$dir/dp4.jsonl" > "$dir/dp4.log" 2>&1
d2=$(max_rel "$dir/dp2.jsonl" "$dir/one2.jsonl"); d4=$(max_rel "$dir/dp4.jsonl" "$dir/one4.jsonl")
check "2 ranks x 1 micro-batch = 1 process x 2 (largest relative difference $d2 <= 1e-5)" \
  "[ \"\$(lines $dir/dp2.jsonl)\" = 10 ] && awk 'BEGIN { exit !($d2 <= 1e-5) }'"
check "4 ranks x 1 micro-batch = 1 process x 4 (largest relative difference $d4 <= 1e-5)" \
  "[ \"\$(lines $dir/dp4.jsonl)\" = 10 ] && awk 'BEGIN { exit !($d4 <= 1e-5) }'"
check "the ranks and the global batch are said" "grep -q 'x 2 ranks' '$dir/dp2.log' && grep -q 'rank 1: rank 1 of 2 (local 1 of 2), launched by mpirun' '$dir/dp2.log'"

# 2. ZeRO-2 = dense: a reduce-scatter sums as the all-reduce does and AdamW is elementwise,
#    so without clipping (whose norm ZeRO-2 sums slice by slice) the same bits.
dp 2 --clip=0 --metrics="$dir/dense-noclip.jsonl" > /dev/null 2>&1
dp 2 --clip=0 --zero=2 --metrics="$dir/zero2-noclip.jsonl" > "$dir/zero2.log" 2>&1
check "ZeRO-2 on 2 ranks = dense, bit for bit (no clipping)" \
  "[ \"\$(lines $dir/zero2-noclip.jsonl)\" = 10 ] && diff <(fields $dir/dense-noclip.jsonl) <(fields $dir/zero2-noclip.jsonl) > /dev/null"
dp 2 --clip=0 --opt=adamw8bit --metrics="$dir/dense8.jsonl" > /dev/null 2>&1
dp 2 --clip=0 --opt=adamw8bit --zero=2 --metrics="$dir/zero2-8.jsonl" > /dev/null 2>&1
check "ZeRO-2 with 8-bit moments = dense with 8-bit moments, bit for bit" \
  "[ \"\$(lines $dir/zero2-8.jsonl)\" = 10 ] && diff <(fields $dir/dense8.jsonl) <(fields $dir/zero2-8.jsonl) > /dev/null"
dp 4 --zero=2 --metrics="$dir/zero2-4.jsonl" > /dev/null 2>&1
z4=$(max_rel "$dir/zero2-4.jsonl" "$dir/dp4.jsonl")
check "ZeRO-2 on 4 ranks with clipping = dense (largest relative difference $z4 <= 1e-5)" \
  "[ \"\$(lines $dir/zero2-4.jsonl)\" = 10 ] && awk 'BEGIN { exit !($z4 <= 1e-5) }'"

# 2b. ZeRO-3 = ZeRO-2: the forward and backward read the same parameters (all-gathered as they
#     are reached instead of after the step), and the state is stepped slice by slice alike:
#     the same bits, with clipping too. What it costs: one all-gather of the parameters more a
#     step (the forward's and the backward's, none after the step): 1.5x ZeRO-2's bytes.
dp 2 --clip=0 --zero=3 --metrics="$dir/zero3-noclip.jsonl" > "$dir/zero3.log" 2>&1
check "ZeRO-3 on 2 ranks = ZeRO-2, bit for bit (no clipping)" \
  "[ \"\$(lines $dir/zero3-noclip.jsonl)\" = 10 ] && diff <(fields $dir/zero2-noclip.jsonl) <(fields $dir/zero3-noclip.jsonl) > /dev/null"
dp 2 --clip=0 --opt=adamw8bit --zero=3 --metrics="$dir/zero3-8.jsonl" > /dev/null 2>&1
check "ZeRO-3 with 8-bit moments = ZeRO-2 with them, bit for bit" \
  "[ \"\$(lines $dir/zero3-8.jsonl)\" = 10 ] && diff <(fields $dir/zero2-8.jsonl) <(fields $dir/zero3-8.jsonl) > /dev/null"
dp 4 --zero=3 --metrics="$dir/zero3-4.jsonl" > /dev/null 2>&1
check "ZeRO-3 on 4 ranks with clipping = ZeRO-2, bit for bit" \
  "[ \"\$(lines $dir/zero3-4.jsonl)\" = 10 ] && diff <(fields $dir/zero2-4.jsonl) <(fields $dir/zero3-4.jsonl) > /dev/null"
check "each rank keeps its slice of the parameters, said" \
  "grep -q 'ZeRO-3 (gradients reduce-scattered, each rank steps 1/N of the state and keeps [0-9]* of the [0-9]* parameters' '$dir/zero3.log'"
z2_bytes=$(bytes "$dir/zero2-noclip.jsonl"); z3_bytes=$(bytes "$dir/zero3-noclip.jsonl")
check "ZeRO-3 sends $z3_bytes B a step, more than ZeRO-2's $z2_bytes B (the gathers)" "[ $z3_bytes -gt $z2_bytes ]"
ck3="--checkpoint_dir=$dir/ck3 --checkpoint_every=4"
"$mpirun" -np 2 env TIERD_TRAIN_SIGKILL_AT_STEP=6 "$bin" $common --zero=3 $ck3 > /dev/null 2>&1  # both killed at 6
dp 2 --zero=3 $ck3 --resume --metrics="$dir/zero3-resumed.jsonl" > "$dir/zero3-resumed.log" 2>&1
dp 2 --zero=3 --metrics="$dir/zero3-straight.jsonl" > /dev/null 2>&1
check "ZeRO-3 resumes from its checkpoint (step 4) and continues the straight run bit for bit" \
  "grep -q 'at step 4' '$dir/zero3-resumed.log' && diff <(fields $dir/zero3-straight.jsonl | tail -6) <(fields $dir/zero3-resumed.jsonl) > /dev/null"
dp 2 --zero=2 $ck3 --resume > "$dir/zero3-as-2.log" 2>&1
check "a ZeRO-3 checkpoint is refused by a ZeRO-2 run, naming both" \
  "grep -q 'the state is rank [01] of 2, ZeRO-3; this run is rank [01] of 2, ZeRO-2' '$dir/zero3-as-2.log'"

# 3. TopK 5% with error feedback: what it sends, and that it trains.
sparse="--steps=40 --sparse_grad_ratio=0.05"
dp 2 --steps=40 --metrics="$dir/dense40.jsonl" > /dev/null 2>&1
dp 2 $sparse --metrics="$dir/sparse.jsonl" > "$dir/sparse.log" 2>&1
dense_bytes=$(bytes "$dir/dense40.jsonl"); sparse_bytes=$(bytes "$dir/sparse.jsonl")
first=$(grep -m1 "^{\"step\": " "$dir/sparse.jsonl" | sed -E 's/.*"loss": ([^,]*).*/\1/'); last=$(tail -1 "$dir/sparse.jsonl" | sed -E 's/.*"loss": ([^,]*).*/\1/')
dense_last=$(tail -1 "$dir/dense40.jsonl" | sed -E 's/.*"loss": ([^,]*).*/\1/')
check "TopK 5% sends $sparse_bytes B a step, <= 10% of dense's $dense_bytes B" \
  "[ \"\$(lines $dir/sparse.jsonl)\" = 40 ] && [ \$((sparse_bytes * 10)) -le $dense_bytes ]"
check "TopK 5% trains: loss $first -> $last in 40 steps (dense: $dense_last)" "awk 'BEGIN { exit !($last < $first - 1) }'"
dp 2 $sparse --compare_metrics="$dir/dense40.jsonl" --plot="$dir/sparse.png" > "$dir/compare.log" 2>&1
check "--compare_metrics: the dense run's final loss beside this one's, and a plot" \
  "grep -q 'dense40.jsonl at step 40: ' '$dir/compare.log' && [ -s '$dir/sparse.png' ]"
check "the sync is described" "grep -q 'sparse gradients: 21 of 21 tensors TopK (5.0% of the elements' '$dir/sparse.log'"
dp 2 $sparse --sparse_sync=update --sparse_grad_ratio_by='.*norm.*=1' --opt=lion --lr=1e-3 --sparse_warmup=10 \
  --metrics="$dir/update.jsonl" > "$dir/update.log" 2>&1
check "sparse updates with Lion, dense norms and a warm-up run 40 steps" \
  "[ \"\$(lines $dir/update.jsonl)\" = 40 ] && grep -q 'sparse updates: 16 of 21 tensors' '$dir/update.log'"

# 3b. Momentum mode (--sparse_sync=momentum): dense AdamW through the warm-up (the same bits
#     as dense), then each rank's momentum TopK'd over the frozen second moment: it sends what
#     TopK sends, trains, and resumes bit for bit (velocity, residual and frozen v are state).
#     How close to dense it ends over 600 steps is a benchmark (docs/BENCHMARKS.md).
dp 2 $sparse --sparse_sync=momentum --sparse_warmup=10 --metrics="$dir/momentum.jsonl" > "$dir/momentum.log" 2>&1
mom_first=$(grep -m1 "^{\"step\": " "$dir/momentum.jsonl" | sed -E 's/.*"loss": ([^,]*).*/\1/')
mom_last=$(tail -1 "$dir/momentum.jsonl" | sed -E 's/.*"loss": ([^,]*).*/\1/')
mom_bytes=$(tail -1 "$dir/momentum.jsonl" | sed -E 's/.*"bytes_sent": ([0-9.]+).*/\1/')
check "momentum mode: the warm-up's 10 steps are dense's, bit for bit" \
  "diff <(fields $dir/dense40.jsonl | head -10) <(fields $dir/momentum.jsonl | head -10) > /dev/null"
check "momentum mode then sends $mom_bytes B a step, <= 10% of dense's $dense_bytes B" \
  "[ \"\$(lines $dir/momentum.jsonl)\" = 40 ] && awk 'BEGIN { exit !($mom_bytes * 10 <= $dense_bytes) }'"
check "momentum mode trains: loss $mom_first -> $mom_last in 40 steps (dense: $dense_last)" \
  "awk 'BEGIN { exit !($mom_last < $mom_first - 1) }'"
check "momentum mode is described" "grep -q 'sparse momenta: 21 of 21 tensors TopK .* dense AdamW for 10 steps, then its second moment frozen' '$dir/momentum.log'"
ckm="--checkpoint_dir=$dir/ckm --checkpoint_every=4"
mom="--sparse_grad_ratio=0.05 --sparse_sync=momentum --sparse_warmup=3"
dp 2 $mom --metrics="$dir/mom-straight.jsonl" > /dev/null 2>&1
"$mpirun" -np 2 env TIERD_TRAIN_SIGKILL_AT_STEP=7 "$bin" $common $mom $ckm > /dev/null 2>&1  # both killed at 7
dp 2 $mom $ckm --resume --metrics="$dir/mom-resumed.jsonl" > "$dir/mom-resumed.log" 2>&1
check "momentum mode resumes from step 4 and continues the straight run bit for bit" \
  "grep -q 'at step 4' '$dir/mom-resumed.log' && diff <(fields $dir/mom-straight.jsonl | tail -6) <(fields $dir/mom-resumed.jsonl) > /dev/null"
dp 2 --sparse_grad_ratio=0.05 --sparse_sync=momentum > "$dir/mom-nowarm.log" 2>&1
check "momentum mode without a warm-up is refused, saying why" "grep -q 'give --sparse_warmup=N' '$dir/mom-nowarm.log'"
dp 2 $mom --opt=adamw8bit > "$dir/mom-8bit.log" 2>&1
check "momentum mode with 8-bit moments is refused" "grep -q 'momentum works on AdamW.s fp32 moments' '$dir/mom-8bit.log'"

# 4. Local steps: the parameters averaged every 4 steps, a quarter of the traffic.
dp 2 --sync_every=4 --steps=8 --metrics="$dir/local.jsonl" > "$dir/local.log" 2>&1
check "--sync_every=4 sends a quarter of dense's bytes" \
  "grep -q 'a dense all-reduce of every gradient .* (25.0%)' '$dir/local.log'"

# 5. A rank killed mid-run: the other stops within seconds, saying so; the run resumes
#    from the newest checkpoint every rank has and continues the straight run bit for bit.
#    "Within seconds" against the same job's 10 steps run straight on this machine, whatever its
#    load (a fixed bound failed once under ASan on 2 busy cores: 22 s for 6 steps and the stop).
ck="--checkpoint_dir=$dir/ck --checkpoint_every=4"
start=$(date +%s.%N)
dp 2 --checkpoint_dir="$dir/ck-straight" --checkpoint_every=4 --metrics="$dir/straight.jsonl" > /dev/null 2>&1
straight_took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
start=$(date +%s.%N)
"$mpirun" -np 1 "$bin" $common $ck --metrics="$dir/killed.jsonl" : \
  -np 1 env TIERD_TRAIN_SIGKILL_AT_STEP=6 "$bin" $common $ck > "$dir/killed.log" 2>&1
killed=$?
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
check "rank 1 killed at step 6: the job ends (exit $killed) in $took s, within 10 s of the straight 10 steps' $straight_took s" \
  "[ $killed != 0 ] && awk 'BEGIN { exit !($took < $straight_took + 10) }'"
check "the other rank or the launcher says why" \
  "grep -qE 'stopped by the launcher|exited on signal 9' '$dir/killed.log'"
dp 2 $ck --resume --metrics="$dir/killed.jsonl" > "$dir/resumed.log" 2>&1
check "the resume starts at step 4 on both ranks" \
  "[ \$(grep -c 'resumed from .*rank-[01]/ckpt-00000004.bin at step 4' '$dir/resumed.log') = 2 ]"
check "the resumed run's losses are the straight run's, bit for bit" \
  "diff <(fields $dir/straight.jsonl) <(fields $dir/killed.jsonl) > /dev/null"

# 6. What cannot be done is said.
"$bin" $common --resume --checkpoint_dir="$dir/ck" > "$dir/one-resume.log" 2>&1
check "one process cannot resume a 2-rank run's checkpoints, and is told how" \
  "grep -q 'holds a data-parallel run.s checkpoints' '$dir/one-resume.log'"
RANK=0 WORLD_SIZE=2 "$bin" $common > "$dir/torchrun.log" 2>&1
check "torchrun's environment on the CPU trainer: use mpirun" "grep -q 'start them with mpirun -np 2' '$dir/torchrun.log'"
dp 2 --resume --checkpoint_dir="$dir/empty" > "$dir/no-ckpt.log" 2>&1
check "2 ranks resuming where no rank has a checkpoint: said, not a hang" \
  "grep -q 'some rank has no checkpoint that verifies' '$dir/no-ckpt.log'"
"$bin" $common --zero=1 > "$dir/zero1.log" 2>&1
check "--zero=1 is refused with the stages there are" "grep -q 'zero is 0 (each rank keeps the whole state), 2 (' '$dir/zero1.log'"
dp 2 --zero=2 --sparse_grad_ratio=0.05 > "$dir/both.log" 2>&1
check "ZeRO-2 with a sparse sync is refused" "grep -q 'use one or the other' '$dir/both.log'"

# 7. Through one tierd: each rank its own session; the residuals are tierd tensors.
rt=/tmp/tierd-dp-$$; rm -rf "$rt"; mkdir -p "$rt" "$dir/nvme"  # short: a socket path has 108 bytes
"$tierd" --gpu=fake --gpu_bytes=16MiB --dram_bytes=64MiB --nvme_dir="$dir/nvme" --nvme_bytes=96MiB \
  --runtime_dir="$rt/run" > "$rt/tierd.log" 2>&1 &
tierd_pid=$!
for _ in $(seq 100); do [ -S "$rt/run/tierd.grpc.sock" ] && break; sleep 0.1; done
dp 2 --sparse_grad_ratio=0.05 --metrics="$dir/sparse10.jsonl" > /dev/null 2>&1
dp 2 --sparse_grad_ratio=0.05 --offload_policy=tierd --tierd_dir="$rt/run" --tierd_dram=24MiB \
  --metrics="$dir/sparse-tierd.jsonl" > "$dir/sparse-tierd.log" 2>&1
dp 2 --zero=3 --offload_policy=tierd --tierd_dir="$rt/run" --tierd_dram=24MiB --metrics="$dir/zero3-tierd.jsonl" \
  > "$dir/zero3-tierd.log" 2>&1
kill -TERM $tierd_pid; wait $tierd_pid; cp "$rt/tierd.log" "$dir/"; rm -rf "$rt"
check "2 ranks through one tierd (a session each) = in plain buffers, bit for bit" \
  "[ \"\$(lines $dir/sparse-tierd.jsonl)\" = 10 ] && diff <(fields $dir/sparse10.jsonl) <(fields $dir/sparse-tierd.jsonl) > /dev/null"
check "ZeRO-3's parameter slices as tierd tensors = in plain buffers, bit for bit" \
  "[ \"\$(lines $dir/zero3-tierd.jsonl)\" = 10 ] && diff <(fields $dir/zero3-straight.jsonl) <(fields $dir/zero3-tierd.jsonl) > /dev/null"
check "tierd served both ranks' sessions" "[ \$(grep -c 'tierd-train-rank-[01]' '$dir/tierd.log') -ge 2 ]"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
