#!/usr/bin/env bash
# Session 10: three more fresh paired bench processes at L=4096 of HEAD (.ab/head, carry .ab) after final.sh's
# third run read causal 366.9 / 249.9 (both ~20% under the other runs).
set -u
unset CXX CC CUDAHOSTCXX
cd .ab/head || exit 1
cmake -S . -B /tmp/bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null 2>&1 && ninja -C /tmp/bn spattn >/dev/null || { echo build failed; exit 1; }
for r in 4 5 6; do
  python3 bench/gpu_bench.py --lib /tmp/bn/libspattn.so --lengths 4096 --reps 20 --patterns local,causal --out $OUT/paired$r.json 2>&1 | grep -E "^(local|causal) +4096 +64"
done
rm -f $OUT/*.png
