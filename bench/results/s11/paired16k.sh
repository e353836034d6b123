#!/usr/bin/env bash
# Session 11: four more fresh paired bench processes of causal at L=16384 (ours and FlexAttention in alternation)
# with the build of the final check (.ab/head = git archive HEAD; carry .ab; builds it if the machine is fresh).
set -u
cd .ab/head || exit 1
unset CXX CC CUDAHOSTCXX
if ! [ -f build-fused/libspattn.so ]; then
  cmake -S . -B build-fused -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON > /tmp/b.log 2>&1 &&
    ninja -C build-fused spattn >> /tmp/b.log 2>&1 || { tail -20 /tmp/b.log; exit 1; }
fi
for r in 1 2 3 4; do
  python3 bench/gpu_bench.py --lib build-fused/libspattn.so --lengths 16384 --reps 20 --patterns causal --out $OUT/p16k-$r.json 2>&1 | grep -E "^causal +16384 +64"
done
rm -f $OUT/*.png
