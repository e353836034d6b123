#!/usr/bin/env bash
# Session 10 run 4 (f9873d4 + an experiment build whose launch reads SPATTN_BAND_EXP): 2 pins the PV wait below
# the softmax (a never-taken branch ends the block; ptxas otherwise hoists WARPGROUP.DEPBAR 0 above the row max),
# retried now that the consumers take turns (session 9, without turns: -1% / -2%); 3 the odd 64-key step's softmax
# with 2 partial chains too. Fused tests with each, then ab_env.py 1 vs 2 and 1 vs 3. Carry .gtest.
unset CXX CC CUDAHOSTCXX
set -u
t0=$(date +%s)
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null 2>&1 && ninja -C /tmp/gtest-build install >/dev/null
cmake -S . -B /tmp/bx -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install >/dev/null 2>&1 && ninja -C /tmp/bx spattn fused_test > /tmp/bx.log 2>&1 || { echo build failed; tail -30 /tmp/bx.log; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
for v in 2 3; do
  SPATTN_BAND_EXP=$v timeout 200 /tmp/bx/tests/fused_test > $OUT/t$v.log 2>&1; echo "exp $v tests rc $?: $(grep -E '^\[  (PASSED|FAILED)' $OUT/t$v.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/t$v.log | head -5
done
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 1 2 2>&1 | grep -v Warning
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 1 3 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
