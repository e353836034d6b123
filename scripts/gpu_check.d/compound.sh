#!/usr/bin/env bash
# scripts/gpu_check.d/compound.sh [OUTDIR] — GPU checks of compound plans' scattered and tile parts (issue 24): the
# compound GPU tests against the fp64 reference (PlanGpu.CompoundMatchesReference: every part kind, the kinds that
# ran), compute-sanitizer memcheck on them, and bench/gpu_bench.py against FlexAttention in the same process on the
# issue's scattered cases at L = 16384 and 4096, D = 64: bandrand (local(256) | random(4), against local alone),
# sprandom (0.5% random rows: the scattered kernel alone) and random (5%: bitmask tiles, with the tile shapes in
# COMPOUND_SHAPES forced beside the chosen one). Logs and JSON go to OUTDIR (else $SPATTN_OUT, else ./out). Builds
# what it runs into build-cp/ (GoogleTest from .gtest/ where the machine has none). No bench case starts past
# COMPOUND_BUDGET_S (default 300) seconds into the script.
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler: the bench dlopens the library into PyTorch (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
gpu_script_setup "${1:-}" build-cp cp_build.log spattn plan_gpu_test || exit 1
BUDGET=${COMPOUND_BUDGET_S:-300}
SHAPES=${COMPOUND_SHAPES:-128x128,192x128}
LIB=$BUILD/libspattn.so
T=$BUILD/tests
rc=0

echo "== cp: GPU tests ($(elapsed))"
timeout 240 "$T/plan_gpu_test" --gtest_filter='PlanGpu.CompoundMatchesReference:PlanGpu.EveryKernelTableRow' \
  >"$OUTD/cp_plan_gpu_test.log" 2>&1 || fail "plan_gpu_test"
grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \]|Failure|Expected|Which is|actual" \
  "$OUTD/cp_plan_gpu_test.log" | head -30
grep -qE "^\[  SKIPPED \] [0-9]+ tests?" "$OUTD/cp_plan_gpu_test.log" && fail "plan_gpu_test skipped tests"

echo "== cp: compute-sanitizer memcheck on the compound cases ($(elapsed))"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$T/plan_gpu_test" \
  --gtest_filter='PlanGpu.CompoundMatchesReference' >"$OUTD/cp_memcheck.log" 2>&1 || fail "memcheck"
grep -E "ERROR SUMMARY" "$OUTD/cp_memcheck.log" | head -1

echo "== cp: bench against FlexAttention ($(elapsed))"
budget_bench cp_bench_16384 --lengths 16384 --dims 64 --patterns local,bandrand,sprandom
budget_bench cp_bench_random --lengths 16384 --dims 64 --patterns random --shapes "$SHAPES"
budget_bench cp_bench_4096 --lengths 4096 --dims 64 --patterns local,bandrand,sprandom
echo "compound.sh: rc $rc ($(elapsed))"
exit $rc
