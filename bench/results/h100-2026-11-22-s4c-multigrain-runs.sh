# The device scripts of the s4c-multigrain runs (run from the repository root with .mgscratch/ carried; run 1 used temporary knobs that the commit removed).
# run1-s4c.sh:
#!/usr/bin/env bash
# Scratch device script (s4c, run 1): check + A/B (temporary SPATTN_MG_OLDS / OLDP / R2 knobs) + ncu.
set -u
O=${OUT:-/tmp/out}
T0=$(date +%s)
rm -rf build-gpu
GPU_CHECK_TESTS=Multigrain GPU_CHECK_SKIP_D=1 bash scripts/gpu_check.sh /tmp/r > $O/check.txt 2>&1
echo "check rc=$? ($(( $(date +%s) - T0 ))s)" >> $O/check.txt
cp /tmp/r/bench_cuda_standard.json $O/ 2>/dev/null; cp /tmp/r/bench_cuda.txt $O/ 2>/dev/null
cat /tmp/r/ctest_gpu.log /tmp/r/sanitizer.log >> $O/check.txt 2>/dev/null
grep -E "error|FAILED" /tmp/r/build.log | head -20 >> $O/check.txt
echo "== multigrain_test with SPATTN_MG_R2=1" >> $O/check.txt
SPATTN_MG_R2=1 build-gpu/tests/multigrain_test >> $O/check.txt 2>&1; echo "r2 tests rc=$?" >> $O/check.txt
echo "== multigrain_test with SPATTN_MG_OLDS=1 SPATTN_MG_OLDP=1" >> $O/check.txt
SPATTN_MG_OLDS=1 SPATTN_MG_OLDP=1 build-gpu/tests/multigrain_test 2>&1 | tail -3 >> $O/check.txt
B=build-gpu/spattn; R='random(205, seed=0)'
ab() { for v in "$@"; do echo "== $v"; env $v $B bench --device cuda --pattern "$R" --no-cusparse 2>&1 | grep -E "custom +sddmm"; done; }
ab "X=1" "SPATTN_MG_OLDS=1 SPATTN_MG_OLDP=1" "SPATTN_MG_OLDS=1" "SPATTN_MG_OLDP=1" "SPATTN_MG_R2=1" \
   "X=2" "SPATTN_MG_OLDS=1 SPATTN_MG_OLDP=1" "SPATTN_MG_R2=1" "SPATTN_MG_OLDS=1 SPATTN_MG_OLDP=1 SPATTN_MG_R2=1" \
   "X=3" "SPATTN_MG_OLDS=1 SPATTN_MG_OLDP=1" "SPATTN_MG_R2=1" > $O/ab.txt 2>&1
echo "ab done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
for v in "X=1" "SPATTN_MG_R2=1" "SPATTN_MG_OLDS=1 SPATTN_MG_OLDP=1" "X=2" "SPATTN_MG_R2=1" "X=3" "SPATTN_MG_R2=1"; do
  echo "== cusparse $v" >> $O/ab.txt; env $v $B bench --device cuda --pattern "$R" >> $O/ab.txt 2>&1; done
echo "cusparse done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
S="--section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy"
nc() { echo "== ncu $1 $2" >> $O/ncu.txt; env $1 timeout 40 ncu --kernel-name regex:"$2" -c 1 $S $B bench --device cuda --pattern "$R" --no-cusparse --reps 20 >> $O/ncu.txt 2>&1; }
nc X=1 sddmm_fine_tc; nc SPATTN_MG_OLDS=1 sddmm_fine_tc; nc X=1 spmm_fine_tc; nc SPATTN_MG_OLDP=1 spmm_fine_tc
nc X=1 tile_softmax; nc SPATTN_MG_R2=1 tile_softmax
echo "ncu done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
tail -8 $O/check.txt; cat $O/ab.txt | grep -v "^\s*$" | grep -E "==|custom|random|done|cusparse" | cut -c1-250; grep -E "random|bar|geomean" $O/bench_cuda.txt

# run2-s4c.sh:
#!/usr/bin/env bash
# Scratch device script (s4c, run 2): the committed tree (no knobs): check + 3 single-pattern benches with cuSPARSE.
set -u
O=${OUT:-/tmp/out}
T0=$(date +%s)
rm -rf build-gpu
GPU_CHECK_TESTS=Multigrain GPU_CHECK_SKIP_D=1 bash scripts/gpu_check.sh /tmp/r > $O/check.txt 2>&1
echo "check rc=$? ($(( $(date +%s) - T0 ))s)" >> $O/check.txt
cp /tmp/r/bench_cuda_standard.json $O/ 2>/dev/null; cp /tmp/r/bench_cuda.txt $O/ 2>/dev/null
cat /tmp/r/ctest_gpu.log /tmp/r/sanitizer.log >> $O/check.txt 2>/dev/null
grep -E "error|FAILED" /tmp/r/build.log | head -20 >> $O/check.txt
for i in 1 2 3; do echo "== bench $i" >> $O/ab.txt; build-gpu/spattn bench --device cuda --pattern "random(205, seed=0)" >> $O/ab.txt 2>&1; done
echo "benches done ($(( $(date +%s) - T0 ))s)" >> $O/ab.txt
grep -E "check rc|tests passed|SUMMARY" $O/check.txt; grep -E "==|custom  |done" $O/ab.txt | cut -c1-200; grep -E "random|bar|geomean" $O/bench_cuda.txt
