#!/usr/bin/env bash
# Installs what building and testing spattn needs on a Debian machine: compiler, CMake, Ninja, GoogleTest,
# OpenBLAS (the dense baseline of the CPU benchmark), LAPACK (TSVD compression) and numpy (the independent Python oracle in tests/).
# The CUDA toolkit is optional: where nvcc is on PATH, the CUDA sources build too.
# SPATTN_FUZZ_DEPS=1 (CI) adds clang and its libFuzzer runtime, for the sanitizer and fuzzing build (fuzz/).
set -euo pipefail
# Installs the Debian packages among "$@" that are not installed yet.
apt_install() {
  local missing="" p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  [ -z "$missing" ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing
}
apt_install g++ cmake ninja-build libgtest-dev libopenblas-dev liblapack-dev python3 python3-numpy
if [ "${SPATTN_FUZZ_DEPS:-0}" = 1 ]; then
  apt_install clang
  apt_install "libclang-rt-$(clang++ -dumpversion | cut -d. -f1)-dev"
fi
# Debian's python3 has numpy from python3-numpy above. Another python3 first on PATH (pyenv, conda) may lack it: pip
# installs it only into a virtual environment (never into another interpreter's site-packages as root); elsewhere the
# script says what to run. The build goes on either way; only the oracle tests (cli_oracle_*) need numpy.
if ! python3 -c "import numpy" 2>/dev/null; then
  if python3 -c "import sys; sys.exit(sys.prefix == sys.base_prefix)" 2>/dev/null && python3 -m pip install --quiet numpy; then
    :
  else
    echo "install-deps: numpy is missing for $(command -v python3) (python3-numpy serves /usr/bin/python3); the build" \
         "goes on, but the tests cli_oracle_* need numpy for that python3: install it there (python3 -m pip install" \
         "numpy) or put /usr/bin first on PATH" >&2
  fi
fi
