#!/usr/bin/env bash
# startup_fault.sh: a rank fails inside MPI's start-up; the job must end within seconds with exit code 4 (a lost rank,
# which slurm/common.sh requeues) and one line saying why.
#   stall: rank 1 stops for good before the first collective (MGRL_FAULT_INJECT=startup_stall): the start-up deadline
#          (MGRL_STARTUP_TIMEOUT_S=3) ends the job with its line
#   crash: rank 1 calls a null function pointer there (MGRL_FAULT_INJECT=startup:...:action=segv, as Open MPI's TCP transport
#          did, docs/reliability.md): its crash report names the rank, signal and phase, then frames, and it ends
#          with exit code 4 instead of the signal (MGRL_STARTUP_TIMEOUT_S=5 bounds the other rank)
# usage: startup_fault.sh stall|crash -- MPIEXEC ... MGRL info --runtime.backend=cpu
what=$1
shift 2  # WHAT --
fail() { echo "FAIL: $*"; exit 1; }
case $what in
  stall) timeout_s=3 limit=30 ;;
  crash) timeout_s=5 limit=20 ;;
  *) fail "unknown case $what" ;;
esac
start=$(date +%s)
fault=startup_stall:rank=1:step=0
[ "$what" = crash ] && fault=startup:rank=1:step=0:action=segv
out=$(MGRL_STARTUP_TIMEOUT_S=$timeout_s MGRL_FAULT_INJECT=$fault "$@" 2>&1)
rc=$?
took=$(($(date +%s) - start))
echo "$out"
echo "exit code $rc after $took s"
[ "$rc" -eq 4 ] || fail "exit code $rc, not 4"
[ "$took" -lt "$limit" ] || fail "took $took s"
if [ "$what" = stall ]; then
  grep -q "MPI start-up did not finish in 3 s" <<< "$out" || fail "no start-up deadline line"
else
  grep -Eq '^mgrl: rank 1 on host [^ ]+ \(pid [0-9]+\): SIGSEGV \(invalid memory access\) at address 0x0 during MPI start-up ' <<< "$out" ||
    fail "no line naming rank 1, the signal and the start-up phase"
  grep -q '^  (a crash in this phase ends the rank with exit code 4: a lost rank, which the batch scripts requeue)$' <<< "$out" ||
    fail "no line naming exit code 4"
  grep -q '^  #0 (the caller of the bad address) ' <<< "$out" || fail "no frames"
fi
echo "PASS: the start-up $what ended the job in $took s with exit code 4"
