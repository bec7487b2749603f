#!/bin/bash
# usage: run.sh CASE ROUNDS -- extra cnnpar args
CASE=$1; ROUNDS=$2; shift 2
LOG=/tmp/threads_bench/$CASE.log
for r in $(seq 1 $ROUNDS); do
  for load in quiet loaded; do
    HOG=
    if [ $load = loaded ]; then taskset -c 1 python -c "while True: pass" & HOG=$!; sleep 1; fi
    for arm in default passive spin10k omp1; do
      case $arm in
        default) ENVV=();;
        passive) ENVV=(OMP_WAIT_POLICY=PASSIVE);;
        spin10k) ENVV=(GOMP_SPINCOUNT=10000);;
        omp1) ENVV=(OMP_NUM_THREADS=1);;
      esac
      out=$(env "${ENVV[@]}" cnnpar train --no-progress --out-dir /tmp/threads_runs "$@" 2>&1)
      echo "$out" | grep '^epoch' | sed "s/^/$r $load $arm | /" >> $LOG
      echo "$out" | grep -q '^done' || echo "$r $load $arm FAILED: $(echo "$out"|tail -3)" >> $LOG
    done
    [ -n "$HOG" ] && kill $HOG && wait $HOG 2>/dev/null
  done
done
echo END >> $LOG
