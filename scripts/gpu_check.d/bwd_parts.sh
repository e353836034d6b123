#!/usr/bin/env bash
# scripts/gpu_check.d/bwd_parts.sh [OUTDIR] — GPU checks of the backward by parts (issue 39): the compound backward
# GPU tests against the fp64 reference (BackwardGpu.CompoundPlansByParts: sparse_fixed, band | random, scattered keys
# alone, three parts, longformer, a causal window with sinks, bigbird, empty rows, per-head patterns, GQA, D = 64 and
# 128; CompoundExplainListsBackwardParts), the host check of the parts' cover (parts_test), compute-sanitizer memcheck
# on the compound cases, and bench/bwd_bench.py --compound (forward and backward effective TFLOP/s, bwd_over_fwd,
# bwd_ratio_vs_flex against FlexAttention's backward in the same process) as JSON. Logs and JSON go to OUTDIR (else
# $SPATTN_OUT, else ./out). Standalone it builds what it runs into build-bp/ (GoogleTest from .gtest/ where the
# machine has none); BP_SKIP_BENCH=1 skips the bench, BP_BENCH_ARGS adds bench arguments (default: the five compound
# cases at L = 16384, the causal window at 32768).
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler: the bench dlopens the library into PyTorch (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
gpu_script_setup "${1:-}" build-bp bp_build.log spattn backward_gpu_test parts_test || exit 1
T=$BUILD/tests
rc=0

echo "== bp: host cover check ($(elapsed))"
timeout 120 "$T/parts_test" --gtest_filter='Parts.BackwardParts*' >"$OUTD/bp_parts_test.log" 2>&1 || fail "parts_test"
grep -E "^\[  (PASSED|FAILED) +\]|Failure|Expected|Which is" "$OUTD/bp_parts_test.log" | head -10

echo "== bp: GPU tests ($(elapsed))"
timeout 240 "$T/backward_gpu_test" --gtest_filter='BackwardGpu.Compound*:BackwardGpu.CsrKernelTakesTheRest:BackwardGpu.SmallCase*' \
  >"$OUTD/bp_backward_gpu_test.log" 2>&1 || fail "backward_gpu_test"
grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \]|Failure|Expected|Which is|actual|Value of|dq|dk|dv|parts\(" \
  "$OUTD/bp_backward_gpu_test.log" | head -40
grep -qE "^\[  SKIPPED \] [0-9]+ tests?" "$OUTD/bp_backward_gpu_test.log" && fail "backward_gpu_test skipped tests"

echo "== bp: compute-sanitizer memcheck on the compound cases ($(elapsed))"
if command -v compute-sanitizer >/dev/null; then
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 "$T/backward_gpu_test" \
    --gtest_filter='BackwardGpu.CompoundPlansByParts' >"$OUTD/bp_memcheck.log" 2>&1 || fail "memcheck"
  grep -E "ERROR SUMMARY" "$OUTD/bp_memcheck.log" | head -1
else
  echo "compute-sanitizer missing"
fi

if [ "${BP_SKIP_BENCH:-0}" != 1 ]; then
  echo "== bp: bench, compound cases against FlexAttention ($(elapsed))"
  timeout 300 python3 "$ROOT/bench/bwd_bench.py" --lib "$BUILD/libspattn.so" --compound --json "$OUTD/bwd_parts_bench.json" \
    ${BP_BENCH_ARGS:-} 2>&1 | tee "$OUTD/bwd_parts_bench.log" | grep -v "^W1\|warn" || fail "bench"
fi
echo "bwd_parts.sh: rc $rc ($(elapsed))"
exit $rc
