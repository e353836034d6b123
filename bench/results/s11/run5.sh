#!/usr/bin/env bash
# Session 11 run 5: the speculative-max softmax with the redo at the end of the step (SPATTN_BAND_EXP=1), and
# the same with spec only on slabs of 6 or more 128-key steps (=3); fused tests with both; the trace build's
# path coverage on the rising-score cases (76-79); sanitizers; A/B 0 vs 1 and 0 vs 3 (3 rounds).
. bench/results/s10/common.sh
. bench/results/s11/common.sh
s11_trace_build
s10_build /tmp/bx spattn fused_test
s10_tests /tmp/bx SPATTN_BAND_EXP 1
s10_tests /tmp/bx SPATTN_BAND_EXP 3
wait
s11_trace_cases
s11_sanitize
echo "tests done at $(( $(date +%s) - t0 )) s"
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 0 1 2>&1 | grep -v Warning
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 2 0 3 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
