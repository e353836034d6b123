#!/usr/bin/env bash
# scripts/gpu_check.d/fwd128.sh [OUTDIR] — issue 40's forward experiments at head dim 128 (SPATTN_FWD_EXP, temporary):
# builds the library, fused_test and spattn._core into build-fwd128/ (gpu_lib.sh), runs the experiments' GPU tests
# (tests/gpu/fused_test.cpp, Fused/FusedFwdExp: causal, windows and GQA at awkward lengths against the fp64
# reference, each checked to have run with its bits) and the six cases of the windows table with every variant
# against the measured kernels, in one process (bench/fwd_exp_ab.py: CUDA graphs replayed in alternation,
# FlashAttention-4 alongside; "band:..." the band kernel forced at D=128) into OUTDIR/fwd_exp.json.
set -uo pipefail
unset CXX CC CUDAHOSTCXX
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
OUTD=${1:-${SPATTN_OUT:-$ROOT/out}}
mkdir -p "$OUTD"
OUTD=$(cd "$OUTD" && pwd)
BUILD=$ROOT/build-fwd128
rc=0
nb=$(python3 -c "import nanobind; print(nanobind.cmake_dir())" 2>/dev/null) || { echo "fwd128.sh: no nanobind"; exit 2; }
SPATTN_EXTRA_CMAKE="-DSPATTN_PYTHON=ON -DSPATTN_TESTS=ON -DSPATTN_TOOLS=OFF -Dnanobind_DIR=$nb" \
  gpu_build "$BUILD" "$OUTD/fwd128_build.log" fused_test _core || exit 1
echo "== fwd128: tests ($(elapsed))"
timeout 300 "$BUILD/tests/fused_test" --gtest_filter='Fused/FusedFwdExp.*:FusedApi.FwdExpEnvSaysWhy' \
  >"$OUTD/fwd128_tests.log" 2>&1 || fail "fused_test (FusedFwdExp)"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUTD/fwd128_tests.log" | head -20
echo "== fwd128: A/B of SPATTN_FWD_EXP in one process ($(elapsed))"
PYTHONPATH=$BUILD/python timeout 400 python3 "$ROOT/bench/fwd_exp_ab.py" --reps 20 --json "$OUTD/fwd_exp.json" \
  >"$OUTD/fwd_exp.log" 2>&1 || fail "fwd_exp_ab.py"
cat "$OUTD/fwd_exp.log"
echo "fwd128.sh: rc $rc ($(elapsed))"
exit $rc
