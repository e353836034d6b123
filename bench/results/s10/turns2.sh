#!/usr/bin/env bash
# Session 10, turns A/B in one process: an experiment build whose band kernel launch reads SPATTN_BAND_TURNS;
# the fused tests and sanitizers with turns on, then ab_turns.py (both kernels timed in alternation). Carry .gtest.
unset CXX CC CUDAHOSTCXX
set -u
t0=$(date +%s)
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null 2>&1 && ninja -C /tmp/gtest-build install >/dev/null
cmake -S . -B /tmp/bt -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install >/dev/null 2>&1 && ninja -C /tmp/bt spattn fused_test > /tmp/bt.log 2>&1 || { echo build failed; tail -30 /tmp/bt.log; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
export SPATTN_BAND_TURNS=1
timeout 200 /tmp/bt/tests/fused_test > $OUT/t1.log 2>&1; echo "turns tests rc $?: $(grep -E '^\[  (PASSED|FAILED)' $OUT/t1.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/t1.log | head -8
F=Fused/FusedSuite.MatchesReference
timeout 150 compute-sanitizer --tool racecheck /tmp/bt/tests/fused_test --gtest_filter="$F/51:$F/73:$F/74:$F/75" 2>&1 | tail -1
timeout 150 compute-sanitizer --tool memcheck /tmp/bt/tests/fused_test --gtest_filter="$F/51:$F/59:$F/69:$F/74:Fused/FusedGraph*" 2>&1 | tail -1
unset SPATTN_BAND_TURNS
echo "checks done at $(( $(date +%s) - t0 )) s"
python3 bench/results/s10/ab_turns.py /tmp/bt/libspattn.so 3 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
