#!/usr/bin/env bash
# Installs what building and testing spattn needs on a Debian machine: compiler, CMake, Ninja, GoogleTest,
# OpenBLAS (the dense baseline of the CPU benchmark), LAPACK (TSVD compression) and numpy (the independent Python oracle in tests/).
# The CUDA toolkit is optional: where nvcc is on PATH, the CUDA sources build too.
set -euo pipefail
pkgs="g++ cmake ninja-build libgtest-dev libopenblas-dev liblapack-dev python3"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
python3 -c "import numpy" 2>/dev/null || python3 -m pip install --quiet numpy
