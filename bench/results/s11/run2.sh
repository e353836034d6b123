#!/usr/bin/env bash
# Session 11 run 2: the speculative-max softmax (SPATTN_BAND_EXP=1) with its rescale and exact-redo paths; new
# "rising scores" test cases (76-79). Builds the experiment and (for path coverage) a trace build that prints from
# the slow paths; fused tests with EXP=1 and 0; sanitizers on the new cases with EXP=1; A/B 0 vs 1.
. bench/results/s10/common.sh
. bench/results/s11/common.sh
s11_trace_build
s10_build /tmp/bx spattn fused_test
s10_tests /tmp/bx SPATTN_BAND_EXP 1
s10_tests /tmp/bx SPATTN_BAND_EXP 0
wait
s11_trace_cases
s11_sanitize
echo "tests done at $(( $(date +%s) - t0 )) s"
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 2 0 1 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
