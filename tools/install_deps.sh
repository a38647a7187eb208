#!/usr/bin/env bash
# Installs the Debian 12 packages tierd needs to build and test. Idempotent: when
# everything is present it prints nothing and exits 0. Needs root (or sudo).
set -euo pipefail

packages=(
  bazel-bootstrap bazel-rules-java bazel-rules-proto bazel-skylib
  g++ pkg-config python3 python3-dev pybind11-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  liburing-dev libopenmpi-dev openmpi-bin libboost-dev libcivetweb-dev libgtest-dev libbenchmark-dev libyaml-cpp-dev zlib1g-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install_deps: installing ${#missing[@]} missing package(s): ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"
