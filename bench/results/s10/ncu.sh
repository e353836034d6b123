#!/usr/bin/env bash
# Session 10: where the band kernel's step time goes (HEAD d8ff627): ncu's compute-workload (pipe utilization),
# scheduler and warp-state sections on causal L=16384 and local L=4096 (B=2, H=16, D=64, bf16), one launch each.
unset CXX CC CUDAHOSTCXX
set -u
cmake -S . -B /tmp/bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DSPATTN_TESTS=OFF >/dev/null 2>&1 && ninja -C /tmp/bn spattn >/dev/null || { echo build failed; exit 1; }
for c in "causal;16384;64;192x128" "local(256);4096;64;192x128"; do
  echo "=== $c"
  timeout 200 ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section InstructionStats \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active,smsp__cycles_active.avg,sm__cycles_elapsed.avg.per_second \
    -k regex:band -s 3 -c 1 python3 bench/gpu_bench.py --lib /tmp/bn/libspattn.so --no-graph --probe "$c" 2>&1 | grep -vE "^==PROF==|Warning"
done
