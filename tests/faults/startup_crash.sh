#!/usr/bin/env bash
# startup_crash.sh: a rank crashes inside MPI's start-up (MGRL_FAULT_INJECT=startup_crash: a call through a null
# function pointer, as Open MPI's TCP transport did, docs/reliability.md): its line names the rank, the signal and the
# phase, it ends with exit code 4 (a lost rank, which slurm/common.sh requeues) instead of the signal, and the job
# ends within seconds (MGRL_STARTUP_TIMEOUT_S=5 bounds the other rank if the launcher does not end it first).
# usage: startup_crash.sh -- MPIEXEC ... MGRL info --runtime.backend=cpu
shift  # --
fail() { echo "FAIL: $*"; exit 1; }
start=$(date +%s)
out=$(MGRL_STARTUP_TIMEOUT_S=5 MGRL_FAULT_INJECT=startup_crash:rank=1:step=0 "$@" 2>&1)
rc=$?
took=$(($(date +%s) - start))
echo "$out"
echo "exit code $rc after $took s"
[ "$rc" -eq 4 ] || fail "exit code $rc, not 4"
grep -Eq '^mgrl: rank 1 on host [^ ]+ \(pid [0-9]+\): SIGSEGV \(invalid memory access\) at address 0x0 during MPI start-up ' <<< "$out" ||
  fail "no line naming rank 1, the signal and the start-up phase"
grep -q '^  (a crash in this phase ends the rank with exit code 4: a lost rank, which the batch scripts requeue)$' <<< "$out" || fail "no line naming exit code 4"
grep -q '^  #0 (the caller of the bad address) ' <<< "$out" || fail "no frames"
[ "$took" -lt 20 ] || fail "took $took s"
echo "PASS: the crash in the start-up ended the job in $took s with exit code 4 and rank 1's report"
