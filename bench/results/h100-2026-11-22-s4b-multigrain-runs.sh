# The device scripts of the s4b-multigrain runs (run from the repository root with .mgscratch/ holding them and capture.cpp;
# they used temporary SPATTN_MG_* knobs that the commit removed). run1.sh:
#!/usr/bin/env bash
# Scratch device script (not committed): check + A/B + capture + ncu.
set -u
O=${OUT:-/tmp/out}
T0=$(date +%s)
rm -rf build-gpu
GPU_CHECK_TESTS=Multigrain GPU_CHECK_SKIP_D=1 bash scripts/gpu_check.sh /tmp/r > $O/check.txt 2>&1
echo "check rc=$? ($(( $(date +%s) - T0 ))s)" >> $O/check.txt
cp /tmp/r/bench_cuda_standard.json /tmp/r/bench_cuda.txt $O/ 2>/dev/null
cat /tmp/r/ctest_gpu.log /tmp/r/sanitizer.log >> $O/check.txt 2>/dev/null
grep -E "error|FAILED" /tmp/r/build.log | head -20 >> $O/check.txt
B=build-gpu/spattn; R='random(205, seed=0)'
ab() { for v in "$@"; do echo "== $v"; env $v $B bench --device cuda --pattern "$R" --no-cusparse 2>&1 | grep -E "custom +sddmm"; done; }
ab "X=1" "SPATTN_MG_PDL=0" "SPATTN_MG_TSV=0 SPATTN_MG_PDL=0" "SPATTN_MG_TSV=0" "SPATTN_MG_EXP=1" "SPATTN_MG_REV=1" "SPATTN_MG_EXP=1 SPATTN_MG_REV=1" "SPATTN_MG_POS16=0" "X=2" > $O/ab.txt 2>&1
echo "ab done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
g++ -std=c++20 -O2 -Iinclude -I/usr/local/cuda/include .mgscratch/capture.cpp -o /tmp/cap -Lbuild-gpu -lspattn -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,$PWD/build-gpu >> $O/ab.txt 2>&1 && /tmp/cap >> $O/ab.txt 2>&1
echo "capture done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
timeout 90 ncu --kernel-name regex:tile_softmax -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats $B bench --device cuda --pattern "$R" --no-cusparse --reps 20 > $O/ncu.txt 2>&1
echo "ncu done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
tail -5 $O/check.txt; cat $O/ab.txt; grep -E "random|bar|geomean" $O/bench_cuda.txt

# run2.sh:
#!/usr/bin/env bash
# Scratch device script (not committed): check + A/B + capture + ncu.
set -u
O=${OUT:-/tmp/out}
T0=$(date +%s)
rm -rf build-gpu
GPU_CHECK_TESTS=Multigrain GPU_CHECK_SKIP_D=1 bash scripts/gpu_check.sh /tmp/r > $O/check.txt 2>&1
echo "check rc=$? ($(( $(date +%s) - T0 ))s)" >> $O/check.txt
cp /tmp/r/bench_cuda_standard.json /tmp/r/bench_cuda.txt $O/ 2>/dev/null
cat /tmp/r/ctest_gpu.log /tmp/r/sanitizer.log >> $O/check.txt 2>/dev/null
grep -E "error|FAILED" /tmp/r/build.log | head -20 >> $O/check.txt
B=build-gpu/spattn; R='random(205, seed=0)'
ab() { for v in "$@"; do echo "== $v"; env $v $B bench --device cuda --pattern "$R" --no-cusparse 2>&1 | grep -E "custom +sddmm"; done; }
ab "X=1" "SPATTN_MG_EXP=1" "SPATTN_MG_CSRP=1" "SPATTN_MG_REV=1" "SPATTN_MG_PDL=0" "X=2" "SPATTN_MG_EXP=1" "SPATTN_MG_CSRP=1" "SPATTN_MG_REV=1" "SPATTN_MG_TSV=0" "X=3" "SPATTN_MG_EXP=1 SPATTN_MG_REV=1" "SPATTN_MG_CSRP=1 SPATTN_MG_REV=1" "X=4" > $O/ab.txt 2>&1
echo "ab done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
g++ -std=c++20 -O2 -Iinclude -I/usr/local/cuda/include .mgscratch/capture.cpp -o /tmp/cap -Lbuild-gpu -lspattn -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,$PWD/build-gpu >> $O/ab.txt 2>&1 && /tmp/cap >> $O/ab.txt 2>&1
echo "capture done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats"
timeout 60 ncu --kernel-name regex:tile_softmax -c 1 $S $B bench --device cuda --pattern "$R" --no-cusparse --reps 20 > $O/ncu.txt 2>&1
SPATTN_MG_EXP=1 timeout 60 ncu --kernel-name regex:"tile_softmax|spmm_fine_tc" --launch-skip 22 -c 4 --section SpeedOfLight --section WarpStateStats --section InstructionStats $B bench --device cuda --pattern "$R" --no-cusparse --reps 20 >> $O/ncu.txt 2>&1
echo "ncu done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
tail -5 $O/check.txt; cat $O/ab.txt; grep -E "random|bar|geomean" $O/bench_cuda.txt

# run3.sh:
#!/usr/bin/env bash
# Scratch device script (not committed): check + A/B + capture + ncu.
set -u
O=${OUT:-/tmp/out}
T0=$(date +%s)
rm -rf build-gpu
GPU_CHECK_TESTS=Multigrain GPU_CHECK_SKIP_D=1 bash scripts/gpu_check.sh /tmp/r > $O/check.txt 2>&1
echo "check rc=$? ($(( $(date +%s) - T0 ))s)" >> $O/check.txt
cp /tmp/r/bench_cuda_standard.json /tmp/r/bench_cuda.txt $O/ 2>/dev/null
cat /tmp/r/ctest_gpu.log /tmp/r/sanitizer.log >> $O/check.txt 2>/dev/null
grep -E "error|FAILED" /tmp/r/build.log | head -20 >> $O/check.txt
B=build-gpu/spattn; R='random(205, seed=0)'
ab() { for v in "$@"; do echo "== $v"; env $v $B bench --device cuda --pattern "$R" --no-cusparse 2>&1 | grep -E "custom +sddmm"; done; }
ab "X=1" "SPATTN_MG_P2=0" "SPATTN_MG_OCC=6" "SPATTN_MG_REV=0" "SPATTN_MG_PDL=0" "X=2" "SPATTN_MG_OCC=6" "SPATTN_MG_P2=0" "SPATTN_MG_REV=0" "SPATTN_MG_EXP=1" "X=3" "SPATTN_MG_TSV=0 SPATTN_MG_PDL=0 SPATTN_MG_REV=0" "X=4" > $O/ab.txt 2>&1
echo "ab done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
g++ -std=c++20 -O2 -Iinclude -I/usr/local/cuda/include .mgscratch/capture.cpp -o /tmp/cap -Lbuild-gpu -lspattn -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,$PWD/build-gpu >> $O/ab.txt 2>&1 && /tmp/cap >> $O/ab.txt 2>&1
echo "capture done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats"
timeout 60 ncu --kernel-name regex:tile_softmax -c 1 $S $B bench --device cuda --pattern "$R" --no-cusparse --reps 20 > $O/ncu.txt 2>&1
$B bench --device cuda --suite standard --json $O/suite2.json > $O/suite2.txt 2>/dev/null; echo "suite2 done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
echo "ncu done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
tail -5 $O/check.txt; cat $O/ab.txt; grep -E "random|bar|geomean" $O/bench_cuda.txt $O/suite2.txt
