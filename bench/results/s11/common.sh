# Sourced (after bench/results/s10/common.sh) by session 11's experiment scripts run2-run5, which ran on uncommitted
# states of the working tree (an experiment build whose band-kernel launch read SPATTN_BAND_EXP: 0 the kernel of
# HEAD, 1-3 running-max variants; run5's kernel file: run5-experiment.patch). Consolidated after they ran, with
# the commands they ran (run2 and run3 wrote the trace build's log to /tmp instead of $OUT).
# s11_trace_build: in the background, a build whose slow paths print (-DSPATTN_SPEC_TRACE) into /tmp/bt.
# s11_trace_cases: the rising-score cases 76-79 with it, counting the redo and rescale paths taken.
# s11_sanitize: racecheck and memcheck of rising-score cases with SPATTN_BAND_EXP=1.
F=Fused/FusedSuite.MatchesReference
s11_trace_build() {
  ( cmake -S . -B /tmp/bt -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON \
      -DGTest_ROOT=/tmp/gtest-install "-DCMAKE_CUDA_FLAGS=-DSPATTN_SPEC_TRACE" > $OUT/bt.cfg 2>&1 &&
    ninja -C /tmp/bt fused_test > $OUT/bt.log 2>&1; echo "trace build rc $?" ) &
}
s11_trace_cases() {
  for n in 76 77 78 79; do
    SPATTN_BAND_EXP=1 timeout 100 /tmp/bt/tests/fused_test --gtest_filter="$F/$n" > $OUT/trace$n.log 2>&1
    echo "case $n trace rc $?: redo $(grep -c 'spec: redo' $OUT/trace$n.log) rescale $(grep -c 'spec: rescale' $OUT/trace$n.log) $(grep -E 'rel err' $OUT/trace$n.log | cut -c1-100)"
  done
}
s11_sanitize() {
  SPATTN_BAND_EXP=1 timeout 150 compute-sanitizer --tool racecheck /tmp/bx/tests/fused_test --gtest_filter="$F/76:$F/78:$F/51" 2>&1 | tail -1
  SPATTN_BAND_EXP=1 timeout 150 compute-sanitizer --tool memcheck /tmp/bx/tests/fused_test --gtest_filter="$F/76:$F/77:$F/78:$F/74" 2>&1 | tail -1
}
