#!/usr/bin/env bash
# Session 8 run 5: the tail at local L=4096: more items as slab parts (SPATTN_BAND_SLAB_ITEMS) and a static
# schedule (SPATTN_BAND_STATIC=1).
unset CXX CC CUDAHOSTCXX
set -u
T0=$(date +%s)
cmake -S . -B /tmp/bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null && ninja -C /tmp/bn spattn >/dev/null || { echo new build failed; exit 1; }
echo "built $(( $(date +%s) - T0 ))s"
c="local(256);4096;64;192x128:b"
for r in 1 2; do
  for st in 0 1; do
    for n in def -1 44 110 176 308; do
      if [ $n = def ]; then unset SPATTN_BAND_SLAB_ITEMS; else export SPATTN_BAND_SLAB_ITEMS=$n; fi
      echo -n "static=$st slab=$n "; SPATTN_BAND_STATIC=$st python3 bench/gpu_bench.py --lib /tmp/bn/libspattn.so --probe "$c" 2>&1 | tail -1
    done
  done
done
unset SPATTN_BAND_SLAB_ITEMS
for st in 0 1; do for c in "local(256);16384;64;192x128:b" "causal;4096;64;192x128:b"; do echo -n "static=$st "; SPATTN_BAND_STATIC=$st python3 bench/gpu_bench.py --lib /tmp/bn/libspattn.so --probe "$c" 2>&1 | tail -1; done; done
echo "done $(( $(date +%s) - T0 ))s"
