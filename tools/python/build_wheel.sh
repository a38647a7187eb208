#!/usr/bin/env bash
# Builds a pip-installable wheel of the tierd Python package into dist/:
#   tools/python/build_wheel.sh                      # for python3 on the PATH
#   PYTHON=/path/to/python3.12 tools/python/build_wheel.sh   # another CPython (its headers needed)
# The extension is built by Bazel (-c opt) for that interpreter; the shared libraries it needs
# that a plain Linux lacks (gRPC, protobuf, abseil, the CUDA runtime...) go into tierd/.libs,
# which the extension's RPATH names. Then: pip install dist/tierd-*.whl (no torch dependency
# is declared: the package works with whichever torch 2.x is installed, or none for the client).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bazel_env.sh
python="${PYTHON:-$(command -v python3)}"
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' python/tierd/__init__.py)
bazel build "${TIERD_BAZEL_FLAGS[@]}" -c opt --repo_env=TIERD_PYTHON="$python" //python:_tierd.so
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tierd/.libs"
cp python/tierd/*.py "$stage/tierd/"
cp -L bazel-bin/python/_tierd.so "$stage/tierd/_tierd.so"
chmod u+w "$stage/tierd/_tierd.so"
WITH_CUDA_RUNTIME=1 tools/collect_libs.sh "$stage/tierd/.libs" "$stage/tierd/_tierd.so"
mkdir -p dist
"$python" - "$stage" "$version" dist <<'PY'
import base64, hashlib, os, sys, sysconfig, zipfile
stage, version, dist = sys.argv[1:]
tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
info = f"tierd-{version}.dist-info"
files = {}
for root, _, names in os.walk(stage):
    for n in sorted(names):
        path = os.path.join(root, n)
        files[os.path.relpath(path, stage)] = open(path, "rb").read()
files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: tierd\nVersion: {version}\n"
                             "Summary: tierd's client and PyTorch optimizer offload (GPU, DRAM and NVMe as one store)\n"
                             f"Requires-Python: =={sys.version_info[0]}.{sys.version_info[1]}.*\n").encode()
files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: tierd build_wheel.sh\nRoot-Is-Purelib: false\n"
                          f"Tag: {tag}-{tag}-{plat}\n").encode()
def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
record = "".join(f"{name},{digest(data)},{len(data)}\n" for name, data in files.items()) + f"{info}/RECORD,,\n"
files[f"{info}/RECORD"] = record.encode()
wheel = os.path.join(dist, f"tierd-{version}-{tag}-{tag}-{plat}.whl")
with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
    for name, data in files.items():
        mode = 0o755 if name.endswith(".so") or ".so." in name else 0o644
        entry = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
        entry.external_attr = (0o100000 | mode) << 16
        entry.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(entry, data)
print(f"build_wheel: {wheel} ({os.path.getsize(wheel) / 2**20:.1f} MiB)")
PY
