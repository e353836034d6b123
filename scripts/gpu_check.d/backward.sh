#!/usr/bin/env bash
# scripts/gpu_check.d/backward.sh [OUTDIR] — GPU checks of the backward pass (issue 25): the GPU tests
# (tests/gpu/backward_gpu_test.cpp: every sm90_bwd row and the CSR pass against the fp64 reference backward),
# compute-sanitizer memcheck, racecheck and synccheck on a small case, and bench/bwd_bench.py (ours against FlexAttention's
# backward in the same process) as JSON. Logs and JSON go to OUTDIR (else $SPATTN_OUT, else ./out).
# Run by scripts/gpu_check.sh with SPATTN_BUILD (its build dir); standalone it configures for the GPU it finds and
# builds what it runs into build-bwd/ (GoogleTest from .gtest/ where the machine has none). BWD_BENCH_ARGS adds
# bench arguments (default: the suite at L = 16384, D = 64); BWD_KERNELS the backward kernels timed side by side
# (default "sm90_bwd,sm90_bwd_ws": the plain rows and the warp-specialized rows, each against Flex in one loop;
# BWD_KERNELS= (empty): the planner's choice alone, as the baseline; a --kernel in BWD_BENCH_ARGS overrides it);
# BWD_SKIP_BENCH=1 skips the bench.
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
gpu_script_setup "${1:-}" build-bwd bwd_build.log spattn spattn_cli backward_gpu_test || exit 1
rc=0

echo "== backward: GPU tests ($(elapsed))"
timeout 400 "$BUILD/tests/backward_gpu_test" >"$OUTD/backward_gpu_test.log" 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|error|Value of|dq|dk|dv" "$OUTD/backward_gpu_test.log" | head -40

echo "== backward: compute-sanitizer ($(elapsed))"
sanitize_all bwd "$BUILD/tests/backward_gpu_test" 'BackwardGpu.SmallCaseForSanitizers*' || rc=1
# the persistent D = 64 grid: one CTA over two items (the test caps the grid)
sanitize_all bwd_persist64 "$BUILD/tests/backward_gpu_test" 'BackwardGpu.Persistent64SmallCaseForSanitizers' || rc=1

echo "== backward: spattn run --dq --dk --dv on the GPU against the CPU reference ($(elapsed))"
for spec in "local(20)" "causal" "dilated(10, 3)"; do
  for dev in "cuda fused" "cpu reference"; do
    set -- $dev
    "$BUILD/spattn" run --pattern "$spec" --len 300 --heads 4 --kv-heads 2 --dim 64 --dtype bf16 --seed 5 --device "$1" \
      --impl "$2" --dq "$OUTD/g_$1_dq.npy" --dk "$OUTD/g_$1_dk.npy" --dv "$OUTD/g_$1_dv.npy" >"$OUTD/g_$1.log" 2>&1 || rc=1
  done
  python3 - "$OUTD" "$spec" <<'PY' || rc=1
import sys, numpy as np
d, spec = sys.argv[1], sys.argv[2]
errs = []
for g in ("dq", "dk", "dv"):
    a, b = np.load(f"{d}/g_cuda_{g}.npy"), np.load(f"{d}/g_cpu_{g}.npy")
    errs.append(float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)))
print(f"{spec}: rel err dq {errs[0]:.2e} dk {errs[1]:.2e} dv {errs[2]:.2e}")
sys.exit(0 if max(errs) <= 2e-2 else 1)
PY
done
grep -h "backward" "$OUTD/g_cuda.log" | head -2
rm -f "$OUTD"/g_*.npy

if [ "${BWD_SKIP_BENCH:-0}" != 1 ]; then
  echo "== backward: bench ($(elapsed))"
  python3 "$ROOT/bench/bwd_bench.py" --lib "$BUILD/libspattn.so" --json "$OUTD/bwd_bench.json" \
    --kernel "${BWD_KERNELS-sm90_bwd,sm90_bwd_ws}" ${BWD_BENCH_ARGS:-} \
    2>&1 | tee "$OUTD/bwd_bench.log" | grep -v "^W1\|warn" || rc=1
fi
echo "backward.sh: rc $rc ($(elapsed))"
exit $rc
