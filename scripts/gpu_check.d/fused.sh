#!/usr/bin/env bash
# scripts/gpu_check.d/fused.sh — GPU checks of the fused block-sparse attention (issue 5):
#   SASS (HGMMA in the sm_90a kernels), the GPU tests (tests/gpu/fused_test.cpp), compute-sanitizer (memcheck,
#   racecheck, synccheck) on a small case, and the benchmark against FlexAttention / SDPA (bench/gpu_bench.py).
# Run by scripts/gpu_check.sh with SPATTN_BUILD (build dir) and SPATTN_OUT (output dir). Standalone: with
# SPATTN_BUILD unset it configures and builds into build-fused/ itself (GoogleTest from .gtest/ if the
# machine has none). FUSED_BENCH_ARGS adds bench arguments (e.g. "--patterns local,causal --lengths 4096"; with
# "--baseline h100-fused" the bench also writes bench/baselines/h100-fused.{json,png}: bench/README.md).
set -uo pipefail
# The library is dlopen'ed into the PyTorch process by the bench: it must link libstdc++ dynamically. The GPU
# machine's image sets CXX=/opt/gcc/bin/g++, which links libstdc++ statically; two libstdc++ copies in one
# process crashed inside std::ostream (locale facets), so build with the system compiler.
unset CXX CC CUDAHOSTCXX
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTD=${SPATTN_OUT:-$ROOT/out}
mkdir -p "$OUTD"
BUILD=${SPATTN_BUILD:-}
rc=0
if [ -z "$BUILD" ]; then
  BUILD=$ROOT/build-fused
  extra=()
  if [ -d "$ROOT/.gtest" ] && ! [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] && ! [ -d /tmp/gtest-install ]; then
    cmake -S "$ROOT/.gtest" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install \
      -DBUILD_GMOCK=OFF >/dev/null && ninja -C /tmp/gtest-build install >/dev/null || echo "fused.sh: gtest build failed"
  fi
  [ -d /tmp/gtest-install ] && extra+=(-DGTest_ROOT=/tmp/gtest-install)
  if ! { cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON "${extra[@]}" \
           >"$OUTD/fused_build.log" 2>&1 &&
         ninja -C "$BUILD" -j"$(nproc)" spattn fused_test >>"$OUTD/fused_build.log" 2>&1; }; then
    grep -B2 -A6 "error" "$OUTD/fused_build.log" | head -30
    echo "fused.sh: build failed"
    exit 1
  fi
fi
LIB=$BUILD/libspattn.so
TEST=$BUILD/tests/fused_test

echo "== fused: SASS"
if command -v cuobjdump >/dev/null; then
  echo "HGMMA instructions: $(cuobjdump --dump-sass "$LIB" 2>/dev/null | grep -c HGMMA)"
  echo "HMMA instructions:  $(cuobjdump --dump-sass "$LIB" 2>/dev/null | grep -c HMMA)"
fi

echo "== fused: tests"
if [ -x "$TEST" ]; then
  "$TEST" >"$OUTD/fused_test.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |rel err|Failure|Expected|Which is|actual|error" "$OUTD/fused_test.log" | head -90
  echo "== fused: compute-sanitizer (memcheck, racecheck, synccheck) on a small case"
  if command -v compute-sanitizer >/dev/null; then
    # cases 1 (longformer, TMA), 51 (band kernel, tails, split items), 59 (band kernel, empty rows, Lq > Lk),
    # 69 (band kernel, causal split in 3: parts without chunks), 74 (band kernel, causal slab parts), 86 and 99 (the
    # band kernel at D=128: tails; split in 2)
    compute-sanitizer --tool memcheck --error-exitcode 3 "$TEST" \
      --gtest_filter='Fused/FusedSuite.MatchesReference/1:Fused/FusedSuite.MatchesReference/51:Fused/FusedSuite.MatchesReference/59:Fused/FusedSuite.MatchesReference/69:Fused/FusedSuite.MatchesReference/74:Fused/FusedSuite.MatchesReference/86:Fused/FusedSuite.MatchesReference/99' \
      >"$OUTD/fused_memcheck.log" 2>&1 || rc=1
    tail -3 "$OUTD/fused_memcheck.log"
    compute-sanitizer --tool racecheck --error-exitcode 3 "$TEST" \
      --gtest_filter='Fused/FusedSuite.MatchesReference/12:Fused/FusedSuite.MatchesReference/51:Fused/FusedSuite.MatchesReference/74:Fused/FusedSuite.MatchesReference/86' \
      >"$OUTD/fused_racecheck.log" 2>&1 || rc=1
    tail -3 "$OUTD/fused_racecheck.log"
    # synccheck: barriers (__syncthreads, named barriers) reached by every thread they wait for
    compute-sanitizer --tool synccheck --error-exitcode 3 "$TEST" \
      --gtest_filter='Fused/FusedSuite.MatchesReference/1:Fused/FusedSuite.MatchesReference/12:Fused/FusedSuite.MatchesReference/51:Fused/FusedSuite.MatchesReference/74' \
      >"$OUTD/fused_synccheck.log" 2>&1 || rc=1
    tail -3 "$OUTD/fused_synccheck.log"
  fi
else
  echo "no $TEST"
fi

echo "== fused: bench"
python3 "$ROOT/bench/gpu_bench.py" --lib "$LIB" --out "$OUTD/fused_bench.json" ${FUSED_BENCH_ARGS:-} || rc=1
exit $rc
