#!/usr/bin/env bash
# Session 10 run 2: (1) an experiment build of the working tree (SPATTN_BAND_EXP=1: the turn passed right after the
# S issue, before the PV issue) against its default, timed in alternation in one process (ab_env.py); (2) the
# spread of the paired ratios at HEAD (.ab/head = git archive HEAD): three fresh bench processes at L=4096 and one
# at L=16384, ours and FlexAttention in alternation. Carry .ab.
unset CXX CC CUDAHOSTCXX
set -u
t0=$(date +%s)
cmake -S . -B /tmp/bx -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null 2>&1 && ninja -C /tmp/bx spattn > /tmp/bx.log 2>&1 &
cmake -S .ab/head -B /tmp/bh -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null 2>&1 && ninja -C /tmp/bh spattn > /tmp/bh.log 2>&1 &
wait
ls /tmp/bx/libspattn.so /tmp/bh/libspattn.so || { tail -20 /tmp/bx.log /tmp/bh.log; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
python3 bench/results/s10/ab_env.py /tmp/bx/libspattn.so SPATTN_BAND_EXP 3 2>&1 | grep -v Warning
echo "A/B done at $(( $(date +%s) - t0 )) s"
for r in 1 2 3; do
  python3 .ab/head/bench/gpu_bench.py --lib /tmp/bh/libspattn.so --lengths 4096 --reps 20 --patterns local,causal --out $OUT/paired$r.json 2>&1 | grep -E "^(local|causal) +4096 +64"
done
python3 .ab/head/bench/gpu_bench.py --lib /tmp/bh/libspattn.so --lengths 16384 --reps 20 --patterns local,causal --out $OUT/paired16k.json 2>&1 | grep -E "^(local|causal) +16384 +64"
echo "done at $(( $(date +%s) - t0 )) s"
rm -f $OUT/*.png
