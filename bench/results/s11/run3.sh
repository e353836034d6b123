#!/usr/bin/env bash
# Session 11 run 3: A/B of the speculative-max softmax in two layouts (EXP=1: the exact step after the PV wait,
# with the redo path; EXP=2: the exact step before it, redo traps) against HEAD (EXP=0); and the trace build's
# path coverage on the rising-score cases (76-79).
. bench/results/s10/common.sh
. bench/results/s11/common.sh
s11_trace_build
s10_build /tmp/bx spattn fused_test
s10_tests /tmp/bx SPATTN_BAND_EXP 2
wait
s11_trace_cases
echo "tests done at $(( $(date +%s) - t0 )) s"
for pair in "0 1" "0 2" "1 2"; do
  python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 2 $pair 2>&1 | grep -v Warning
done
echo "done at $(( $(date +%s) - t0 )) s"
