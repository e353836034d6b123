#!/usr/bin/env bash
# Fuzzes each target for SECONDS (default 60) from its corpus, new inputs kept in a scratch folder (the corpus in the
# repository is not written). Usage: fuzz/run.sh BUILD_DIR [SECONDS [RUNS]]; the build configured with -DSPATTN_FUZZ=ON.
# RUNS: stop each target after that many inputs instead (SECONDS still bounds it; 0: no bound), e.g. the 10^6-input
# bar: fuzz/run.sh build-fuzz 0 1000000. Prints each target's run count; exits non-zero on the first crash, hang,
# leak or sanitizer report.
set -euo pipefail
build=${1:?usage: fuzz/run.sh BUILD_DIR [SECONDS [RUNS]]}; secs=${2:-60}; runs=${3:-}
here="$(cd "$(dirname "$0")" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
export LSAN_OPTIONS="suppressions=$here/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
mkdir -p "$build/fuzz/artifacts"  # a failing input is kept here
for t in parse npy mask; do
  mkdir -p "$scratch/$t"
  "$build/fuzz/fuzz_$t" -max_total_time="$secs" ${runs:+-runs="$runs"} -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
      -artifact_prefix="$build/fuzz/artifacts/$t-" -print_final_stats=1 "$scratch/$t" "$here/corpus/$t" \
      2> "$scratch/$t.log" || { tail -50 "$scratch/$t.log"; exit 1; }
  echo "fuzz_$t: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$t.log" | grep -o '[0-9]*$') inputs in" \
       "$(grep -o 'runs in [0-9]* second' "$scratch/$t.log" | grep -o '[0-9][0-9]*') s, no failure"
done
