#!/usr/bin/env bash
# scripts/profile/windows.sh OUTDIR [CASE DIM B L H]... — Nsight Compute profiles of spattn's forward and backward
# kernels beside FlashAttention-4's on the same window or causal case (bench/profile_case.py), for kernel work on
# issue 40: per kernel the full section set and the source page (SASS with per-instruction executed counts and
# stall reasons), so two kernels can be compared instruction by instruction. Needs the Python module in
# build-py/python (scripts/gpu_check.d/python.sh builds it; or SPATTN_PY=DIR) and, for FA4, its site on PYTHONPATH
# (../shared/tools/fa4-wheels.sh's lines). Default cases: causal D=128 (B 2, L 8192, H 16) and local(256) D=64
# (B 2, L 16384, H 16). Each profile: OUTDIR/NAME.ncu-rep, NAME_details.txt, NAME_sass_K.csv per kernel K.
# Not run by scripts/gpu_check.sh (not executable): about 1-2 minutes a case on an H200.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTD=${1:?OUTDIR}
shift
mkdir -p "$OUTD"
export PYTHONPATH=${SPATTN_PY:-$ROOT/build-py/python}${PYTHONPATH:+:$PYTHONPATH}
command -v ncu >/dev/null || { echo "profile/windows.sh: no ncu"; exit 2; }
[ $# -ge 5 ] || set -- causal 128 2 8192 16 local 64 2 16384 16
while [ $# -ge 5 ]; do
  name="$1_d$2"
  # The kernels of interest: ours (fused forward, tile backward, prep/finish) and FA4's (flash_fwd / flash_bwd).
  timeout 300 ncu --set full --import-source yes -k 'regex:fwd|bwd|flash' --launch-skip 0 --launch-count 40 \
    -o "$OUTD/$name" -f python3 "$ROOT/bench/profile_case.py" "$1" --dim "$2" --batch "$3" --len "$4" --heads "$5" \
    >"$OUTD/$name.log" 2>&1 || echo "ncu $name: rc $?"
  ncu -i "$OUTD/$name.ncu-rep" --page details >"$OUTD/${name}_details.txt" 2>&1
  ncu -i "$OUTD/$name.ncu-rep" --page raw --csv --metrics gpu__time_duration.sum,launch__grid_size,smsp__inst_executed.sum \
    >"$OUTD/${name}_summary.csv" 2>&1
  # One SASS listing per distinct kernel name (the last launch of each: warm).
  ncu -i "$OUTD/$name.ncu-rep" --page raw --csv --metrics gpu__time_duration.sum 2>/dev/null |
    awk -F'","' 'NR > 2 {print $5}' | sort -u | head -12 | while read -r kname; do
      short=$(echo "$kname" | tr -c 'A-Za-z0-9_\n' '_' | cut -c1-60)
      # -k takes the function's base name (a demangled name with its template arguments and parameters matches none)
      base=$(echo "$kname" | sed -E 's/^void //; s/[<(].*//; s/.*:://')
      ncu -i "$OUTD/$name.ncu-rep" --page source --print-source sass --csv -k "regex:^$base" \
        >"$OUTD/${name}_sass_${short}.csv" 2>/dev/null || true
    done
  echo "profiled $name: $(ls "$OUTD"/${name}_sass_*.csv 2>/dev/null | wc -l) SASS listings"
  shift 5
done
