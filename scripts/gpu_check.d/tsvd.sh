#!/usr/bin/env bash
# scripts/gpu_check.d/tsvd.sh [OUTDIR] — GPU checks of TSVD (issue 26): SASS (HMMA / HGMMA in the TSVD kernels), the GPU
# tests (tests/gpu/tsvd_gpu_test.cpp: the tensor-core, stream-K, gemv and wgmma kernels against the CPU TSVD matmul, cuSOLVER
# compression against LAPACK; each test in its own process), compute-sanitizer memcheck, racecheck and synccheck on
# each kernel's small case, and `spattn tsvd bench`
# (cuBLAS GEMM, SVD-matmul as two cuBLAS GEMMs, TSVD; the issue's shapes at ratios 2, 4, 8) as JSON.
# Logs and JSON go to OUTDIR (else $SPATTN_OUT, else ./out). Run by scripts/gpu_check.sh with SPATTN_BUILD (its build
# dir); standalone it configures for the GPU it finds and builds only what it runs into build-tsvd/ (GoogleTest
# from /tmp/gtest-install or .gtest/ when the machine has none). TSVD_BENCH_ARGS adds bench arguments. TSVD_BASELINE=NAME
# (e.g. h100-tsvd) also makes the bench's JSON bench/baselines/NAME.{json,png} (bench/baseline.py; $SPATTN_BASELINES
# and $SPATTN_COMMIT as there: bench/README.md).
set -uo pipefail
unset CXX CC CUDAHOSTCXX  # the system compiler (see scripts/gpu_check.sh)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/scripts/gpu_lib.sh"
gpu_script_setup "${1:-}" build-tsvd tsvd_build.log spattn_cli tsvd_test tsvd_gpu_test || exit 1
rc=0
CLI=$BUILD/spattn
GTEST=$BUILD/tests/tsvd_gpu_test

echo "== tsvd: SASS"
if command -v cuobjdump >/dev/null; then
  lib=$(ls "$BUILD"/libspattn.so "$BUILD"/libspattn.a 2>/dev/null | head -1)
  cuobjdump --dump-sass "$lib" 2>/dev/null | awk '/Function :/ {f = ($0 ~ /tsvd/)} f && /HMMA/ {n++} f && /HGMMA/ {w++}
    END {print "HMMA instructions in the TSVD kernels: " n+0 ", HGMMA (wgmma): " w+0}'
  cuobjdump --dump-resource-usage "$lib" 2>/dev/null | grep -A1 -E "tsvd_(mma|gemv|wgmma)" | grep -oE "REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+" |
    paste -sd' ' | sed 's/^/registers, stack, local (spills) per TSVD kernel: /'
fi

echo "== tsvd: tests ($(elapsed))"
"$BUILD/tests/tsvd_test" >"$OUTD/tsvd_test.log" 2>&1 || rc=1
tail -1 "$OUTD/tsvd_test.log"
if [ -x "$GTEST" ]; then
  # Every test in its own process, in the file's order (the small per-kernel cases first): a kernel's illegal
  # address poisons its process's CUDA context, and would otherwise fail every later test with it.
  : >"$OUTD/tsvd_gpu_test.log"
  tests=$("$GTEST" --gtest_list_tests | awk '/^[^ ]/ {s = $1} /^  / {print s $1}')
  npass=0; nfail=0
  for t in $tests; do
    timeout 120 "$GTEST" --gtest_filter="$t" >"$OUTD/tsvd_gpu_test.one.log" 2>&1
    r=$?
    cat "$OUTD/tsvd_gpu_test.one.log" >>"$OUTD/tsvd_gpu_test.log"
    if [ $r -eq 0 ]; then npass=$((npass + 1)); else
      nfail=$((nfail + 1)); rc=1
      echo "FAILED (rc $r): $t"
      grep -E "Failure|Expected|Which is|error|differs|not written|asked for" "$OUTD/tsvd_gpu_test.one.log" | head -8 | sed 's/^/    /'
    fi
  done
  rm -f "$OUTD/tsvd_gpu_test.one.log"
  echo "gpu tests, one process each: $npass passed, $nfail failed (skips count as passed; see tsvd_gpu_test.log)"
else
  echo "no $GTEST"; rc=1
fi

echo "== tsvd: compute-sanitizer ($(elapsed))"
# One kernel at a time (logs tsvd_<kernel>_<tool>.log): an error in one does not hide another's.
for k in Tile StreamK Gemv GemvBulk Wgmma; do
  echo "-- $k"
  sanitize_all "tsvd_$(echo "$k" | tr 'A-Z' 'a-z')" "$GTEST" "TsvdGpuSmall.$k" || rc=1
done

echo "== tsvd: bench ($(elapsed))"
# shellcheck disable=SC2086
timeout 300 "$CLI" tsvd bench --json "$OUTD/tsvd_bench.json" ${TSVD_BENCH_ARGS:-} >"$OUTD/tsvd_bench.txt" 2>"$OUTD/tsvd_bench.log"
brc=$?
[ $brc -eq 0 ] || rc=1
cat "$OUTD/tsvd_bench.txt"
tail -5 "$OUTD/tsvd_bench.log"
if [ -n "${TSVD_BASELINE:-}" ]; then
  if [ $brc -eq 0 ]; then
    python3 "$ROOT/bench/baseline.py" "$OUTD/tsvd_bench.json" "$TSVD_BASELINE" \
      --command "TSVD_BASELINE=$TSVD_BASELINE bash scripts/gpu_check.d/tsvd.sh (spattn tsvd bench --json tsvd_bench.json${TSVD_BENCH_ARGS:+ $TSVD_BENCH_ARGS})" || rc=1
  else
    fail "no baseline $TSVD_BASELINE: the bench failed (rc $brc)"
  fi
fi
echo "tsvd.sh: rc $rc ($(elapsed))"
exit $rc
