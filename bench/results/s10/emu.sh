#!/usr/bin/env bash
# Session 10: part of the band kernel's exponentials by a polynomial on the FMA pipe (poly_exp2, FlashAttention-4's
# offload of the MUFU) — builds with SPATTN_BAND_EMU_NUM / _DEN = 0/1 (HEAD's kernel), 1/8, 1/4, 3/8; the fused
# tests of the 1/4 and 3/8 builds; then ours alone (--no-flex) on local and causal, L=4096 and 16384, two rounds
# in alternation of the builds. Carry .gtest.
unset CXX CC CUDAHOSTCXX
set -u
t0=$(date +%s)
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null && ninja -C /tmp/gtest-build install >/dev/null
build() {  # dir num den targets...
  local d=$1 n=$2 k=$3; shift 3
  cmake -S . -B $d -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install \
    "-DCMAKE_CUDA_FLAGS=-DSPATTN_BAND_EMU_NUM=$n -DSPATTN_BAND_EMU_DEN=$k" >/dev/null && ninja -C $d -j4 "$@" > $d.log 2>&1 || { echo "build $d failed"; tail -20 $d.log; }
}
build /tmp/b0 0 1 spattn &
build /tmp/b18 1 8 spattn &
build /tmp/b14 1 4 spattn fused_test &
build /tmp/b38 3 8 spattn fused_test &
wait
echo "built in $(( $(date +%s) - t0 )) s"
for v in 14 38; do
  timeout 150 /tmp/b$v/tests/fused_test > $OUT/t$v.log 2>&1; echo "emu $v: $(grep -E '^\[  (PASSED|FAILED)' $OUT/t$v.log | tr '\n' ' ')"; grep -E "FAILED  \]|rel err" $OUT/t$v.log | head -8
done
echo "tests done at $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  for v in 0 18 14 38; do
    python3 bench/gpu_bench.py --lib /tmp/b$v/libspattn.so --patterns local,causal --lengths 4096,16384 --reps 20 --no-flex --out $OUT/emu$v-$r.json 2>&1 | grep -E "^(local|causal) " | cut -c1-100 | sed "s/^/emu$v-$r /"
  done
  echo "round $r done at $(( $(date +%s) - t0 )) s"
done
rm -f $OUT/*.png
