#!/usr/bin/env bash
# Session 10, turns A/B in one process: an experiment build whose band kernel launch reads SPATTN_BAND_TURNS;
# the fused tests and sanitizers with turns on, then ab_turns.py (both kernels timed in alternation). Carry .gtest.
. bench/results/s10/common.sh
s10_build /tmp/bt spattn fused_test
s10_tests /tmp/bt SPATTN_BAND_TURNS 1
s10_sanitize /tmp/bt SPATTN_BAND_TURNS 1
echo "checks done at $(( $(date +%s) - t0 )) s"
python3 bench/results/s10/ab_turns.py /tmp/bt/libspattn.so 3 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
