#!/usr/bin/env bash
# scripts/gpu_check.d/backward.sh [OUTDIR] — GPU checks of the backward pass (issue 25): the GPU tests
# (tests/gpu/backward_gpu_test.cpp: every sm90_bwd row and the CSR pass against the fp64 reference backward),
# compute-sanitizer memcheck and racecheck on a small case, and bench/bwd_bench.py (ours against FlexAttention's
# backward in the same process) as JSON. Logs and JSON go to OUTDIR (else $SPATTN_OUT, else ./out).
# Run by scripts/gpu_check.sh with SPATTN_BUILD (its build dir); standalone it configures for the GPU it finds and
# builds what it runs into build-bwd/ (GoogleTest from .gtest/ where the machine has none). BWD_BENCH_ARGS adds
# bench arguments (default: the suite at L = 16384, D = 64); BWD_SKIP_BENCH=1 skips the bench.
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTD=${1:-${SPATTN_OUT:-$ROOT/out}}
mkdir -p "$OUTD"
OUTD=$(cd "$OUTD" && pwd)
source "$ROOT/scripts/gpu_lib.sh"
BUILD=${SPATTN_BUILD:-}
rc=0
if [ -z "$BUILD" ]; then
  BUILD=$ROOT/build-bwd
  gpu_build "$BUILD" "$OUTD/bwd_build.log" spattn backward_gpu_test || exit 1
fi

echo "== backward: GPU tests ($(elapsed))"
timeout 400 "$BUILD/tests/backward_gpu_test" >"$OUTD/backward_gpu_test.log" 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|error|Value of|dq|dk|dv" "$OUTD/backward_gpu_test.log" | head -40

echo "== backward: compute-sanitizer ($(elapsed))"
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 3 "$BUILD/tests/backward_gpu_test" \
    --gtest_filter='BackwardGpu.SmallCaseForSanitizers' >"$OUTD/bwd_$tool.log" 2>&1
  r=$?
  echo "$tool: rc $r; $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUTD/bwd_$tool.log" | head -1)"
  [ $r -eq 0 ] || rc=1
done

if [ "${BWD_SKIP_BENCH:-0}" != 1 ]; then
  echo "== backward: bench ($(elapsed))"
  python3 "$ROOT/bench/bwd_bench.py" --lib "$BUILD/libspattn.so" --json "$OUTD/bwd_bench.json" ${BWD_BENCH_ARGS:-} \
    2>&1 | tee "$OUTD/bwd_bench.log" | grep -v "^W1\|warn" || rc=1
fi
echo "backward.sh: rc $rc ($(elapsed))"
exit $rc
