#!/usr/bin/env bash
# Session 11: the working tree's fused GPU tests only (after the review moved the running-max choice into the
# device plan): build, all fused tests, memcheck of the running-max cases (76, 79, 84).
. bench/results/s10/common.sh
s10_build /tmp/bx spattn fused_test
timeout 300 /tmp/bx/tests/fused_test > $OUT/tests.log 2>&1
echo "tests rc $?: $(grep -E '^\[  (PASSED|FAILED)' $OUT/tests.log | tr '\n' ' ')"
grep -E "FAILED  \]|RunningMaxChosen" $OUT/tests.log | head -5
timeout 200 compute-sanitizer --tool memcheck /tmp/bx/tests/fused_test --gtest_filter="Fused/FusedSuite.MatchesReference/76:Fused/FusedSuite.MatchesReference/79:Fused/FusedSuite.MatchesReference/84:FusedApi.RunningMax*" 2>&1 | tail -1
