#!/usr/bin/env bash
# Copies into DEST the shared libraries the given binaries resolve (ldd) that another Linux may
# lack: every one except glibc's, libstdc++/libgcc (any C++ toolchain's runtime has them) and the
# GPU driver's. The CUDA toolkit's (cudart, cuBLAS) are left out too — the lent GPU machine has
# them — unless WITH_CUDA_RUNTIME=1 (a wheel for any machine with a driver).
#   tools/collect_libs.sh DEST BINARY...
# Fails naming them if a binary has libraries that did not resolve here.
set -euo pipefail
dest=$1; shift
mkdir -p "$dest"
skip='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libstdc\+\+|libgcc_s|libcuda\.so|libnvidia'
[ "${WITH_CUDA_RUNTIME:-0}" = 1 ] || skip="$skip|libcudart|libcublas"
skip="$skip)"
if ldd "$@" | grep 'not found'; then echo "collect_libs: unresolved libraries above"; exit 1; fi
for binary in "$@"; do
  ldd "$binary" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] || cp -fL "$path" "$dest/"
done
