#!/usr/bin/env bash
# Session 10: band-kernel consumers taking turns at their S / PV issue (SPATTN_BAND_TURNS=1) vs without (HEAD's
# kernel): the fused tests and sanitizers of the turns build, then ours alone (--no-flex) on local and causal,
# L=4096 and 16384, three rounds in alternation. Carry .gtest.
unset CXX CC CUDAHOSTCXX
set -u
t0=$(date +%s)
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null && ninja -C /tmp/gtest-build install >/dev/null
build() {  # dir turns targets...
  local d=$1 t=$2; shift 2
  cmake -S . -B $d -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install \
    "-DCMAKE_CUDA_FLAGS=-DSPATTN_BAND_TURNS=$t" >/dev/null && ninja -C $d -j8 "$@" > $d.log 2>&1 || { echo "build $d failed"; tail -20 $d.log; }
}
build /tmp/b0 0 spattn &
build /tmp/b1 1 spattn fused_test &
wait
echo "built in $(( $(date +%s) - t0 )) s"
timeout 200 /tmp/b1/tests/fused_test > $OUT/t1.log 2>&1; echo "turns tests rc $?: $(grep -E '^\[  (PASSED|FAILED)' $OUT/t1.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/t1.log | head -8
F=Fused/FusedSuite.MatchesReference
timeout 150 compute-sanitizer --tool racecheck /tmp/b1/tests/fused_test --gtest_filter="$F/51:$F/73:$F/74:$F/75" 2>&1 | tail -1
timeout 150 compute-sanitizer --tool memcheck /tmp/b1/tests/fused_test --gtest_filter="$F/51:$F/59:$F/69:$F/74" 2>&1 | tail -1
echo "checks done at $(( $(date +%s) - t0 )) s"
for r in 1 2 3; do
  for v in 1 0; do
    python3 bench/gpu_bench.py --lib /tmp/b$v/libspattn.so --patterns ${AB_PATTERNS:-local,causal} --lengths 4096,16384 --reps 20 --no-flex --out $OUT/turns$v-$r.json 2>&1 | grep -E "^(local|causal) .*D= 64" | cut -c1-60 | sed "s/^/turns$v-$r /"
  done
done
echo "done at $(( $(date +%s) - t0 )) s"
rm -f $OUT/*.png
