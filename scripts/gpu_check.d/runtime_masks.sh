#!/usr/bin/env bash
# scripts/gpu_check.d/runtime_masks.sh [OUTDIR] — masks chosen at run time on the GPU (issue 44), in one call:
#   1. builds spattn._core with the CUDA engines and the run-time mask tests into build-py/ (GoogleTest from the system
#      or from .gtest/, as gpu_check.sh);
#   2. the C++ tests: tests/gpu/runtime_mask_gpu_test.cpp (every device-path case against the reference engine, CUDA
#      graphs replayed with new mask contents, the host path refused under no_host and inside captures), and the CPU
#      ones (runtime_mask_test, runtime_tiles_test);
#   3. tests/python/test_runtime_masks.py (no host synchronisation under torch's sync debug mode "error", graphs);
#   4. bench/runtime_bench.py (the bar's cases; RUNTIME_BENCH_ARGS, default "--budget-s 150") into
#      OUTDIR/h200-runtime.json, the baseline's rows (copy it to bench/baselines/ to commit it);
#   5. compute-sanitizer memcheck on the device-path GPU tests (OUTDIR/runtime_memcheck.log).
# About 5 minutes on a 16-core H200 machine. Exit status 0 when every step passed.
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler: the module is loaded into the PyTorch process (scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
nb=$(python3 -c "import nanobind; print(nanobind.cmake_dir())" 2>/dev/null) || { echo "runtime_masks.sh: no nanobind"; exit 2; }
export SPATTN_EXTRA_CMAKE="-DSPATTN_PYTHON=ON -DSPATTN_TESTS=ON -DSPATTN_TOOLS=OFF -Dnanobind_DIR=$nb"
# Its own build even under gpu_check.sh (SPATTN_BUILD emptied): the Python tests need the module in it.
SPATTN_BUILD= gpu_script_setup "${1:-}" build-py runtime_build.log _core runtime_mask_gpu_test runtime_mask_test \
  runtime_tiles_test || exit 1
rc=0

echo "== runtime masks: C++ tests ($(elapsed))"
for t in runtime_mask_gpu_test runtime_mask_test runtime_tiles_test; do
  timeout 300 "$BUILD/tests/$t" >"$OUTD/$t.log" 2>&1 || fail "$t"
  echo "$t: $(grep -E "^\[  (PASSED|FAILED)" "$OUTD/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$OUTD/$t.log" | head -10
done

echo "== runtime masks: Python tests ($(elapsed))"
PYTHONPATH=$BUILD/python timeout 400 python3 -m pytest -q "$ROOT/tests/python/test_runtime_masks.py" \
  >"$OUTD/runtime_tests.log" 2>&1 || fail "test_runtime_masks.py"
tail -3 "$OUTD/runtime_tests.log"
grep -E "^(FAILED|ERROR)" "$OUTD/runtime_tests.log" | head -10

echo "== runtime masks: bench ($(elapsed))"
# shellcheck disable=SC2086  # RUNTIME_BENCH_ARGS is a list of arguments
PYTHONPATH=$BUILD/python timeout 480 python3 "$ROOT/bench/runtime_bench.py" --json "$OUTD/h200-runtime.json" \
  ${RUNTIME_BENCH_ARGS:---budget-s 150} >"$OUTD/runtime_bench.log" 2>&1 || fail "runtime_bench.py"
tail -5 "$OUTD/runtime_bench.log"

echo "== runtime masks: compute-sanitizer memcheck ($(elapsed))"
if command -v compute-sanitizer >/dev/null; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/tests/runtime_mask_gpu_test" \
    --gtest_filter='RuntimeMaskGpu.*Replayed*:RuntimeMaskGpu.HostPath*:RuntimeMaskGpu.DocumentsBackward' \
    >"$OUTD/runtime_memcheck.log" 2>&1 || fail "memcheck (rc $?)"
  echo "memcheck: $(grep -E "ERROR SUMMARY" "$OUTD/runtime_memcheck.log" | head -1)"
else
  fail "compute-sanitizer missing"
fi
echo "runtime_masks.sh: rc $rc ($(elapsed))"
exit $rc
