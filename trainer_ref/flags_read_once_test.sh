#!/usr/bin/env bash
# Fails when a trainer source other than train_flags.cc reads a flag (absl::GetFlag), naming
# each place: the settings are resolved once (ReadRunSettings) and handed down.
set -u
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-}" 2> /dev/null || true
files=$(find trainer_ref -name '*.cc' -o -name '*.h' -o -name '*.cu' | sort)
count=$(printf '%s\n' "$files" | grep -c .)
if [ "$count" -lt 50 ]; then echo "FAIL: only $count trainer sources found from $(pwd)"; echo "0 passed, 1 failed"; exit 1; fi
readers=$(printf '%s\n' "$files" | grep -v '^trainer_ref/train_flags\.cc$' | xargs grep -n 'GetFlag(' || true)
if [ -n "$readers" ]; then
  echo "FAIL: flags read outside trainer_ref/train_flags.cc (add the setting to RunSettings instead):"
  echo "$readers"
  echo "0 passed, 1 failed"; exit 1
fi
if ! grep -q 'GetFlag(FLAGS_gpu_budget)' trainer_ref/train_flags.cc; then
  echo "FAIL: train_flags.cc reads no --gpu_budget: is this the trainer's source?"; echo "0 passed, 1 failed"; exit 1
fi
echo "PASS: of $count trainer sources only train_flags.cc reads flags"
echo "1 passed, 0 failed"
