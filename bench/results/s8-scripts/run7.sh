#!/usr/bin/env bash
# Session 8 run 7: ncu of the band kernel, HEAD vs the next-item-S build, causal L=16384 and local L=4096.
unset CXX CC CUDAHOSTCXX
set -u
T0=$(date +%s)
cmake -S . -B /tmp/bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null 2>&1 && ninja -C /tmp/bn spattn >/dev/null || { echo new build failed; exit 1; }
cmake -S .ab/head -B /tmp/bh -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null 2>&1 && ninja -C /tmp/bh spattn >/dev/null || { echo head build failed; exit 1; }
echo "built $(( $(date +%s) - T0 ))s"
M=sm__cycles_elapsed.max,smsp__inst_executed.sum,smsp__inst_executed_pipe_uniform.sum,sm__pipe_tensor_op_hgmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_membar.ratio,smsp__average_warp_latency_issue_stalled_no_instruction.ratio,smsp__average_warp_latency_issue_stalled_sleeping.ratio,smsp__average_warp_latency_issue_stalled_branch_resolving.ratio,smsp__average_warp_latency_issue_stalled_dispatch_stall.ratio,smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,smsp__average_warp_latency_issue_stalled_selected.ratio,smsp__average_warp_latency_issue_stalled_not_selected.ratio,smsp__average_warp_latency_issue_stalled_imc_miss.ratio,smsp__average_warp_latency_issue_stalled_drain.ratio,smsp__average_warp_latency_issue_stalled_misc.ratio,smsp__average_warp_latency_issue_stalled_tex_throttle.ratio,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
for c in "causal;16384;64;192x128:b" "local(256);4096;64;192x128:b"; do
  for v in bh bn; do
    echo "== $v $c"
    timeout 150 ncu --metrics $M -k regex:band -s 2 -c 1 python3 bench/gpu_bench.py --lib /tmp/$v/libspattn.so --probe "$c" 2>&1 | grep -E "^\s+(sm|smsp)__" | sed 's/  */ /g'
  done
done
echo "done $(( $(date +%s) - T0 ))s"
