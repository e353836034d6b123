# scripts/gpu_lib.sh — sourced by the GPU scripts that configure a build of their own (scripts/gpu_check.d/*.sh run
# standalone): the CUDA architecture of the GPU found, the CMake arguments such a build takes, the build itself, and
# `elapsed` / `secs` (time since sourcing), `fail` (a failed step), `budget_bench` (gpu_bench.py within a budget).
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 ))s"; }
secs() { echo "$(( $(date +%s) - t0 ))"; }  # the same, a number (for budgets)
# fail WHAT: a failed step, reported; the script's rc set to 1.
fail() { echo "FAILED: $1"; rc=1; }

# CMAKE_CUDA_ARCHITECTURES for the first GPU nvidia-smi reports (arch-specific targets on Hopper and newer: wgmma,
# TMA); nothing where there is no GPU.
gpu_arch() {
  local cc
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
  case "${cc%.*}" in
    "") ;;
    9) echo 90a-real ;;
    10 | 12) echo "${cc/./}a-real" ;;
    *) echo "${cc/./}-real" ;;
  esac
}

# standalone_cmake_args ROOT: one a line, the arguments of such a build: nvcc's C++20 flag (CMake before 3.28 lacks
# it) and GoogleTest from /tmp/gtest-install, built there from ROOT/.gtest/ where the machine has no GoogleTest.
standalone_cmake_args() {
  local root=$1
  echo -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20
  echo -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20
  if ! ls /usr/lib/x86_64-linux-gnu/libgtest* /usr/local/lib/libgtest* >/dev/null 2>&1; then
    if [ -d "$root/.gtest" ] && [ ! -d /tmp/gtest-install ]; then
      { cmake -S "$root/.gtest" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install \
          -DBUILD_GMOCK=OFF && ninja -C /tmp/gtest-build install; } >/dev/null 2>&1 || echo "GoogleTest build from .gtest/ failed" >&2
    fi
    [ -d /tmp/gtest-install ] && echo -DGTest_ROOT=/tmp/gtest-install
  fi
}

# gpu_build BUILD LOG TARGET...: configure Release (Ninja, shared libs, CUDA) for the GPU found, with
# standalone_cmake_args (and $SPATTN_EXTRA_CMAKE), and build the targets; the log in LOG. 2 where there is no GPU, 1
# where the build fails.
gpu_build() {
  local build=$1 log=$2 root arch
  shift 2
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  arch=$(gpu_arch)
  [ -n "$arch" ] || { echo "gpu_build: no GPU found (nvidia-smi)"; return 2; }
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv >"$log" 2>&1
  local extra
  mapfile -t extra < <(standalone_cmake_args "$root")
  echo "== configure + build for $arch"
  if ! { cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON \
           -DCMAKE_CUDA_ARCHITECTURES="$arch" "${extra[@]}" ${SPATTN_EXTRA_CMAKE:-} >>"$log" 2>&1 &&
         ninja -C "$build" -j"$(nproc)" "$@" >>"$log" 2>&1; }; then
    grep -B2 -A8 -E "error|FAILED" "$log" | head -40
    echo "gpu_build: build failed"
    return 1
  fi
  echo "built"
}

# gpu_script_setup OUTDIR DIR LOG TARGET...: the start of a scripts/gpu_check.d script. Sets OUTD (OUTDIR, else
# $SPATTN_OUT, else ROOT/out; created, absolute) and BUILD: $SPATTN_BUILD (gpu_check.sh's build), else ROOT/DIR,
# configured and built for TARGETs by gpu_build with its log in OUTD/LOG. Non-zero where that build fails.
gpu_script_setup() {
  local arg=$1 dir=$2 log=$3 root
  shift 3
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  OUTD=${arg:-${SPATTN_OUT:-$root/out}}
  mkdir -p "$OUTD"
  OUTD=$(cd "$OUTD" && pwd)
  BUILD=${SPATTN_BUILD:-}
  if [ -z "$BUILD" ]; then
    BUILD=$root/$dir
    gpu_build "$BUILD" "$OUTD/$log" "$@" || return 1
  fi
}

# gtest_run NAME TEST FILTER [SECONDS]: the GoogleTest executable TEST's cases FILTER (timeout SECONDS, default 240), its
# log in OUTD/NAME.log and its summary and failures here; fails (rc=1) where it fails or skips a test.
gtest_run() {
  local name=$1 test=$2 filter=$3 secs=${4:-240}
  timeout "$secs" "$test" --gtest_filter="$filter" >"$OUTD/$name.log" 2>&1 || fail "$name"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \]|Failure|Expected|Which is|actual|Value of|dq|dk|dv" \
    "$OUTD/$name.log" | head -40
  grep -qE "^\[  SKIPPED \] [0-9]+ tests?" "$OUTD/$name.log" && fail "$name skipped tests"
}

# sanitize_all PREFIX TEST FILTER: compute-sanitizer memcheck, racecheck and synccheck on the GoogleTest executable
# TEST's cases FILTER, each log in OUTD/PREFIX_TOOL.log and a line each here; non-zero where one reports an error.
sanitize_all() {
  local prefix=$1 test=$2 filter=$3 tool r bad=0
  command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer missing"; return 1; }
  for tool in memcheck racecheck synccheck; do
    timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 3 "$test" --gtest_filter="$filter" \
      >"$OUTD/${prefix}_$tool.log" 2>&1
    r=$?
    echo "$tool: rc $r; $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUTD/${prefix}_$tool.log" | head -1)"
    [ $r -eq 0 ] || bad=1
  done
  return $bad
}

# budget_bench NAME ARG...: bench/gpu_bench.py on $LIB with ARGs (and --reps 20) within what is left of $BUDGET
# seconds since sourcing (no case started past it, a timeout a minute later); JSON and log in OUTD/NAME.{json,txt},
# the table's last lines here, a failure through `fail`. Skipped with less than 40 s left.
budget_bench() {
  local name=$1 left root
  shift
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  left=$(( BUDGET - $(secs) ))
  if [ "$left" -lt 40 ]; then echo "budget left ${left}s: $name skipped"; return; fi
  timeout $(( left + 60 )) python3 "$root/bench/gpu_bench.py" --lib "$LIB" --reps 20 --budget-s "$left" \
    --out "$OUTD/$name.json" "$@" >"$OUTD/$name.txt" 2>&1 || fail "bench $name (rc $?)"
  grep -vE "^#|^$" "$OUTD/$name.txt" | tail -14
}
