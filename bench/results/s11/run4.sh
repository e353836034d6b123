#!/usr/bin/env bash
# Session 11 run 4: the speculative-max softmax (SPATTN_BAND_EXP=1) with its exact step before the PV wait and
# the redo (mma.sync S, exact step) after it; fused tests; the trace build's path coverage on the rising-score
# cases (76-79); sanitizers; A/B 0 vs 1 (3 rounds).
. bench/results/s10/common.sh
. bench/results/s11/common.sh
s11_trace_build
s10_build /tmp/bx spattn fused_test
s10_tests /tmp/bx SPATTN_BAND_EXP 1
wait
s11_trace_cases
s11_sanitize
echo "tests done at $(( $(date +%s) - t0 )) s"
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 0 1 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
