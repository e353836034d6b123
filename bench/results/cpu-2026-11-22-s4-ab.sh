#!/bin/bash
# Session s4 A/B by process alternation: ./hold = cpu-2026-11-22-s4-harness.cpp linked against the library at
# the commit before 900d972 (src/cpu as at 7662205), ./hnew = the same harness against 900d972. Each round runs
# one process of each (REPS calls each); the summary is the median over rounds of each process's median.
# usage: ab.sh THREADS REPS MODE ROUNDS LOG
T=$1; R=$2; M=$3; N=$4; LOG=$5
uptime >> $LOG
for i in $(seq $N); do for b in hold hnew; do echo -n "$b " >> $LOG; NOREF=1 ./$b $T $R $M 0 | grep "threads $T mode" >> $LOG; done; done
uptime >> $LOG
python3 - "$LOG" <<'PY'
import sys,re,statistics
d={}
for line in open(sys.argv[1]):
    m=re.match(r'(hold|hnew) variant 0 threads (\d) mode (\d): median ([\d.]+) ms.*ticks/score\*threads median ([\d.]+)',line)
    if m: d.setdefault((m.group(1),m.group(2),m.group(3)),[]).append((float(m.group(4)),float(m.group(5))))
for k,v in sorted(d.items()):
    print(k, "runs", len(v), "median of medians ms %.3f ticks %.2f"%(statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)), "all ms", [x[0] for x in v])
PY
