#!/usr/bin/env bash
# scripts/gpu_check.d/runtime_masks.sh [OUTDIR] — masks chosen at run time on the GPU (issue 44): builds spattn._core
# with the CUDA engines into build-py/ (as python.sh), runs tests/python/test_runtime_masks.py (the device path
# without host synchronisation, a CUDA graph replayed with new boundaries) and bench/runtime_bench.py (the issue's
# bar cases against the static plans and FlexAttention; within its 420 s budget) into OUTDIR/runtime.json. The C++ GPU
# tests (tests/gpu/runtime_mask_gpu_test.cpp) run in gpu_check.sh's step 2 (ctest -L gpu).
set -uo pipefail
unset CXX CC CUDAHOSTCXX
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
OUTD=${1:-${SPATTN_OUT:-$ROOT/out}}
mkdir -p "$OUTD"
OUTD=$(cd "$OUTD" && pwd)
BUILD=$ROOT/build-py
rc=0
nb=$(python3 -c "import nanobind; print(nanobind.cmake_dir())" 2>/dev/null) || { echo "runtime_masks.sh: no nanobind"; exit 2; }
SPATTN_EXTRA_CMAKE="-DSPATTN_PYTHON=ON -DSPATTN_TESTS=OFF -DSPATTN_TOOLS=OFF -Dnanobind_DIR=$nb" \
  gpu_build "$BUILD" "$OUTD/runtime_build.log" _core || exit 1
echo "== runtime masks: tests ($(elapsed))"
PYTHONPATH=$BUILD/python timeout 400 python3 -m pytest -q "$ROOT/tests/python/test_runtime_masks.py" \
  >"$OUTD/runtime_tests.log" 2>&1 || fail "test_runtime_masks.py"
tail -3 "$OUTD/runtime_tests.log"
echo "== runtime masks: bench ($(elapsed))"
PYTHONPATH=$BUILD/python timeout 560 python3 "$ROOT/bench/runtime_bench.py" --json "$OUTD/runtime.json" \
  >"$OUTD/runtime_bench.log" 2>&1 || fail "runtime_bench.py"
tail -5 "$OUTD/runtime_bench.log"
echo "runtime_masks.sh: rc $rc ($(elapsed))"
exit $rc
