#!/usr/bin/env bash
# Every test: installs what is missing, builds, runs `bazel test //...`, then the same
# under AddressSanitizer + UBSan. The last line is the total: "N passed, N failed"
# (test cases, from each test's XML report; a test target that failed to build or
# crashed without a report counts as one failure).
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh || exit 1
source tools/bazel_env.sh

passed=0
failed=0
skipped=0
count_run() {  # $1: label; counts the reports under bazel-testlogs from the last run
  local label=$1 log=$2
  local p=0 f=0 s=0
  while read -r target status; do
    local xml="bazel-testlogs/${target#//}"
    xml="${xml/://}/test.xml"
    if [ "$status" = "PASSED" ] || [ "$status" = "FAILED" ] || [ "$status" = "FLAKY" ]; then
      if [ -f "$xml" ]; then
        local cases fails skips
        cases=$(grep -o '<testcase ' "$xml" | wc -l)
        fails=$(grep -c '<failure' "$xml" || true)
        skips=$(grep -c 'result="skipped"' "$xml" || true)
        [ "$status" = "FAILED" ] && [ "$fails" -eq 0 ] && fails=1  # crashed after writing XML
        p=$((p + cases - fails - skips)); f=$((f + fails)); s=$((s + skips))
        continue
      fi
    fi
    [ "$status" = "PASSED" ] && { p=$((p + 1)); continue; }
    f=$((f + 1))
  done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|FLAKY|INCOMPLETE)' "$log" |
           sed -E 's/\(cached\) //' | awk '{s=$2; for (i=3;i<=NF;i++) if ($i !~ /^in$|^[0-9.]+s$/) s=s" "$i; print $1, s}')
  echo "$label: $p passed, $f failed, $s skipped"
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

run_pass() {  # $1: label, $2: target patterns left out ("" none), rest: extra bazel flags
  local label=$1 skip=$2; shift 2
  local log
  log=$(mktemp)
  echo "== $label: bazel test //... $skip $*"
  # shellcheck disable=SC2086  # $skip: zero or more patterns
  bazel test "${TIERD_BAZEL_FLAGS[@]}" "$@" --keep_going --test_summary=short -- //... $skip 2>&1 | tee "$log" |
    grep -vE '^(\[|Loading|Analyzing|INFO: From|\(|  /)' || true
  count_run "$label" "$log"
  rm -f "$log"
}

run_pass "tests" ""
# The Python package's extension cannot load into an uninstrumented interpreter: under ASan its
# tests could only report skipped, and building them took minutes.
# CUDA is left out of this pass (the fake GPU stands in): ASan instruments host code only, the
# CUDA host paths run only where a GPU is, and compiling every kernel a second time cost
# ~2.5 of a cold run's minutes on 2 cores.
run_pass "tests under ASan+UBSan" "-//python/..." --config=asan --repo_env=TIERD_CUDA_PATH=none
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
