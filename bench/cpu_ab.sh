#!/bin/bash
# Same-run CPU A/B of two `spattn` binaries (e.g. a build of an earlier commit and this one): `spattn run` alternated, 9 reps each, median forward time.
OLD=${1:?usage: bench/cpu_ab.sh OLD_SPATTN NEW_SPATTN}; NEW=${2:?usage: bench/cpu_ab.sh OLD_SPATTN NEW_SPATTN}
for spec in "local(256)" "longformer(256, 32)" "bigbird(64, 1, 2, 3, seed=0)" "dilated(256, 2)" "causal" "sparse_fixed(128)" "random(205, seed=0)" "neighborhood(dims=(64,64), kernel=13)"; do
  a=(); b=()
  for i in $(seq 9); do
    a+=($($OLD run --pattern "$spec" --len 4096 --heads 4 --threads 2 | grep -o "time [0-9.]*" | cut -d' ' -f2))
    b+=($($NEW run --pattern "$spec" --len 4096 --heads 4 --threads 2 | grep -o "time [0-9.]*" | cut -d' ' -f2))
  done
  ma=$(printf "%s\n" "${a[@]}" | sort -g | sed -n 5p); mb=$(printf "%s\n" "${b[@]}" | sort -g | sed -n 5p)
  echo "$spec | old $ma ms | new $mb ms | new/old $(python3 -c "print(round($mb/$ma,3))")"
done
