#!/usr/bin/env bash
# Session 10 run 4 (f9873d4 + an experiment build whose launch reads SPATTN_BAND_EXP): 2 pins the PV wait below
# the softmax (a never-taken branch ends the block; ptxas otherwise hoists WARPGROUP.DEPBAR 0 above the row max),
# retried now that the consumers take turns (session 9, without turns: -1% / -2%); 3 the odd 64-key step's softmax
# with 2 partial chains too. Fused tests with each, then ab_env.py 1 vs 2 and 1 vs 3. Carry .gtest.
. bench/results/s10/common.sh
s10_build /tmp/bx spattn fused_test
for v in 2 3; do s10_tests /tmp/bx SPATTN_BAND_EXP $v; done
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 1 2 2>&1 | grep -v Warning
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 1 3 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
