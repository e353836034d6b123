#!/usr/bin/env bash
# Session 10 run 5 (580c0a4 + an experiment build whose launch reads SPATTN_BAND_EXP, odd-first-attempt.patch): 2
# runs a slab with an odd chunk count as chunk 0 alone first (its PV then rides with the first pair's S) instead of
# an unoverlapped 64-key step at the end. Fused tests and sanitizers with it, then ab_env.py 1 vs 2. Carry .gtest.
. bench/results/s10/common.sh
s10_build /tmp/bx spattn fused_test
s10_tests /tmp/bx SPATTN_BAND_EXP 2
s10_sanitize /tmp/bx SPATTN_BAND_EXP 2
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 1 2 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
