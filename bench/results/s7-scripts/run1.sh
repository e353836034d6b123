#!/usr/bin/env bash
# Session 7: slab parts + band trace. One build (the A/B is by variant: default vs :ns / :ss), one trace build.
unset CXX CC CUDAHOSTCXX
set -u
T0=$(date +%s)
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null && ninja -C /tmp/gtest-build install >/dev/null
cmake -S . -B /tmp/bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install >/dev/null && ninja -C /tmp/bn spattn fused_test >/dev/null || { echo new build failed; exit 1; }
echo "built $(( $(date +%s) - T0 ))s"
( cmake -S . -B /tmp/btr -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TRACE=ON -DSPATTN_TESTS=OFF >/dev/null && ninja -C /tmp/btr spattn >/dev/null; echo trace-built $? ) > $OUT/trbuild.log 2>&1 &
timeout 200 /tmp/bn/tests/fused_test > $OUT/t.log 2>&1; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/t.log | head
echo "tests $(( $(date +%s) - T0 ))s"
timeout 120 compute-sanitizer --tool memcheck /tmp/bn/tests/fused_test --gtest_filter='Fused/FusedSuite.MatchesReference/73:Fused/FusedSuite.MatchesReference/74:Fused/FusedSuite.MatchesReference/69' 2>&1 | tail -1
timeout 120 compute-sanitizer --tool racecheck /tmp/bn/tests/fused_test --gtest_filter='Fused/FusedSuite.MatchesReference/74' 2>&1 | tail -1
wait
cat $OUT/trbuild.log
echo "sanitizers $(( $(date +%s) - T0 ))s"
for c in "local(256);4096;64;192x128:b" "local(256);4096;64;192x128:ns" "local(256);4096;64;192x128:ss" "local(256);16384;64;192x128:b" "causal;4096;64;192x128:b"; do
  n=$(echo "$c" | tr -c 'a-z0-9\n' '_')
  SPATTN_TRACE_FILE=$OUT/tr_$n.bin python3 bench/gpu_bench.py --lib /tmp/btr/libspattn.so --probe "$c" 2>&1 | tail -1
  python3 bench/trace_band.py $OUT/tr_$n.bin --json $OUT/tr_$n.json > /dev/null; echo "== $c"; python3 -c "import json;d=json.load(open('$OUT/tr_$n.json'));print(json.dumps(d))"
done
echo "traces $(( $(date +%s) - T0 ))s"
for r in 1 2 3; do
  for c in "local(256);4096;64;192x128:b" "local(256);4096;64;192x128:ns" "local(256);4096;64;192x128:ss" "causal;4096;64;192x128:b" "causal;4096;64;192x128:ns" "local(256);16384;64;192x128:b" "local(256);16384;64;192x128:ns"; do
    python3 bench/gpu_bench.py --lib /tmp/bn/libspattn.so --probe "$c" 2>&1 | tail -1
  done
done
echo "done $(( $(date +%s) - T0 ))s"
rm -f $OUT/*.png
