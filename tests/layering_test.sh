#!/usr/bin/env bash
# $1: `bazel query --output=graph` of the main binaries' dependencies; $2: the client
# library's dependencies, one label a line. Fails on a cycle between top-level folders
# (tsort finds it) or on io_uring in the client.
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
if grep -qi uring "$client"; then
  echo "FAIL: //clients:tierclient depends on io_uring:"; grep -i uring "$client"; status=1
elif ! grep -q '^//clients:tierclient$' "$client"; then
  echo "FAIL: $client does not list //clients:tierclient itself"; status=1
else
  echo "PASS: the client library does not link io_uring ($(wc -l < "$client") targets)"
fi
exit $status
