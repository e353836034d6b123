#!/usr/bin/env bash
# scripts/gpu_check.d/zero_lengths.sh [OUTDIR] — the GPU engines on empty problems (issue 21): PlanGpu.EmptyLengths
# (cuda_fused and cuda_unfused at 0 x 0, 0 x 5, 7 x 0 and 300 x 0, per-head patterns, a strided O: O = 0, LSE = -inf,
# zero gradients, nothing launched but fills) under compute-sanitizer memcheck, racecheck and synccheck, and
# `spattn run --device cuda` on empty problems with its outputs checked in numpy. Logs go to OUTDIR (else
# $SPATTN_OUT, else ./out). Run by scripts/gpu_check.sh with SPATTN_BUILD (its build dir); standalone it configures
# for the GPU it finds and builds what it runs into build-zero/ (GoogleTest from .gtest/ where the machine has none).
# A minute or two on an H100 host once built.
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
gpu_script_setup "${1:-}" build-zero zero_build.log spattn spattn_cli plan_gpu_test || exit 1
rc=0

echo "== zero lengths: PlanGpu.EmptyLengths ($(elapsed))"
timeout 120 "$BUILD/tests/plan_gpu_test" --gtest_filter='PlanGpu.EmptyLengths' >"$OUTD/zero_test.log" 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|error" "$OUTD/zero_test.log" | head -20
sanitize_all zero "$BUILD/tests/plan_gpu_test" 'PlanGpu.EmptyLengths' || rc=1

echo "== zero lengths: spattn run / explain --device cuda ($(elapsed))"
S=$BUILD/spattn
for impl in fused unfused; do
  "$S" run --device cuda --impl "$impl" --pattern "local(3)" --q-len 7 --k-len 0 --heads 2 --dim 64 --dtype bf16 \
    --out "$OUTD/z_o.npy" --lse "$OUTD/z_lse.npy" --dq "$OUTD/z_dq.npy" >"$OUTD/zero_run_$impl.log" 2>&1 || { rc=1; cat "$OUTD/zero_run_$impl.log"; }
  python3 - "$OUTD" "$impl" <<'PY' || rc=1
import sys, numpy as np
d, impl = sys.argv[1], sys.argv[2]
o, lse, dq = np.load(f"{d}/z_o.npy"), np.load(f"{d}/z_lse.npy"), np.load(f"{d}/z_dq.npy")
ok = o.shape == (1, 7, 2, 64) and (o == 0).all() and (lse == -np.inf).all() and (dq == 0).all()
print(f"run --device cuda --impl {impl} at 7 x 0: O {o.shape} all 0: {(o == 0).all()}, LSE all -inf: "
      f"{(lse == -np.inf).all()}, dQ all 0: {(dq == 0).all()}")
sys.exit(0 if ok else 1)
PY
  "$S" run --device cuda --impl "$impl" --pattern "local(3)" --q-len 0 --k-len 5 --heads 2 --dim 64 --dtype bf16 \
    --dk "$OUTD/z_dk.npy" >>"$OUTD/zero_run_$impl.log" 2>&1 || { rc=1; tail -3 "$OUTD/zero_run_$impl.log"; }
  python3 -c "import numpy as np, sys; k = np.load(sys.argv[1]); print('run at 0 x 5: dK', k.shape, 'all 0:', (k == 0).all()); sys.exit(0 if (k == 0).all() else 1)" "$OUTD/z_dk.npy" || rc=1
done
"$S" explain --device cuda --pattern "local(3)" --len 0 >"$OUTD/zero_explain.log" 2>&1 || rc=1
grep -E "nothing to compute|error" "$OUTD/zero_explain.log" | head -3
rm -f "$OUTD"/z_*.npy
echo "zero lengths: $([ $rc -eq 0 ] && echo ok || echo FAILED)"
exit $rc
