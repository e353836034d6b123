#!/usr/bin/env bash
# Session 11 run 1 (on an uncommitted experiment state, no redo path yet; see s11/common.sh): the band kernel's
# 128-key steps with exponentials against the running maximum (no row-max
# reduction before them; rescale only when a partial row sum passes 2^16), an experiment build whose launch picks
# it with SPATTN_BAND_EXP=1; fused tests with it, then ab_env.py 0 vs 1 (one process, alternation).
. bench/results/s10/common.sh
s10_build /tmp/bx spattn fused_test
s10_tests /tmp/bx SPATTN_BAND_EXP 1
echo "tests done at $(( $(date +%s) - t0 )) s"
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 2 0 1 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
