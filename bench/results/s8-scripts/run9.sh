#!/usr/bin/env bash
# Session 8 run 9: the TMA and cp.async kernels' descriptors by adds (desc_lo / desc_of_lo) vs HEAD (4cd9519).
unset CXX CC CUDAHOSTCXX
set -u
T0=$(date +%s)
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null && ninja -C /tmp/gtest-build install >/dev/null
cmake -S . -B /tmp/bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install >/dev/null && ninja -C /tmp/bn spattn fused_test >/dev/null || { echo new build failed; exit 1; }
( cmake -S .ab/head -B /tmp/bh -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null && ninja -C /tmp/bh spattn >/dev/null; echo head-built $? ) > $OUT/hbuild.log 2>&1 &
echo "built $(( $(date +%s) - T0 ))s"
timeout 200 /tmp/bn/tests/fused_test > $OUT/t.log 2>&1; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/t.log | head -20
timeout 120 compute-sanitizer --tool memcheck /tmp/bn/tests/fused_test --gtest_filter='Fused/FusedSuite.MatchesReference/1:Fused/FusedSuite.MatchesReference/59:Fused/FusedSuite.MatchesReference/69:Fused/FusedSuite.MatchesReference/73:Fused/FusedSuite.MatchesReference/74:Fused/FusedGraph*:FusedApi*' 2>&1 | tail -1
timeout 120 compute-sanitizer --tool racecheck /tmp/bn/tests/fused_test --gtest_filter='Fused/FusedSuite.MatchesReference/12:Fused/FusedSuite.MatchesReference/51:Fused/FusedSuite.MatchesReference/74' 2>&1 | tail -1
wait; cat $OUT/hbuild.log
echo "checks $(( $(date +%s) - T0 ))s"
for r in 1 2; do
  for c in "dense;16384;64;192x128" "dense;16384;128;128x128" "longformer(256, 32);4096;64;64x64" "bigbird(64, 1, 2, 3, seed=0);4096;64;64x64" "dilated(256, 2);16384;64;64x128" "longformer(256, 32);16384;64;64x128" "local(256);4096;64;192x128:b"; do
    echo -n "head "; python3 bench/gpu_bench.py --lib /tmp/bh/libspattn.so --probe "$c" 2>&1 | tail -1
    echo -n "new  "; python3 bench/gpu_bench.py --lib /tmp/bn/libspattn.so --probe "$c" 2>&1 | tail -1
  done
done
echo "done $(( $(date +%s) - T0 ))s"
