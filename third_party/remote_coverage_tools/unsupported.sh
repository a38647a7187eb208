#!/bin/sh
echo "coverage tools are not available in this offline Bazel setup" >&2
exit 1
