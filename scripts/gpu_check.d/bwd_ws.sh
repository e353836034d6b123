#!/usr/bin/env bash
# scripts/gpu_check.d/bwd_ws.sh [OUTDIR] — the backward's 128-query-step row (issue 40: tile_bwd_ws2.cuh,
# sm90_bwd_ws_128x128_d64) against the 64-query-step one (tile_bwd_ws.cuh). Builds the tests and the Python module
# into build-bwdws/ (one configure); runs the GPU tests (the forced new row on band, causal, GQA, bitmask, awkward
# lengths; every tile row; the sanitizer cases); times old vs new in one process: bench/bwd_bench.py with both rows
# forced (local, causal, D = 64), and bench/windows_bench.py --bwd-variants old,new (our backward under
# SPATTN_BWD_VARIANT=old and =new, set around each call and read by the library at every launch, alternated with
# FA4's in one loop); then compute-sanitizer memcheck and racecheck on the sanitizer cases. Logs and JSON go to
# OUTDIR (else $SPATTN_OUT, else ./out). Under scripts/gpu_check.sh (SPATTN_BUILD) the windows bench runs only where
# that build has the Python module. WINDOWS_ARGS replaces the windows bench's arguments (default --no-flex --reps 10).
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler: the module is loaded into the PyTorch process (scripts/gpu_check.sh)
unset SPATTN_BWD_VARIANT  # the tests force rows; the variant switch would override them
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
nb=$(python3 -c "import nanobind; print(nanobind.cmake_dir())" 2>/dev/null) || nb=""
[ -n "$nb" ] && export SPATTN_EXTRA_CMAKE="-DSPATTN_PYTHON=ON -Dnanobind_DIR=$nb"
targets=(spattn backward_gpu_test)
[ -n "$nb" ] && targets+=(_core)
gpu_script_setup "${1:-}" build-bwdws bwdws_build.log "${targets[@]}" || exit 1
rc=0

echo "== bwd_ws: GPU tests ($(elapsed))"
timeout 300 "$BUILD/tests/backward_gpu_test" \
  --gtest_filter='BackwardGpu.Ws128QueryStepMatchesReference:BackwardGpu.EveryTileRowMatchesReference:BackwardGpu.SmallCaseForSanitizersWs' \
  >"$OUTD/bwdws_gpu_test.log" 2>&1
trc=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|Failure|Expected|Which is|Value of|dq|dk|dv" "$OUTD/bwdws_gpu_test.log" | head -40
if [ $trc -eq 124 ]; then  # a hang (an mbarrier deadlock): the benches would hang too
  echo "bwd_ws: GPU tests timed out; last test started: $(grep '^\[ RUN' "$OUTD/bwdws_gpu_test.log" | tail -1)"
  echo "bwd_ws.sh: rc 1 ($(elapsed))"
  exit 1
fi
[ $trc -eq 0 ] || rc=1

echo "== bwd_ws: bwd_bench, both rows forced, D = 64 ($(elapsed))"
timeout 240 python3 "$ROOT/bench/bwd_bench.py" --lib "$BUILD/libspattn.so" --json "$OUTD/bwdws_bwd_bench.json" \
  --kernel sm90_bwd_ws_64x128_d64,sm90_bwd_ws_128x128_d64 --patterns local,causal --dims 64 --no-flex --reps 10 \
  2>&1 | tee "$OUTD/bwdws_bwd_bench.log" | grep -v "^W1\|warn" || rc=1

if ls "$BUILD"/python/spattn/_core* >/dev/null 2>&1; then
  echo "== bwd_ws: windows bench, old vs new in one process ($(elapsed))"
  PYTHONPATH=$BUILD/python timeout 400 python3 "$ROOT/bench/windows_bench.py" --bwd-variants old,new \
    --json "$OUTD/bwdws_windows.json" ${WINDOWS_ARGS:---no-flex --reps 10} 2>&1 | tee "$OUTD/bwdws_windows.log" |
    grep -v "^W1\|warn" || rc=1
else
  echo "bwd_ws: no spattn._core in $BUILD/python (no nanobind, or gpu_check.sh's build): no windows bench"
fi

echo "== bwd_ws: compute-sanitizer memcheck, racecheck ($(elapsed))"
for tool in memcheck racecheck; do
  timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 3 "$BUILD/tests/backward_gpu_test" \
    --gtest_filter='BackwardGpu.SmallCaseForSanitizersWs' >"$OUTD/bwdws_$tool.log" 2>&1 || rc=1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUTD/bwdws_$tool.log" | head -1)"
done

echo "bwd_ws.sh: rc $rc ($(elapsed))"
exit $rc
