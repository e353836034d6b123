# Sourced by session 10's device scripts (turns2.sh, run3.sh, run4.sh, run5.sh; run from the repository root,
# carry .gtest). Consolidated after they ran; the commands are the ones they ran. Builds GoogleTest into
# /tmp/gtest-install; s10_build DIR TARGETS... configures and builds the working tree (Release, shared library,
# CUDA on); s10_tests LIB_DIR VAR VALUE runs the fused GPU tests with VAR=VALUE in the environment.
unset CXX CC CUDAHOSTCXX
set -u
t0=$(date +%s)
cmake -S .gtest -B /tmp/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/tmp/gtest-install -DBUILD_GMOCK=OFF >/dev/null 2>&1 && ninja -C /tmp/gtest-build install >/dev/null
s10_build() {
  local d=$1; shift
  cmake -S . -B "$d" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DSPATTN_CUDA=ON -DGTest_ROOT=/tmp/gtest-install >/dev/null 2>&1 &&
    ninja -C "$d" "$@" > "$d.log" 2>&1 || { echo "build $d failed"; tail -30 "$d.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
}
s10_tests() {
  local d=$1 var=$2 val=$3
  env "$var=$val" timeout 200 "$d/tests/fused_test" > "$OUT/t$val.log" 2>&1
  echo "$var=$val tests rc $?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/t$val.log" | tr '\n' ' ')"
  grep -E "FAILED  \]" "$OUT/t$val.log" | head -5
}
s10_sanitize() {  # LIB_DIR VAR VALUE: racecheck and memcheck of band-kernel cases with VAR=VALUE
  local d=$1 var=$2 val=$3 F=Fused/FusedSuite.MatchesReference
  env "$var=$val" timeout 150 compute-sanitizer --tool racecheck "$d/tests/fused_test" --gtest_filter="$F/51:$F/73:$F/74:$F/75" 2>&1 | tail -1
  env "$var=$val" timeout 150 compute-sanitizer --tool memcheck "$d/tests/fused_test" --gtest_filter="$F/51:$F/59:$F/69:$F/74:Fused/FusedGraph*" 2>&1 | tail -1
}
