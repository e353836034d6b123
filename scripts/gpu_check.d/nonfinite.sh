#!/usr/bin/env bash
# scripts/gpu_check.d/nonfinite.sh [OUTDIR] — non-finite inputs on the GPU paths (issue 21): tests/gpu/
# nonfinite_gpu_test.cpp (NaN / +inf planted in Q, K, V and dO, scales of 1e30 and 1e38, empty rows beside poisoned
# ones; every fused kernel-table row this GPU runs, the band kernel's split and slab routes, compound plans,
# cuda_unfused, the sm90_bwd rows and cuda_csr_bwd, each against the fp64 reference element by element), then
# compute-sanitizer memcheck, racecheck and synccheck on its small case. Lines "tile spread" count the NaNs a V (or,
# in the backward, any) plant leaves in rows of a tile that do not keep its key (PATTERNS.md: allowed on the tile
# kernels, counted); a FAILED line is a contract break. Logs go to OUTDIR (else $SPATTN_OUT, else ./out). Run by
# scripts/gpu_check.sh with SPATTN_BUILD (its build dir); standalone it configures for the GPU it finds and builds
# what it runs into build-nonfinite/ (GoogleTest from .gtest/ where the machine has none).
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
gpu_script_setup "${1:-}" build-nonfinite nonfinite_build.log spattn nonfinite_gpu_test || exit 1
rc=0

echo "== non-finite: GPU tests ($(elapsed))"
timeout 500 "$BUILD/tests/nonfinite_gpu_test" >"$OUTD/nonfinite_test.log" 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|Value of|Google Test trace|^/.*nonfinite|tile spread|NaN or the reference" \
  "$OUTD/nonfinite_test.log" | head -80
echo "(full log: $OUTD/nonfinite_test.log; $(grep -c "Failure" "$OUTD/nonfinite_test.log") failures)"

echo "== non-finite: compute-sanitizer ($(elapsed))"
sanitize_all nonfinite "$BUILD/tests/nonfinite_gpu_test" 'NonFiniteGpu.SmallCaseForSanitizers' || rc=1
echo "non-finite: $([ $rc -eq 0 ] && echo ok || echo FAILED)"
exit $rc
