#!/usr/bin/env bash
# Session 10 run 5 (580c0a4 + an experiment build whose launch reads SPATTN_BAND_EXP): 2 runs a slab with an odd
# chunk count as chunk 0 alone first (its PV then rides with the first pair's S) instead of an unoverlapped 64-key
# step at the end. Fused tests and sanitizers with it, then ab_env.py 1 vs 2. Carry .gtest.
unset CXX CC CUDAHOSTCXX
set -u
t0=$(date +%s)
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null 2>&1 && ninja -C /tmp/gtest-build install >/dev/null
cmake -S . -B /tmp/bx -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install >/dev/null 2>&1 && ninja -C /tmp/bx spattn fused_test > /tmp/bx.log 2>&1 || { echo build failed; tail -30 /tmp/bx.log; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
export SPATTN_BAND_EXP=2
timeout 200 /tmp/bx/tests/fused_test > $OUT/t2.log 2>&1; echo "exp 2 tests rc $?: $(grep -E '^\[  (PASSED|FAILED)' $OUT/t2.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/t2.log | head -5
F=Fused/FusedSuite.MatchesReference
timeout 150 compute-sanitizer --tool racecheck /tmp/bx/tests/fused_test --gtest_filter="$F/51:$F/73:$F/74:$F/75" 2>&1 | tail -1
timeout 150 compute-sanitizer --tool memcheck /tmp/bx/tests/fused_test --gtest_filter="$F/51:$F/59:$F/69:$F/74:Fused/FusedGraph*" 2>&1 | tail -1
unset SPATTN_BAND_EXP
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 1 2 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
