#!/usr/bin/env bash
# scripts/gpu_check.d/longformer.sh [OUTDIR] — GPU checks of band rows with a key prefix on the band kernel and of
# longformer's split into that and a rows part (issue 24): the band kernels' registers and spills (BandTraits' last
# argument true: the key-prefix instantiations), the GPU tests (PlanGpu.BandRowsWithKeyPrefix: prefix plans and the
# tiles + rows split against the fp64 reference, with the kernels and parts that ran; the compound, per-head and
# kernel-table tests beside them), compute-sanitizer memcheck, racecheck and synccheck on small such plans, and
# bench/gpu_bench.py against FlexAttention in the same process, each case also with compound=0 (:nc, the one tile
# list of before): longformer(256, 32), local(256), local(256) | global_cols(0:32) (lfcols) and a causal window with
# 4 sinks (sinks) at L = 16384 and 4096, D = 64; longformer and local at D = 128 (no band kernel there: the route
# is unchanged, the A/B shows it). Logs and JSON go to OUTDIR (else $SPATTN_OUT, else ./out). Run by
# scripts/gpu_check.sh with SPATTN_BUILD (its build dir); standalone it configures for the GPU it finds and builds
# what it runs into build-lf/ (GoogleTest from .gtest/ where the machine has none). About 6 minutes on an H100 host
# once built: no bench case starts past LF_BUDGET_S (default 330) seconds into the script.
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler: the bench dlopens the library into PyTorch (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
SPATTN_EXTRA_CMAKE="${SPATTN_EXTRA_CMAKE:-} -DCMAKE_CUDA_FLAGS=--ptxas-options=-v" \
  gpu_script_setup "${1:-}" build-lf lf_build.log spattn plan_gpu_test parts_test plan_test || exit 1
BUDGET=${LF_BUDGET_S:-330}
LIB=$BUILD/libspattn.so
T=$BUILD/tests
rc=0

echo "== lf: registers and spills of the band kernels (BandTraits<192, bf16, rmax, shifted, prefix>) ($(elapsed))"
demangle() { (command -v c++filt >/dev/null && c++filt || cat) | sed 's/spattn::cuda::fused:://g; s/void //; s/(FusedParams)//'; }
if command -v cuobjdump >/dev/null && [ -f "$LIB" ]; then
  cuobjdump --dump-resource-usage "$LIB" 2>/dev/null |
    awk '/Function .*fused_fwd_band_kernel/ {n = $2; sub(/:$/, "", n); getline; print n, $1, $2, $4}' | demangle |
    tee "$OUTD/lf_registers.txt"
fi
if [ -f "$OUTD/lf_build.log" ]; then  # this script's build: ptxas -v, and wgmma serialization warnings
  grep -E "C75(1[0-5])" "$OUTD/lf_build.log" | head -5 && fail "ptxas serialized wgmmas (C7510-C7515)"
fi

echo "== lf: host tests of the split and the analysis ($(elapsed))"
for t in parts_test plan_test; do
  timeout 300 "$T/$t" >"$OUTD/lf_$t.log" 2>&1 || fail "$t"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \]" "$OUTD/lf_$t.log" | head -8
done

echo "== lf: GPU tests ($(elapsed))"
timeout 240 "$T/plan_gpu_test" \
  --gtest_filter='PlanGpu.BandRowsWithKeyPrefix*:PlanGpu.CompoundMatchesReference:PlanGpu.PerHeadPatterns:PlanGpu.EveryKernelTableRow:PlanGpu.ForcedKernelRunsOrIsRefused' \
  >"$OUTD/lf_plan_gpu_test.log" 2>&1 || fail "plan_gpu_test"
grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \]|Failure|Expected|Which is|actual" \
  "$OUTD/lf_plan_gpu_test.log" | head -40
grep -qE "^\[  SKIPPED \] [0-9]+ tests?" "$OUTD/lf_plan_gpu_test.log" && fail "plan_gpu_test skipped tests"

echo "== lf: compute-sanitizer on small prefix and split plans ($(elapsed))"
sanitize_all lf "$T/plan_gpu_test" 'PlanGpu.BandRowsWithKeyPrefixSmall' || fail "compute-sanitizer"

echo "== lf: explain of longformer(256, 32) at L = 16384, D = 64 ($(elapsed))"
PYTHONPATH="$ROOT/bench" python3 - "$LIB" >"$OUTD/lf_explain.txt" 2>&1 <<'PY' || fail "explain"
import ctypes, sys
from gpu_bench import Lib  # its ctypes signatures of the C API
lib = Lib(sys.argv[1])
for spec, opts in (("longformer(256, 32)", ""), ("longformer(256, 32)", "compound=0"),
                   ("local(left=1024, right=0) | global_cols(0:4)", "")):
    h = ctypes.c_void_p()
    lib.check(lib.lib.spattn_plan_create(spec.encode(), 0, 0, 2, 16, 16, 16384, 16384, 64, float("nan"), opts.encode(),
                                         ctypes.byref(h)), spec)
    print(f"--- {spec} [{opts}]\n{lib.lib.spattn_plan_explain(h).decode()}\n")
    lib.lib.spattn_plan_destroy(h)
PY
grep -E "^---|compound plan|^  (tiles|rows|columns) \[|kernel sm90" "$OUTD/lf_explain.txt" | cut -c1-200 | head -12

echo "== lf: bench against FlexAttention, compound=0 (:nc) beside each ($(elapsed))"
# --budget-s: no case starts past it (a case takes 20-40 s: FlexAttention compiles per mask); timeout: its hard end.
bench() { budget_bench "lf_bench_$1" --lengths "$2" --dims "$3" --patterns "$4" --shapes :nc; }  # TAG LENGTHS DIMS PATTERNS
bench 16384_d64 16384 64 longformer,local,lfcols,sinks
bench 16384_d128 16384 128 longformer,local
bench 4096_d64 4096 64 longformer,lfcols,sinks
echo "longformer.sh: rc $rc ($(elapsed))"
exit $rc
