#!/usr/bin/env bash
# Session 11 final check of HEAD (.ab/head = git archive HEAD, with .gtest inside; carry .ab): fused.sh (build, the
# fused GPU tests, memcheck and racecheck, the standard bench against FlexAttention / SDPA), then three fresh paired
# bench processes at L=4096 and one at L=16384 (local and causal, ours and Flex in alternation).
set -u
cd .ab/head || exit 1
SPATTN_OUT=$OUT FUSED_BENCH_ARGS="--lengths 16384,4096 --reps 20 --patterns local,longformer,bigbird,dilated,causal,fixed,random,na2d,dense --budget-s 380" \
  bash scripts/gpu_check.d/fused.sh 2>&1 | grep -vE "^  (suite|band|fused|tail|gqa|lse|doc|awk|[a-z])|Warning|deprecated|cmake_minimum|Compatibility|Update the VERSION|syntax|policies|project developers|^$"
unset CXX CC CUDAHOSTCXX
for r in 1 2 3; do
  python3 bench/gpu_bench.py --lib build-fused/libspattn.so --lengths 4096 --reps 20 --patterns local,causal --out $OUT/paired$r.json 2>&1 | grep -E "^(local|causal) +4096 +64"
done
python3 bench/gpu_bench.py --lib build-fused/libspattn.so --lengths 16384 --reps 20 --patterns local,causal --out $OUT/paired16k.json 2>&1 | grep -E "^(local|causal) +16384 +64"
rm -f $OUT/paired*.png $OUT/fused_build.log $OUT/fused_memcheck.log $OUT/fused_racecheck.log
