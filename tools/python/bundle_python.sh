#!/usr/bin/env bash
# Builds the tierd Python extension (-c opt) for another CPython than the dev box's (PYTHON,
# default the lent GPU machine's 3.12, found under pyenv here) and tierd, and puts them with
# the shared libraries that machine lacks into .carry/ (python/_tierd.so, bin/tierd, lib/).
# Then: device run: command="tools/device/python_check.sh", carry=[".carry"].
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bazel_env.sh
python="${PYTHON:-$(ls -d /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -n 1)}"
[ -x "$python" ] || { echo "no Python 3.12 found: PYTHON=/path/to/python3.12 (with its headers)"; exit 1; }
bazel build "${TIERD_BAZEL_FLAGS[@]}" -c opt --repo_env=TIERD_PYTHON="$python" //python:_tierd.so //server:tierd
mkdir -p .carry/python .carry/bin .carry/lib
cp -fL bazel-bin/python/_tierd.so .carry/python/_tierd.so
cp -fL bazel-bin/server/tierd .carry/bin/tierd
tools/collect_libs.sh .carry/lib .carry/python/_tierd.so .carry/bin/tierd
du -sh .carry
