#!/usr/bin/env bash
# A plain Python test file ($2, run by $1) whose cases go to Bazel's XML report (python/test_util.py).
set -uo pipefail
python=$1 test_file=$2
PYTHONPATH="$(cd "$(dirname "$test_file")/../../python" && pwd):${PYTHONPATH:-}" \
  TIERD_XML="${XML_OUTPUT_FILE:-/dev/null}" exec "$python" "$test_file"
