#!/usr/bin/env bash
# planreplay runs a synthetic 1.3B step through the real tiers both ways and says where the GPU
# copies went; bad input gets a plain error.
set -uo pipefail
replay=$1
trainer_graph=$2  # a real trainer's graph (testdata/)
fail=0
for wait in false true; do
  out=$("$replay" --model=1.3b --accum=2 --gpu=20GiB --scale=256 --laps=4 --layout_wait=$wait 2>&1)
  echo "$out" | tail -n 1
  echo "$out" | grep -Eq "^after 2 laps of warm-up, 2 laps: GPU copies placed at the layout's offsets [0-9]+, elsewhere [0-9]+ \(held by a copy off the layout [0-9]+" \
    || { echo "FAIL: layout_wait=$wait: no placement line"; fail=1; }
  echo "$out" | grep -q "static layout: .*planned tensors go to fixed offsets" || { echo "FAIL: the layout did not fit"; fail=1; }
done
waited=$("$replay" --model=1.3b --accum=2 --gpu=20GiB --scale=256 --laps=4 --layout_wait=true 2>&1 | tail -n 1)
echo "$waited" | grep -Eq "planned loads that waited for their range [1-9]" || { echo "FAIL: --layout_wait made no load wait"; fail=1; }
# Copies made on the GPU before the plan (--start_on_gpu): settling moves them to the layout's
# offsets or out of the GPU, and more of the plan's copies then land at their offsets.
on_layout() { echo "$1" | sed -nE "s/^after .* GPU copies placed at the layout's offsets ([0-9]+),.*/\1/p"; }
settled=$("$replay" --model=1.3b --accum=2 --gpu=20GiB --scale=256 --laps=4 --start_on_gpu 2>&1)
unsettled=$("$replay" --model=1.3b --accum=2 --gpu=20GiB --scale=256 --laps=4 --start_on_gpu --settle_layout=false 2>&1)
echo "$settled" | grep -E "^settled into the layout"
echo "$settled" | grep -Eq "^settled into the layout at the start: [0-9]+ copies moved to their offsets, [1-9][0-9]* " \
  || { echo "FAIL: nothing settled from a GPU filled before the plan"; fail=1; }
echo "$unsettled" | grep -q "^settled into the layout" && { echo "FAIL: --settle_layout=false settled"; fail=1; }
a=$(on_layout "$settled"); b=$(on_layout "$unsettled")
echo "at the layout's offsets: settled $a, unsettled $b"
[ -n "$a" ] && [ -n "$b" ] && [ "$a" -gt "$b" ] || { echo "FAIL: settling placed $a at the layout's offsets, not more than $b"; fail=1; }
# The trainer's own graph, first planned at op times 35% too long (its estimates before it
# measured): the op times drift, and a new plan at the measured times would do no better, so
# the plan in force and its layout stay; and more of the copies land at the layout's offsets
# than when the new plan is swapped in anyway (--keep_plan_margin=-1, the old behaviour).
graph_args=(--graph="$trainer_graph" --gpu=21.3GiB --dram=32GiB --scale=256 --laps=5 --plan_op_time_factor=1.35)
kept=$("$replay" "${graph_args[@]}" 2>&1)
swapped=$("$replay" "${graph_args[@]}" --keep_plan_margin=-1 2>&1)
echo "$kept" | grep -Eo "the first plan; kept the plan in force at 1 drift\(s\) \(the latest: .*\)" \
  || { echo "FAIL: the first plan was not kept: $(echo "$kept" | grep '^links assumed')"; fail=1; }
echo "$swapped" | grep -q "replanned 1 time(s) at measured op times" \
  || { echo "FAIL: --keep_plan_margin=-1 did not replan: $(echo "$swapped" | grep '^links assumed')"; fail=1; }
a=$(on_layout "$kept"); b=$(on_layout "$swapped")
echo "the trainer's graph: at the layout's offsets with the first plan kept $a, replanned $b"
[ -n "$a" ] && [ -n "$b" ] && [ "$a" -gt "$b" ] || { echo "FAIL: keeping the plan placed $a, not more than $b"; fail=1; }
# Swapped in, settling after the replan (an experiment, off by default) keeps the new layout
# where the old one's copies would have unravelled it.
replanned=$("$replay" "${graph_args[@]}" --keep_plan_margin=-1 --settle_after_replan 2>&1)
unsettled=$swapped
echo "$unsettled" | grep -q "^settled into the layout after" && { echo "FAIL: settled after a replan by default"; fail=1; }
echo "$replanned" | grep -E "^settled into the layout after"
echo "$replanned" | grep -Eq "^settled into the layout after 1 replan\(s\): [0-9]+ copies moved to their offsets, [1-9][0-9]* " \
  || { echo "FAIL: nothing settled after the replan"; fail=1; }
a=$(on_layout "$replanned"); b=$(on_layout "$unsettled")
echo "the trainer's graph, replanned: at the layout's offsets settled $a, unsettled $b"
[ -n "$a" ] && [ -n "$b" ] && [ "$a" -gt $((2 * b)) ] || { echo "FAIL: settling after the replan placed $a, not over twice $b (not after it)"; fail=1; }
bad=$("$replay" --model=1.3b --scale=0.5 2>&1); code=$?
[ "$code" = 1 ] && [ "$bad" = "planreplay: --scale must be >= 1" ] || { echo "FAIL: --scale=0.5 gave $code: $bad"; fail=1; }
none=$("$replay" 2>&1); code=$?
[ "$code" = 1 ] && echo "$none" | grep -q "give the step as --graph FILE or as --model" || { echo "FAIL: no graph gave $code: $none"; fail=1; }
missing=$("$replay" --graph=/nonexistent.yaml 2>&1); code=$?
[ "$code" = 1 ] && echo "$missing" | grep -q "/nonexistent.yaml" || { echo "FAIL: a missing file gave $code: $missing"; fail=1; }
exit $fail
