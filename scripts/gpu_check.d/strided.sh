#!/usr/bin/env bash
# scripts/gpu_check.d/strided.sh [OUTDIR] — GPU checks of affine terms at any stride (issue 42), in one device call:
#   1. host checks of the plans (parts_test: the backward's parts keep the affine part; tile_map_test AffineParts: the
#      forward's and the backward's residue-grouped plans past stride 16 cover their patterns);
#   2. the GPU tests against the fp64 reference: PlanGpu.AffinePartsAtAnyStrideMatchReference (the forward),
#      PlanGpu.StridedPlansMatchReference (the affine part merged in its epilogue, four CTAs for residue-grouped
#      64x64 tiles at D = 64),
#      PlanGpu.StridedMergeOnViewsAndUnequalLengths (the merge at Lq != Lk, [B, H, L, D] views, a padded LSE, per-head
#      patterns) and all
#      of backward_gpu_test (BackwardGpu.StridedPastSixteen: sparse_strided by parts, its affine part on the tile
#      backward adding dK, dV; stride and dilated terms grouped past 16; lengths that leave residue groups unequal;
#      and every other backward test, since the tile kernels' epilogue changed);
#   3. bench/strided_bench.py: sparse_strided(128 | 256 | 512), dilated(64, 32), stride(64) & causal, forward and
#      backward against FlexAttention and dense cuDNN in one process, L = 16384 at D 64 and 128 first, then 65536
#      while the budget lasts, written as the baseline OUTDIR/baselines/h200-strided.{json,png} (copy them into
#      bench/baselines/) and OUTDIR/strided.json. The bar (issue 42) per row: fwd_frac_of_cudnn >= 0.4,
#      fwd_ratio_vs_flex >= 5, bwd_over_fwd >= 0.6.
# Logs go to OUTDIR (else $SPATTN_OUT, else ./out). Builds what it runs into build-str/ (GoogleTest from .gtest/ where
# the machine has none). No bench case starts past STRIDED_BUDGET_S (default 330) seconds into the script, build
# included. STRIDED_MEMCHECK=1 adds compute-sanitizer memcheck on the strided backward test; STRIDED_SKIP_TESTS=1
# skips 1 and 2 (and memcheck); STRIDED_BENCH_ARGS adds bench arguments (an A/B against an environment switch:
# STRIDED_BENCH_ARGS="--env-ab VAR=VALUE"; a second call for what the budget left:
# STRIDED_SKIP_TESTS=1 STRIDED_BENCH_ARGS="--resume <the first call's strided.json, put in the tree>");
# SPATTN_COMMIT names the commit in the baseline's meta block (the device copy has no .git).
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler: the bench dlopens the library into PyTorch (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
gpu_script_setup "${1:-}" build-str str_build.log spattn plan_gpu_test backward_gpu_test parts_test tile_map_test || exit 1
BUDGET=${STRIDED_BUDGET_S:-330}
LIB=$BUILD/libspattn.so
T=$BUILD/tests
rc=0

if [ "${STRIDED_SKIP_TESTS:-0}" != 1 ]; then
  echo "== strided: host checks of the plans ($(elapsed))"
  timeout 120 "$T/parts_test" --gtest_filter='Parts.BackwardParts*' >"$OUTD/str_parts_test.log" 2>&1 || fail "parts_test"
  timeout 120 "$T/tile_map_test" --gtest_filter='AffineParts.*' >"$OUTD/str_tile_map_test.log" 2>&1 || fail "tile_map_test"
  echo "== strided: GPU tests ($(elapsed))"
  timeout 240 "$T/plan_gpu_test" --gtest_filter='PlanGpu.AffinePartsAtAnyStrideMatchReference:PlanGpu.StridedPlansMatchReference:PlanGpu.StridedMergeOnViewsAndUnequalLengths' \
    >"$OUTD/str_plan_gpu_test.log" 2>&1 || fail "plan_gpu_test"
  timeout 240 "$T/backward_gpu_test" >"$OUTD/str_backward_gpu_test.log" 2>&1 || fail "backward_gpu_test"
  for t in parts tile_map plan_gpu backward_gpu; do
    echo "-- $t"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \]|Failure|Expected|Which is|actual|trace:|at [0-9]+|C\+\+ exception" \
      "$OUTD/str_${t}_test.log" | head -20
  done
  for t in plan_gpu backward_gpu; do
    grep -qE "^\[  SKIPPED \] [0-9]+ tests?" "$OUTD/str_${t}_test.log" && fail "${t}_test skipped tests"
  done
  if [ "${STRIDED_MEMCHECK:-0}" = 1 ]; then  # opt-in: it takes from the bench's budget
    echo "== strided: compute-sanitizer memcheck on BackwardGpu.StridedPastSixteen ($(elapsed))"
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$T/backward_gpu_test" \
      --gtest_filter='BackwardGpu.StridedPastSixteen' >"$OUTD/str_memcheck.log" 2>&1 || fail "memcheck"
    grep -E "ERROR SUMMARY" "$OUTD/str_memcheck.log" | head -1
  fi
fi

echo "== strided: bench against FlexAttention and dense cuDNN, forward and backward ($(elapsed))"
left=$(( BUDGET - $(secs) ))
if [ "$left" -lt 40 ]; then
  echo "budget left ${left}s: bench skipped"
else
  # shellcheck disable=SC2086  # STRIDED_BENCH_ARGS: several words
  SPATTN_BASELINES="$OUTD/baselines" timeout $(( left + 120 )) python3 "$ROOT/bench/strided_bench.py" --lib "$LIB" \
    --lengths 16384,65536 --dims 64,128 --reps 20 --budget-s "$left" --json "$OUTD/strided.json" \
    --baseline h200-strided ${STRIDED_BENCH_ARGS:-} >"$OUTD/str_bench.txt" 2>&1 || fail "strided_bench (rc $?)"
  grep -vE "^W[0-9]|^ *warn" "$OUTD/str_bench.txt" | tail -24
fi
echo "strided.sh: rc $rc ($(elapsed))"
exit $rc
