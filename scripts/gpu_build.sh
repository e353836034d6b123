# scripts/gpu_build.sh — sourced by the GPU scripts (scripts/gpu_check.d/*.sh): `elapsed` (seconds since sourcing)
# and `gpu_build BUILD LOG TARGET...`: configure Release (Ninja, shared libs, CUDA) for the GPU nvidia-smi reports
# (sm_90a on Hopper), GoogleTest from .gtest/ where the machine has none, and build the targets; the log in LOG.
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 ))s"; }
gpu_build() {
  local build=$1 log=$2 root cc arch
  shift 2
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
  case "${cc%.*}" in
    9) arch=90a-real ;;
    10 | 12) arch=${cc/./}a-real ;;
    "") echo "gpu_build: no GPU found (nvidia-smi)"; return 2 ;;
    *) arch=${cc/./}-real ;;
  esac
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv >"$log" 2>&1
  local extra=(-DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20)
  if ! ls /usr/lib/x86_64-linux-gnu/libgtest* /usr/local/lib/libgtest* >/dev/null 2>&1; then
    if [ -d "$root/.gtest" ] && [ ! -d /tmp/gtest-install ]; then
      cmake -S "$root/.gtest" -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install \
        -DBUILD_GMOCK=OFF >/dev/null && ninja -C /tmp/gtest-build install >/dev/null || echo "gpu_build: gtest build failed"
    fi
    [ -d /tmp/gtest-install ] && extra+=(-DGTest_ROOT=/tmp/gtest-install)
  fi
  echo "== configure + build for $arch ($(elapsed))"
  if ! { cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON \
           -DCMAKE_CUDA_ARCHITECTURES="$arch" "${extra[@]}" >>"$log" 2>&1 &&
         ninja -C "$build" -j"$(nproc)" "$@" >>"$log" 2>&1; }; then
    grep -B2 -A8 -E "error|FAILED" "$log" | head -40
    echo "gpu_build: build failed ($(elapsed))"
    return 1
  fi
  echo "built ($(elapsed))"
}
