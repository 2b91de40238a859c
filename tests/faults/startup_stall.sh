#!/usr/bin/env bash
# startup_stall.sh: a rank stops for good inside MPI's start-up (MGRL_FAULT_INJECT=startup_stall); the start-up
# deadline (MGRL_STARTUP_TIMEOUT_S=3) must end the job: exit code 4, one line saying so, within a few seconds.
# usage: startup_stall.sh -- MPIEXEC ... MGRL info --runtime.backend=cpu
shift  # --
start=$(date +%s)
out=$(MGRL_STARTUP_TIMEOUT_S=3 MGRL_FAULT_INJECT=startup_stall:rank=1:step=0 "$@" 2>&1)
rc=$?
took=$(($(date +%s) - start))
echo "$out"
echo "exit code $rc after $took s"
[ "$rc" -eq 4 ] || { echo "FAIL: exit code $rc, not 4"; exit 1; }
grep -q "MPI start-up did not finish in 3 s" <<< "$out" || { echo "FAIL: no start-up deadline line"; exit 1; }
[ "$took" -lt 30 ] || { echo "FAIL: took $took s"; exit 1; }
echo "PASS: the stalled start-up ended in $took s with exit code 4"
