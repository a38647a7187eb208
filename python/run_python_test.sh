#!/usr/bin/env bash
# A Python test of the tierd package against the real daemon: $1 the interpreter the
# extension was built for, $2 the test file, $3 tierd, $4 _tierd.so, [--asan]. Puts the
# package in a scratch site directory, starts tierd on its fake GPU (TIERD_TEST_GPU=cuda on a
# machine with one: tools/device/python_check.sh) (real shared memory,
# real io_uring files), runs the file (its cases go to the XML report), stops tierd and
# fails if it did not exit cleanly.
set -uo pipefail
python=$1 test_file=$2 tierd_bin=$3 extension=$4
scratch="${TEST_TMPDIR:-$(mktemp -d)}"
xml="${XML_OUTPUT_FILE:-$scratch/report.xml}"
if [ "${5:-}" = "--asan" ]; then
  # An ASan-built extension cannot load into an interpreter without ASan's runtime first.
  printf '<testsuites><testsuite name="%s" tests="1"><testcase name="all" classname="%s" result="skipped"><skipped message="ASan build: the extension does not load into an uninstrumented Python"/></testcase></testsuite></testsuites>\n' \
    "$(basename "$test_file" .py)" "$(basename "$test_file" .py)" > "$xml"
  echo "skipped under ASan (the extension does not load into an uninstrumented Python)"
  exit 0
fi
site="$scratch/site"; mkdir -p "$site/tierd"
cp "$(dirname "$test_file")"/tierd/*.py "$site/tierd/"
cp "$(dirname "$test_file")"/test_util.py "$test_file" "$site/"
cp "$extension" "$site/tierd/_tierd.so"
runtime=$(mktemp -d /tmp/tierd-py-XXXXXX)  # short: a Unix socket's path has 107 bytes
mkdir -p "$scratch/nvme"; : > "$scratch/tierd.log"
"$tierd_bin" --gpu="${TIERD_TEST_GPU:-fake}" --gpu_bytes=64MiB --dram_bytes=256MiB --nvme_dir="$scratch/nvme" --nvme_bytes=512MiB \
  --runtime_dir="$runtime" > "$scratch/tierd.log" 2>&1 &
pid=$!
for _ in $(seq 200); do grep -q "tierd: ready" "$scratch/tierd.log" && break; sleep 0.05; done
if ! grep -q "tierd: ready" "$scratch/tierd.log"; then echo "tierd did not start:"; cat "$scratch/tierd.log"; exit 1; fi
examples="$(cd "$(dirname "$test_file")/../examples" && pwd)"
PYTHONPATH="$site" TIERD_DIR="$runtime" TIERD_BIN="$tierd_bin" TIERD_XML="$xml" TIERD_SCRATCH="$scratch" \
  TIERD_EXAMPLES="$examples" \
  "$python" "$site/$(basename "$test_file")"
status=$?
if kill -0 $pid 2>/dev/null; then
  kill -TERM $pid; wait $pid; rc=$?
  [ $rc -eq 0 ] || { echo "tierd exited with $rc:"; tail -n 20 "$scratch/tierd.log"; status=1; }
fi
rm -rf "$runtime"
exit $status
