#!/usr/bin/env bash
# A/B of the working tree vs .ab/head (HEAD), plus the fused tests and sanitizers of the working tree.
unset CXX CC CUDAHOSTCXX
set -u
cmake -S .ab/head -B /tmp/bh -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null && ninja -C /tmp/bh spattn >/dev/null || { echo head build failed; exit 1; }
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null && ninja -C /tmp/gtest-build install >/dev/null
cmake -S . -B /tmp/bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install >/dev/null && ninja -C /tmp/bn spattn fused_test >/dev/null || { echo new build failed; exit 1; }
timeout 120 /tmp/bn/tests/fused_test > $OUT/t.log 2>&1; grep -E "^\[  (PASSED|FAILED)" $OUT/t.log
timeout 150 compute-sanitizer --tool memcheck /tmp/bn/tests/fused_test --gtest_filter='Fused/FusedSuite.MatchesReference/1:Fused/FusedSuite.MatchesReference/51:Fused/FusedSuite.MatchesReference/59:Fused/FusedSuite.MatchesReference/69:Fused/FusedSuite.MatchesReference/73:Fused/FusedGraph*' 2>&1 | tail -1
timeout 150 compute-sanitizer --tool racecheck /tmp/bn/tests/fused_test --gtest_filter='Fused/FusedSuite.MatchesReference/12:Fused/FusedSuite.MatchesReference/51:Fused/FusedSuite.MatchesReference/73:Fused/FusedSuite.MatchesReference/75' 2>&1 | tail -1
for r in 1 2; do
  for v in new head; do
    lib=/tmp/bn/libspattn.so; [ $v = head ] && lib=/tmp/bh/libspattn.so
    python3 bench/gpu_bench.py --lib $lib --patterns ${AB_PATTERNS:-local,causal} --lengths 4096,16384 --reps 20 --no-flex --out $OUT/ab-$v$r.json 2>&1 | grep -E "^(local|causal|dense) " | awk -v t=$v$r '{print t, $1, $2, $3, $4}'
  done
done
rm -f $OUT/*.png
