#!/usr/bin/env bash
# scripts/gpu_check.d/bwd_parts.sh [OUTDIR] — GPU checks of the backward by parts (issue 39), one call on an H200
# (~6 minutes on 16 cores, the bench ~3 of them): the host checks of the backward's parts (parts_test: which parts each
# pattern's backward uses, their cover), the compound backward GPU tests against the fp64 reference
# (BackwardGpu.CompoundPlansByParts: sparse_fixed, band | random, scattered keys alone, three parts, longformer, a
# causal window with sinks, bigbird, empty rows, per-head patterns, GQA, D = 64 and 128;
# BackwardGpu.ScatteredPartRowsKernels: the scattered part's rows kernels (cuda_scattered_bwd) alone and after a tiles
# part, awkward lengths, GQA, empty scattered rows, and the warp-a-row pass where o and dq rows are not 16-byte aligned;
# CompoundExplainListsBackwardParts), the NaN plants on the parts (NonFiniteGpu.BackwardByParts: a NaN poisons only
# its rows and keys), compute-sanitizer memcheck on the compound and rows-kernel cases, then bench/bwd_bench.py
# --baseline h200-bwd (issue 39's table against FlexAttention's backward in the same process: forward and backward
# effective TFLOP/s, bwd_over_fwd, bwd_ratio_vs_flex, the summary) written into OUTDIR/h200-bwd.json (+ .png; copy
# them to bench/baselines/ to commit the baseline) with its log: eight files in all (the device tool's limit). Logs go
# to OUTDIR (else $SPATTN_OUT, else ./out).
# Standalone it builds what it runs into build-bp/ (GoogleTest from .gtest/ where the machine has none);
# BP_SKIP_BENCH=1 skips the bench, BP_BENCH_BUDGET its budget in seconds (default 200), BP_BENCH_ARGS replaces its
# case arguments (default: the --issue table; e.g. "--compound" for the older compound list).
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler: the bench dlopens the library into PyTorch (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
gpu_script_setup "${1:-}" build-bp bp_build.log spattn backward_gpu_test nonfinite_gpu_test parts_test || exit 1
T=$BUILD/tests
rc=0

echo "== bp: host checks of the backward's parts ($(elapsed))"
timeout 120 "$T/parts_test" --gtest_filter='Parts.Backward*' >"$OUTD/bp_parts_test.log" 2>&1 || fail "parts_test"
grep -E "^\[  (PASSED|FAILED) +\]|Failure|Expected|Which is" "$OUTD/bp_parts_test.log" | head -10

GPU_FILTER='BackwardGpu.Compound*:BackwardGpu.ScatteredPartRowsKernels:BackwardGpu.CsrKernelTakesTheRest:BackwardGpu.SmallCase*'
echo "== bp: GPU tests ($(elapsed))"
timeout 240 "$T/backward_gpu_test" --gtest_filter="$GPU_FILTER" >"$OUTD/bp_backward_gpu_test.log" 2>&1 || fail "backward_gpu_test"
grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \]|Failure|Expected|Which is|actual|Value of|dq|dk|dv|parts\(" \
  "$OUTD/bp_backward_gpu_test.log" | head -40
grep -qE "^\[  SKIPPED \] [0-9]+ tests?" "$OUTD/bp_backward_gpu_test.log" && fail "backward_gpu_test skipped tests"
timeout 240 "$T/nonfinite_gpu_test" --gtest_filter='NonFiniteGpu.BackwardByParts' >"$OUTD/bp_nonfinite_gpu_test.log" 2>&1 ||
  fail "nonfinite_gpu_test"
grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \]|Failure|Expected|Which is|spread" \
  "$OUTD/bp_nonfinite_gpu_test.log" | head -20

echo "== bp: compute-sanitizer memcheck on the compound and rows-kernel cases ($(elapsed))"
if command -v compute-sanitizer >/dev/null; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$T/backward_gpu_test" \
    --gtest_filter='BackwardGpu.CompoundPlansByParts:BackwardGpu.ScatteredPartRowsKernels' >"$OUTD/bp_memcheck.log" 2>&1 ||
    fail "memcheck"
  grep -E "ERROR SUMMARY" "$OUTD/bp_memcheck.log" | head -1
else
  echo "compute-sanitizer missing"
fi

if [ "${BP_SKIP_BENCH:-0}" != 1 ]; then
  echo "== bp: bench, issue 39's table against FlexAttention, baseline h200-bwd into $OUTD ($(elapsed))"
  # shellcheck disable=SC2086  # BP_BENCH_ARGS: several arguments
  SPATTN_BASELINES=$OUTD timeout 420 python3 "$ROOT/bench/bwd_bench.py" --lib "$BUILD/libspattn.so" \
    --budget-s "${BP_BENCH_BUDGET:-200}" ${BP_BENCH_ARGS:---baseline h200-bwd} 2>&1 |
    tee "$OUTD/bwd_parts_bench.log" | grep -v "^W1\|warn" || fail "bench"
fi
echo "bwd_parts.sh: rc $rc ($(elapsed))"
exit $rc
