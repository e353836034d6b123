#!/usr/bin/env bash
# Session 10 run 3: tile_softmax's row max and row sum over kP independent partials (chains of 16 / kP instead of
# 16 and 32 dependent ops a row) in the band kernel's 128-key steps: an experiment build whose launch picks kP = 1
# (HEAD), 2 or 4 from SPATTN_BAND_EXP; fused tests with kP = 4 and 2, then ab_env.py 1 vs 2 and 1 vs 4.
unset CXX CC CUDAHOSTCXX
set -u
t0=$(date +%s)
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null 2>&1 && ninja -C /tmp/gtest-build install >/dev/null
cmake -S . -B /tmp/bx -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install >/dev/null 2>&1 && ninja -C /tmp/bx spattn fused_test > /tmp/bx.log 2>&1 || { echo build failed; tail -30 /tmp/bx.log; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
for v in 4 2; do
  SPATTN_BAND_EXP=$v timeout 200 /tmp/bx/tests/fused_test > $OUT/t$v.log 2>&1; echo "kP=$v tests rc $?: $(grep -E '^\[  (PASSED|FAILED)' $OUT/t$v.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/t$v.log | head -5
done
echo "tests done at $(( $(date +%s) - t0 )) s"
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 1 4 2>&1 | grep -v Warning
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 2 1 2 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
