#!/usr/bin/env bash
# Session 11 run 7 (uncommitted experiment build: BandTraits<192, *, true, X> picked by SPATTN_BAND_EXP=X for the
# running-max plans): X=2 running-max sums in 4 chains, X=4 no consumer turns, X=5 the turn passed between the S
# and PV issue; fused tests with 4 and 5; A/B of each against X=0 (the committed kernel) on causal.
. bench/results/s10/common.sh
s10_build /tmp/bx spattn fused_test
for x in 4 5; do
  SPATTN_BAND_EXP=$x timeout 200 /tmp/bx/tests/fused_test > $OUT/t$x.log 2>&1
  echo "EXP=$x fused tests rc $?: $(grep -E '^\[  (PASSED|FAILED)' $OUT/t$x.log | tr '\n' ' ')"
done
for x in 2 4 5; do
  AB_CASES=causal,causal_b1h2 python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 2 0 $x 2>&1 | grep -v Warning
done
echo "done at $(( $(date +%s) - t0 )) s"
