#!/usr/bin/env bash
# scripts/gpu_check.d/nbr_bwd.sh [OUTDIR] — GPU checks of the neighborhood backward on query strips (issue 39; chosen
# for 2-D neighborhoods, forced by backward_kernel "sm90_bwd_strips", off with "sm90_bwd_ws"), one call on an H200
# (~4 minutes on 16 cores): the host checks of the strip plans (backward_strips_test: each kept pair once, kept
# fractions printed), the GPU tests against the fp64 reference (BackwardGpu.QueryStrips*: dilation, causal, awkward
# grids, GQA, views, fp16; chosen, or forced off, or refused where they do not fit), the unchanged tile rows
# (BackwardGpu.EveryTileRowMatchesReference, the kernel file changed), compute-sanitizer memcheck, racecheck and
# synccheck on the small strips case, then the A/B in one process: bench/bwd_bench.py --issue on na2d_96 and na2d_112
# chosen and with backward_kernel "sm90_bwd_ws" (the row-major tile plan on the row the planner picks for it), JSON in
# OUTDIR/nbr_bwd_ab.json. Logs go to OUTDIR (else $SPATTN_OUT, else ./out). Standalone it builds what it runs into
# build-nb/ (GoogleTest from .gtest/ where the machine has none); NB_SKIP_BENCH=1 skips the bench.
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler: the bench dlopens the library into PyTorch (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
gpu_script_setup "${1:-}" build-nb nb_build.log spattn backward_gpu_test backward_strips_test || exit 1
T=$BUILD/tests
rc=0

echo "== nb: host checks of the query-strip plans ($(elapsed))"
timeout 120 "$T/backward_strips_test" >"$OUTD/nb_strips_test.log" 2>&1 || fail "backward_strips_test"
grep -E "^\[  (PASSED|FAILED) +\]|Failure|Expected|Which is|kept fraction" "$OUTD/nb_strips_test.log" | head -12

echo "== nb: GPU tests ($(elapsed))"
gtest_run nb_backward_gpu_test "$T/backward_gpu_test" \
  'BackwardGpu.QueryStrips*:BackwardGpu.EveryTileRowMatchesReference:BackwardGpu.SmallCaseForSanitizers' 300

echo "== nb: compute-sanitizer on the small strips case ($(elapsed))"
sanitize_all nb "$T/backward_gpu_test" 'BackwardGpu.QueryStripsSmallCaseForSanitizers' || fail "compute-sanitizer"

if [ "${NB_SKIP_BENCH:-0}" != 1 ]; then
  echo "== nb: A/B in one process, na2d_96 (D=64) and na2d_112 (D=128), query strips (chosen) vs sm90_bwd_ws ($(elapsed))"
  timeout 240 python3 "$ROOT/bench/bwd_bench.py" --lib "$BUILD/libspattn.so" --issue --patterns na2d_96,na2d_112 \
    --kernel ,sm90_bwd_ws --budget-s 200 --json "$OUTD/nbr_bwd_ab.json" 2>&1 | tee "$OUTD/nb_bench.log" | grep -v "^W1\|warn" ||
    fail "bench"
fi
echo "nbr_bwd.sh: rc $rc ($(elapsed))"
exit $rc
