#!/usr/bin/env bash
# scripts/gpu_check.d/python.sh [OUTDIR] — the Python package on the GPU (issue 20): builds spattn._core with the
# CUDA engines into build-py/ (the package is then importable from build-py/python), runs the Python tests
# (tests/python: the torch operator on CUDA included: opcheck, autograd through the GPU backward, torch.compile
# fullgraph, CUDA graphs) and bench/python_overhead.py --device cuda. Logs and JSON go to OUTDIR (else $SPATTN_OUT,
# else ./out). Needs torch, nanobind and pytest on the machine (the GPU machine has them).
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler: the module is loaded into the PyTorch process (scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
OUTD=${1:-${SPATTN_OUT:-$ROOT/out}}
mkdir -p "$OUTD"
OUTD=$(cd "$OUTD" && pwd)
BUILD=$ROOT/build-py
rc=0
nb=$(python3 -c "import nanobind; print(nanobind.cmake_dir())" 2>/dev/null) || { echo "python.sh: no nanobind"; exit 2; }
SPATTN_EXTRA_CMAKE="-DSPATTN_PYTHON=ON -DSPATTN_TESTS=OFF -DSPATTN_TOOLS=OFF -Dnanobind_DIR=$nb" \
  gpu_build "$BUILD" "$OUTD/py_build.log" _core || exit 1
echo "== python: tests ($(elapsed))"
PYTHONPATH=$BUILD/python timeout 400 python3 -m pytest -q "$ROOT/tests/python" >"$OUTD/py_tests.log" 2>&1 || rc=1
tail -3 "$OUTD/py_tests.log"
grep -E "^(FAILED|ERROR)" "$OUTD/py_tests.log" | head -20
echo "== python: host overhead ($(elapsed))"
PYTHONPATH=$BUILD/python python3 "$ROOT/bench/python_overhead.py" --device cuda --json "$OUTD/py_overhead.json" \
  2>&1 | tail -12 || rc=1
echo "python.sh: rc $rc ($(elapsed))"
exit $rc
