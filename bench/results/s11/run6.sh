#!/usr/bin/env bash
# Session 11 run 6: the band kernel's running-max steps as committed (BandTraits<192, *, true>, chosen for rows of
# 1536+ keys, FusedOptions::running_max): fused tests, sanitizers on the rmax cases (76-79, 81-84), then
# ab_flags.py 1024 (never) vs 512 (always), 3 rounds, one process.
. bench/results/s10/common.sh
s10_build /tmp/bx spattn fused_test
timeout 300 /tmp/bx/tests/fused_test > $OUT/tests.log 2>&1
echo "tests rc $?: $(grep -E '^\[  (PASSED|FAILED)' $OUT/tests.log | tr '\n' ' ')"
grep -E "FAILED  \]" $OUT/tests.log | head -5
grep -E "^  (band 192 rmax|band 192 causal 4099 chosen|band 192 local no rmax)" $OUT/tests.log | cut -c1-110
F=Fused/FusedSuite.MatchesReference
timeout 200 compute-sanitizer --tool racecheck /tmp/bx/tests/fused_test --gtest_filter="$F/76:$F/79:$F/81:$F/83" 2>&1 | tail -1
timeout 200 compute-sanitizer --tool memcheck /tmp/bx/tests/fused_test --gtest_filter="$F/76:$F/77:$F/79:$F/82:$F/83" 2>&1 | tail -1
echo "tests done at $(( $(date +%s) - t0 )) s"
python3 bench/results/s11/ab_flags.py /tmp/bx/libspattn.so 1024 512 3 2>&1 | grep -v Warning
echo "done at $(( $(date +%s) - t0 )) s"
