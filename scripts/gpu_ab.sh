#!/usr/bin/env bash
# scripts/gpu_ab.sh OUTDIR — on a GPU machine: builds this tree and an earlier one (.ab/old, e.g. from
# `git archive <commit> src include CMakeLists.txt cmake tests examples`), runs this tree's GPU tests
# (fused and unfused, against the CPU reference), compute-sanitizer on small cases, and the same-process A/B of
# the two libraries on the fused suite (bench/ab.py). Logs and JSON go to OUTDIR. GoogleTest from .gtest/ if the
# machine has none.
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler: the library is dlopen'ed into the PyTorch process (libstdc++)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTD=${1:-$ROOT/out}
mkdir -p "$OUTD"
extra=()
if [ -d "$ROOT/.gtest" ] && ! [ -d /tmp/gtest-install ]; then
  cmake -S "$ROOT/.gtest" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install \
    -DBUILD_GMOCK=OFF >/dev/null && ninja -C /tmp/gtest-build install >/dev/null || echo "gpu_ab.sh: gtest build failed"
fi
[ -d /tmp/gtest-install ] && extra+=(-DGTest_ROOT=/tmp/gtest-install)
cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON)
( cmake -S "$ROOT" -B /tmp/b-new "${cfg[@]}" "${extra[@]}" && ninja -C /tmp/b-new ) >"$OUTD/build_new.log" 2>&1 &
pn=$!
if [ -d "$ROOT/.ab/old" ]; then
  ( cmake -S "$ROOT/.ab/old" -B /tmp/b-old "${cfg[@]}" -DSPATTN_TESTS=OFF && ninja -C /tmp/b-old spattn ) >"$OUTD/build_old.log" 2>&1 &
  po=$!
  wait $po || { tail -20 "$OUTD/build_old.log"; echo "gpu_ab.sh: old build failed"; }
fi
wait $pn || { grep -B2 -A8 error "$OUTD/build_new.log" | head -40; echo "gpu_ab.sh: build failed"; exit 1; }
rc=0
echo "== GPU tests"
ctest --test-dir /tmp/b-new -L gpu -j 1 >"$OUTD/ctest_gpu.log" 2>&1 || rc=1
tail -4 "$OUTD/ctest_gpu.log"
grep -E "Failed|\*\*\*" "$OUTD/ctest_gpu.log" | head -20
echo "== all tests"
ctest --test-dir /tmp/b-new -LE "gpu|oracle" -j 8 >"$OUTD/ctest_cpu.log" 2>&1 || rc=1
tail -2 "$OUTD/ctest_cpu.log"
echo "== compute-sanitizer"
T=/tmp/b-new/tests/fused_test
compute-sanitizer --tool memcheck --error-exitcode 3 "$T" \
  --gtest_filter='Fused/FusedSuite.MatchesReference/1:Fused/FusedSuite.MatchesReference/51:Fused/FusedSuite.MatchesReference/69:FusedApi.*' \
  >"$OUTD/memcheck.log" 2>&1 || rc=1
tail -2 "$OUTD/memcheck.log"
echo "== A/B"
if [ -f /tmp/b-old/libspattn.so ]; then
  python3 "$ROOT/bench/ab.py" --a /tmp/b-old/libspattn.so --b /tmp/b-new/libspattn.so --json "$OUTD/ab.json" ${AB_ARGS:-} || rc=1
fi
exit $rc
