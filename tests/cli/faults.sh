#!/usr/bin/env bash
# faults.sh: faults in a 2-rank SFT job (issue 13, docs/reliability.md). Each scenario asserts how the job ends (exit
# status, within a time bound), the line that names what happened, that no process of the job is left behind, and
# for the polite signals that the checkpoint resumes to the weights of an uninterrupted run.
#   faults.sh SCENARIO WORK CHECK_TRAIN -- LAUNCH...   (LAUNCH: mpirun -n 2 ... mgrl sft ARGS, without dirs)
# Scenarios:
#   kill9-rank1       SIGKILL to rank 1 mid-run: the job ends within 20 s, mpirun names rank 1 and the signal
#   sigstop-rank1     SIGSTOP to rank 1 mid-run (rank 0 then waits in a collective): rank 0's watchdog ends the job
#                     at runtime.comm_timeout_s (5 s) plus a margin, with one line naming the collective
#   throw-ckpt-write  rank 0 fails while writing a checkpoint (MGRL_FAULT_INJECT): exit 2, one line naming the file,
#                     no temporary left, the earlier checkpoint intact, and resume=auto ends at the straight weights
#   sigterm-launcher  SIGTERM to mpirun (which aborts the job: Open MPI does not forward it): the job ends within
#                     10 s, nothing left running, and resume=auto from the newest checkpoint ends at the straight weights
#   sigint-launcher   SIGINT to mpirun: the same
set -uo pipefail
scenario=$1 work=$2 check=$3
shift 3
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work"
steps=2000
fail() { echo "FAIL ($scenario): $*"; cat "$work"/*.log 2>/dev/null | grep -v '^step ' | tail -n 30; exit 1; }
# The job's processes: every process whose command line holds this work directory (unique per test).
procs() { pgrep -f -- "--log.dir=$work/" || true; }
cleanup() { for p in $(procs); do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done; }
trap cleanup EXIT
no_orphans() {
  for _ in $(seq 50); do [ -z "$(procs)" ] && return 0; sleep 0.1; done
  fail "processes left behind: $(procs | tr '\n' ' ')"
}
rank_pid() {  # the PID of mgrl rank $1 of run $2 (Open MPI sets OMPI_COMM_WORLD_RANK in each rank's environment)
  for p in $(pgrep -f -- "--log.dir=$work/$2"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then echo "$p"; return; fi
  done
}
wait_step() {  # until run $1 has logged step $2
  for _ in $(seq 400); do
    grep -q "\"step\":$2[,}]" "$work/$1/metrics.jsonl" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "run $1 never reached step $2"
}
straight() { "$@" --train.max_steps=$steps --log.dir="$work/a" --checkpoint.dir="$work/a/ck" > "$work/a.log" 2>&1 ||
             fail "the uninterrupted run failed"; }
timed_wait() {  # waits for PID $1 at most $2 s; sets rc and secs
  local t0=$SECONDS
  for _ in $(seq $(( $2 * 20 ))); do kill -0 "$1" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$1" 2>/dev/null && fail "the job did not end within $2 s"
  wait "$1"; rc=$?; secs=$(( SECONDS - t0 ))
}

case $scenario in
kill9-rank1|sigstop-rank1)
  "$@" --train.max_steps=$steps --runtime.comm_timeout_s=5 --log.dir="$work/b" --checkpoint.dir="$work/b/ck" \
    > "$work/b.log" 2>&1 &
  pid=$!
  wait_step b 3
  victim=$(rank_pid 1 b)
  [ -n "$victim" ] || fail "rank 1 not found"
  if [ "$scenario" = kill9-rank1 ]; then
    kill -KILL "$victim"
    timed_wait "$pid" 20
    [ "$rc" != 0 ] || fail "exit 0 after a rank was killed"
    grep -Eq "rank 1 .*(signal 9|Killed)" "$work/b.log" || fail "no line naming rank 1 and the signal"
    echo "rank 1 killed: the job ended in ${secs} s with exit $rc; $(grep -Em1 'rank 1 .*(signal 9|Killed)' "$work/b.log" | sed 's/^ *//')"
  else
    kill -STOP "$victim"
    timed_wait "$pid" 25
    kill -CONT "$victim" 2>/dev/null
    [ "$rc" != 0 ] || fail "exit 0 after a rank was stopped"
    line=$(grep -E "mgrl: error: rank 0 of 2: [a-z_]+ #[0-9]+ .*did not complete within 5 s \(runtime.comm_timeout_s\)" "$work/b.log" | head -n 1)
    [ -n "$line" ] || fail "no watchdog line of rank 0 naming the collective"
    [ "$secs" -ge 4 ] || fail "ended after ${secs} s, before the timeout"
    echo "rank 1 stopped: the job ended in ${secs} s with exit $rc; $line"
  fi
  no_orphans
  ;;
throw-ckpt-write)
  straight "$@"
  MGRL_FAULT_INJECT=checkpoint_write@20 "$@" --train.max_steps=$steps --checkpoint.every_steps=10 \
    --log.dir="$work/b" --checkpoint.dir="$work/b/ck" > "$work/b.log" 2>&1 &
  pid=$!
  timed_wait "$pid" 30
  [ "$rc" = 2 ] || fail "exit $rc, expected 2"
  n=$(grep -c "^mgrl: error:" "$work/b.log")
  line=$(grep "^mgrl: error:" "$work/b.log" | head -n 1)
  [ "$n" = 1 ] || fail "$n error lines, expected 1"
  grep -q "step_00000020.h5: cannot write the checkpoint" <<< "$line" || fail "the line does not name the file"
  ls "$work/b/ck" | grep -q "tmp" && fail "a temporary file is left: $(ls "$work/b/ck")"
  [ -f "$work/b/ck/step_00000010.h5" ] || fail "the earlier checkpoint is gone"
  [ -f "$work/b/ck/step_00000020.h5" ] && fail "a checkpoint of the failed step exists"
  no_orphans
  "$@" --train.max_steps=$steps --checkpoint.every_steps=10 --log.dir="$work/b" --checkpoint.dir="$work/b/ck" \
    --checkpoint.resume=auto > "$work/c.log" 2>&1 || fail "resume failed"
  grep -q "resumed from .*step_00000010.h5" "$work/c.log" || fail "not resumed from step 10"
  "$check" weights "$work/a/ck/step_$(printf %08d $steps).h5" "$work/b/ck/step_$(printf %08d $steps).h5" --exact ||
    fail "weights differ"
  echo "checkpoint write failed at step 20: exit 2 in ${secs} s, $line; resumed from step 10 to the same weights"
  ;;
sigterm-launcher|sigint-launcher)
  # Open MPI's mpirun does not forward SIGTERM or SIGINT (it refuses them in ess_base_forward_signals): it aborts
  # the job, killing the ranks after odls_base_sigkill_timeout (1 s). What is asked of mgrl then is not to hang, to
  # leave no process behind, and to resume from the newest complete checkpoint to the weights of a straight run.
  # (A polite stop under mpirun is SIGUSR1, which it forwards: cli.stop.sigusr1_mpirun.np2; srun forwards SIGTERM.)
  sig=${scenario%%-*}; sig=${sig#sig}; sig=${sig^^}
  straight "$@"
  "$@" --train.max_steps=$steps --checkpoint.every_steps=50 --log.dir="$work/b" --checkpoint.dir="$work/b/ck" \
    > "$work/b.log" 2>&1 &
  pid=$!
  wait_step b 120
  kill "-$sig" "$pid"
  timed_wait "$pid" 10
  no_orphans
  newest=$(ls "$work/b/ck" | grep -E '^step_[0-9]{8}\.h5$' | tail -n 1)
  [ -n "$newest" ] || fail "no checkpoint"
  "$@" --train.max_steps=$steps --checkpoint.every_steps=50 --log.dir="$work/b" --checkpoint.dir="$work/b/ck" \
    --checkpoint.resume=auto > "$work/c.log" 2>&1 || fail "resume failed"
  grep -q "resumed from .*$newest" "$work/c.log" || fail "not resumed from $newest"
  "$check" weights "$work/a/ck/step_$(printf %08d $steps).h5" "$work/b/ck/step_$(printf %08d $steps).h5" --exact ||
    fail "weights differ"
  echo "SIG$sig to mpirun: the job ended in ${secs} s (mpirun exit $rc), no process left; resumed from $newest to the same weights"
  ;;
*) echo "unknown scenario $scenario"; exit 2 ;;
esac
