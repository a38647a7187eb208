#!/usr/bin/env bash
# $1: comm/mpirun_local.sh, $2: the check binary; runs it on 1, 2 and 4 ranks.
set -uo pipefail
mpirun=$1 check=$2
status=0
for n in 1 2 4; do
  if out=$("$mpirun" -np "$n" "$check" 2>&1); then
    echo "PASS: $n rank(s): $(echo "$out" | grep -c ' 0 failed') of $n ranks report 0 failed"
    [ "$(echo "$out" | grep -c ' 0 failed')" = "$n" ] || status=1
  else
    echo "FAIL: $n rank(s):"; echo "$out"; status=1
  fi
done
exit $status
