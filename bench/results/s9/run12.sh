#!/usr/bin/env bash
# Session 9 run 12: the spread of the paired local / causal ratios at L=4096 (HEAD d2faeb7): three fresh bench
# processes, each with its dense anchors first, then ours and Flex in alternation.
unset CXX CC CUDAHOSTCXX
set -u
cmake -S . -B /tmp/bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null 2>&1 && ninja -C /tmp/bn spattn >/dev/null || { echo build failed; exit 1; }
for r in 1 2 3; do
  python3 bench/gpu_bench.py --lib /tmp/bn/libspattn.so --lengths 4096 --reps 20 --patterns local,causal --out $OUT/paired$r.json 2>&1 | grep -E "^(local|causal) +4096 +64"
done
python3 bench/gpu_bench.py --lib /tmp/bn/libspattn.so --lengths 16384 --reps 20 --patterns local,causal --out $OUT/paired16k.json 2>&1 | grep -E "^(local|causal) +16384 +64"
