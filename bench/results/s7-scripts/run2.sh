#!/usr/bin/env bash
# Session 7 run 2: how much the band kernel's epilogue costs: trace (event index taken at the item's start) and a
# build that skips the output store (SPATTN_DEBUG_FLAGS=1, timing only) against the normal build.
unset CXX CC CUDAHOSTCXX
set -u
T0=$(date +%s)
b() { cmake -S . -B $1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF "${@:2}" >/dev/null && ninja -C $1 spattn >/dev/null || echo "build $1 failed"; }
b /tmp/bn
b /tmp/btr -DSPATTN_TRACE=ON
b /tmp/bns "-DCMAKE_CUDA_FLAGS=-DSPATTN_DEBUG_FLAGS=1"
echo "built $(( $(date +%s) - T0 ))s"
for c in "local(256);4096;64;192x128:b" "local(256);16384;64;192x128:b"; do
  n=$(echo "$c" | tr -c 'a-z0-9\n' '_')
  SPATTN_TRACE_FILE=$OUT/tr_$n.bin python3 bench/gpu_bench.py --lib /tmp/btr/libspattn.so --probe "$c" 2>&1 | tail -1
  python3 bench/trace_band.py $OUT/tr_$n.bin --json $OUT/tr_$n.json > /dev/null; echo "== $c"; python3 -c "import json;d=json.load(open('$OUT/tr_$n.json'));print(json.dumps(d))"
done
for r in 1 2 3; do
  for c in "local(256);4096;64;192x128:b" "local(256);16384;64;192x128:b" "causal;16384;64;192x128:b"; do
    for lib in bn bns; do echo -n "$lib "; python3 bench/gpu_bench.py --lib /tmp/$lib/libspattn.so --probe "$c" 2>&1 | tail -1; done
  done
done
echo "done $(( $(date +%s) - T0 ))s"
