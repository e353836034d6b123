#!/usr/bin/env bash
# scripts/gpu_check.sh — the GPU check in one command, for a machine with an NVIDIA GPU and no network:
#   1. configure Release (Ninja, shared libs) for the GPU it finds (sm_90a on Hopper), and build;
#   2. ctest -L gpu --output-on-failure;
#   3. compute-sanitizer memcheck, racecheck and synccheck on a small case of the Multigrain kernels;
#   4. spattn bench --device cuda --suite standard --json (Multigrain vs cuSPARSE);
#   5. every executable scripts/gpu_check.d/*.sh, with SPATTN_BUILD (build dir) and SPATTN_OUT (output dir).
# Logs and JSON go to the folder given as first argument, else $OUT, else ./out. GoogleTest comes from the
# system, else from a source tree in .gtest/ (ignored by git; carry it). Exit status: 0 when every step passed.
#
#   bash scripts/gpu_check.sh /tmp/results
#   BENCH_ARGS="--len 16384" bash scripts/gpu_check.sh     # extra arguments for step 4
#   GPU_CHECK_BASELINE=h100-unfused ...                      # step 4's JSON also as bench/baselines/NAME.{json,png}
#   GPU_CHECK_TESTS=multigrain GPU_CHECK_SKIP_D=1 ...        # only tests matching a regex; no fragments
set -uo pipefail
# Build with the system compiler: the GPU image's CXX=/opt/gcc/bin/g++ links libstdc++ statically, and such a
# libspattn.so crashes once dlopen'ed into a process that holds the shared libstdc++ (PyTorch).
unset CXX CC CUDAHOSTCXX
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTD=${1:-${OUT:-$ROOT/out}}
mkdir -p "$OUTD"
OUTD=$(cd "$OUTD" && pwd)
BUILD=${SPATTN_BUILD_DIR:-$ROOT/build-gpu}
declare -A status
failed=0
step() {  # step NAME RC
  status[$1]=$([ "$2" -eq 0 ] && echo ok || echo "FAILED (rc $2)")
  [ "$2" -eq 0 ] || failed=1
}
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 ))s"; }

# ---- 0. the machine ---------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi missing or failing)"
  exit 2
fi
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv | tee "$OUTD/machine.txt"
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' ')
major=${cc%.*}
minor=${cc#*.}
case "$major" in
  9) ARCH=90a-real ;;           # Hopper: wgmma / TMA need the arch-specific target
  10 | 12) ARCH=${major}${minor}a-real ;;
  *) ARCH=${major}${minor}-real ;;
esac
echo "gpu_check: compute capability $cc -> CMAKE_CUDA_ARCHITECTURES=$ARCH; output in $OUTD" | tee -a "$OUTD/machine.txt"
nvcc --version | tail -2 >>"$OUTD/machine.txt" 2>&1
cmake --version | head -1 >>"$OUTD/machine.txt"

# ---- 1. configure + build ----------------------------------------------------------------------------
extra=()
if [ -d "$ROOT/.gtest" ] && ! ls /usr/lib/x86_64-linux-gnu/libgtest* /usr/local/lib/libgtest* >/dev/null 2>&1; then
  if [ ! -d /tmp/gtest-install ]; then
    echo "gpu_check: building GoogleTest from .gtest/"
    { cmake -S "$ROOT/.gtest" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF && ninja -C /tmp/gtest-build install; } \
      >"$OUTD/build.log" 2>&1 || echo "gpu_check: GoogleTest build failed (see build.log)"
  fi
  extra+=(-DGTest_ROOT=/tmp/gtest-install)
fi
# CMake before 3.28 does not know nvcc's flag for C++20 (CUDA20); tell it (ignored where CMake knows).
extra+=(-DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20)
echo "== configure + build ($(elapsed))"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${extra[@]}" >>"$OUTD/build.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  ninja -C "$BUILD" -k 0 -j"$(nproc)" >>"$OUTD/build.log" 2>&1
  rc=$?
fi
step build $rc
if [ $rc -ne 0 ]; then
  echo "gpu_check: build failed; errors:"
  grep -E "error|FAILED" "$OUTD/build.log" | head -30
fi
echo "build: ${status[build]} ($(elapsed))"

# ---- 2. GPU tests -------------------------------------------------------------------------------------
echo "== ctest -L gpu ($(elapsed))"
if [ -f "$BUILD/CTestTestfile.cmake" ]; then
  (cd "$BUILD" && ctest -L gpu ${GPU_CHECK_TESTS:+-R "$GPU_CHECK_TESTS"} --output-on-failure --timeout 900) >"$OUTD/ctest_gpu.log" 2>&1
  step ctest_gpu $?
  grep -E "tests passed|tests failed|\*\*\*|Failed|SKIPPED" "$OUTD/ctest_gpu.log" | tail -25
else
  step ctest_gpu 1
fi

# ---- 3. compute-sanitizer on a small case --------------------------------------------------------------
echo "== compute-sanitizer ($(elapsed))"
MGTEST=$BUILD/tests/unfused_test  # MultigrainGpu.* are in tests/gpu/unfused_test.cpp
if command -v compute-sanitizer >/dev/null && [ -x "$MGTEST" ]; then
  san=0
  for tool in memcheck racecheck synccheck; do
    echo "--- $tool" >>"$OUTD/sanitizer.log"
    compute-sanitizer --tool "$tool" --error-exitcode 3 "$MGTEST" --gtest_filter='MultigrainGpu.SmallCase*' \
      >>"$OUTD/sanitizer.log" 2>&1
    r=$?
    echo "$tool: rc $r"
    [ $r -eq 0 ] || san=$r
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid" "$OUTD/sanitizer.log" | sort | uniq -c | head -20
  step sanitizer $san
else
  echo "compute-sanitizer or $MGTEST missing"
  step sanitizer 1
fi

# ---- 4. the benchmark --------------------------------------------------------------------------------
echo "== spattn bench --device cuda --suite standard ($(elapsed))"
if [ -x "$BUILD/spattn" ]; then
  # shellcheck disable=SC2086
  "$BUILD/spattn" bench --device cuda --suite standard --json "$OUTD/bench_cuda_standard.json" ${BENCH_ARGS:-} \
    >"$OUTD/bench_cuda.txt" 2>"$OUTD/bench_cuda.log"
  step bench $?
  cat "$OUTD/bench_cuda.txt"
  grep -E "FAILED|skipped" "$OUTD/bench_cuda.log" | head
  if [ -n "${GPU_CHECK_BASELINE:-}" ] && [ "${status[bench]}" = ok ]; then
    python3 "$ROOT/bench/baseline.py" "$OUTD/bench_cuda_standard.json" "$GPU_CHECK_BASELINE" \
      --command "GPU_CHECK_BASELINE=$GPU_CHECK_BASELINE bash scripts/gpu_check.sh (step 4: spattn bench --device cuda --suite standard ${BENCH_ARGS:-})"
  fi
else
  step bench 1
fi

# ---- 5. fragments from other parts of the project ------------------------------------------------------
for f in "$ROOT"/scripts/gpu_check.d/*.sh; do
  [ -x "$f" ] && [ -z "${GPU_CHECK_SKIP_D:-}" ] || continue
  name=$(basename "$f" .sh)
  echo "== gpu_check.d/$name ($(elapsed))"
  SPATTN_BUILD=$BUILD SPATTN_OUT=$OUTD "$f"
  step "d/$name" $?
done

echo "== summary ($(elapsed))"
for k in "${!status[@]}"; do printf '  %-14s %s\n' "$k" "${status[$k]}"; done | sort
exit $failed
