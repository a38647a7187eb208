# Sourced by the bench scripts for their torchao float8 + torch.compile rows: torchao (a pure-
# Python wheel the GPU machine lacks) from the carried .whl onto PYTHONPATH, unless Python has it.
# Returns 1, saying what to carry, when neither is there.
use_torchao() {
  python3 -c "import torchao" 2> /dev/null && return 0
  if ! ls .whl/torchao-*.whl > /dev/null 2>&1; then
    echo "torchao is not installed: carry .whl with its wheel (docs/BENCHMARKS.md says how to download it)"
    return 1
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/torchao-*.whl &&
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
}
