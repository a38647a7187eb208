#!/usr/bin/env bash
# $1: `bazel query --output=graph` of the main binaries' dependencies; $2: the client
# library's dependencies, one label a line. Fails on a cycle between top-level folders
# (tsort finds it) or on the storage engine (io_uring, LeaseTable, Mover, ...) in the client.
set -uo pipefail
graph=$1 client=$2
edges=$(sed -nE 's|^ *"//([^/:"]+)[^"]*" -> "//([^/:"]+)[^"]*".*|\1 \2|p' "$graph" | awk '$1 != $2' | sort -u)
count=$(printf '%s\n' "$edges" | grep -c . || true)
status=0
if [ "$count" -lt 10 ]; then
  echo "FAIL: only $count edges between folders read from $graph: the query's format changed?"; status=1
fi
echo "folder -> folders it depends on:"
printf '%s\n' "$edges" | awk '{a[$1] = a[$1] " " $2} END {for (k in a) print "  " k ":" a[k]}' | sort
if ! printf '%s\n' "$edges" | tsort > /dev/null 2> /tmp/layering_tsort.$$; then
  echo "FAIL: the folders depend on each other in a circle:"; cat /tmp/layering_tsort.$$; status=1
else
  echo "PASS: no cycle between the top-level folders ($count edges)"
fi
rm -f /tmp/layering_tsort.$$
# What a trainer links is the vocabulary and the IPC, never the storage engine: no io_uring,
# no lease table, mover, tier store or daemon-side GPU device (docs/ARCHITECTURE.md).
engine='uring|^//runtime:(lease_table|mover|tier_store|cuda_gpu|gpu_factory|session_service)$|^//server:|^//prefetcher:'
if ! grep -q '^//clients:tierclient$' "$client"; then
  echo "FAIL: $client does not list //clients:tierclient itself"; status=1
elif grep -Eqi "$engine" "$client"; then
  echo "FAIL: //clients:tierclient depends on the storage engine or the daemon:"; grep -Ei "$engine" "$client"; status=1
else
  echo "PASS: the client library links no io_uring, LeaseTable, Mover, TierStore or daemon GPU ($(wc -l < "$client") targets)"
fi
exit $status
