#!/usr/bin/env bash
# Session 7 run 4: draw lag (SPATTN_BAND_DRAW_LAG) and the fast reciprocal vs HEAD; fused tests with lag 4.
unset CXX CC CUDAHOSTCXX
set -u
T0=$(date +%s)
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null && ninja -C /tmp/gtest-build install >/dev/null
cmake -S . -B /tmp/bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install >/dev/null && ninja -C /tmp/bn spattn fused_test >/dev/null || { echo new build failed; exit 1; }
( cmake -S .ab/head -B /tmp/bh -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null && ninja -C /tmp/bh spattn >/dev/null; echo head-built $? ) > $OUT/hbuild.log 2>&1 &
echo "built $(( $(date +%s) - T0 ))s"
SPATTN_BAND_DRAW_LAG=4 timeout 150 /tmp/bn/tests/fused_test > $OUT/t.log 2>&1; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/t.log | head -20
SPATTN_BAND_DRAW_LAG=4 timeout 100 compute-sanitizer --tool memcheck /tmp/bn/tests/fused_test --gtest_filter='Fused/FusedSuite.MatchesReference/69:Fused/FusedSuite.MatchesReference/73:Fused/FusedSuite.MatchesReference/74:Fused/FusedGraph*' 2>&1 | tail -1
wait; cat $OUT/hbuild.log
echo "checks $(( $(date +%s) - T0 ))s"
for r in 1 2; do
  for c in "local(256);4096;64;192x128:b" "local(256);16384;64;192x128:b" "causal;4096;64;192x128:b"; do
    echo -n "head "; python3 bench/gpu_bench.py --lib /tmp/bh/libspattn.so --probe "$c" 2>&1 | tail -1
    for lag in 0 3 5; do echo -n "lag$lag "; SPATTN_BAND_DRAW_LAG=$lag python3 bench/gpu_bench.py --lib /tmp/bn/libspattn.so --probe "$c" 2>&1 | tail -1; done
  done
done
echo "done $(( $(date +%s) - T0 ))s"
