#!/usr/bin/env bash
# Session 10 run 3: tile_softmax's row max and row sum over kP independent partials (chains of 16 / kP instead of
# 16 and 32 dependent ops a row) in the band kernel's 128-key steps: an experiment build whose launch picks kP = 1
# (HEAD), 2 or 4 from SPATTN_BAND_EXP; fused tests with kP = 4 and 2, then ab_env.py 1 vs 4 and 1 vs 2.
. bench/results/s10/common.sh
s10_build /tmp/bx spattn fused_test
for v in 4 2; do s10_tests /tmp/bx SPATTN_BAND_EXP $v; done
echo "tests done at $(( $(date +%s) - t0 )) s"
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 1 4 2>&1 | grep -v Warning
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 2 1 2 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
