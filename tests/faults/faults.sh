#!/usr/bin/env bash
# faults.sh: one rank of a running multi-rank `mgrl sft` job fails; the job must end in time with one line of ours
# naming the rank and the operation, and leave no process behind.
#   faults.sh SCENARIO WORK CHECK_TRAIN -- LAUNCH...
# LAUNCH: mpirun -n N ... mgrl sft ... (without --train.max_steps, --checkpoint.dir, --log.dir, which this adds).
# Scenarios:
#   kill9:R       SIGKILL to rank R after step 2 (mid-run)
#   sigstop:R     SIGSTOP to rank R after step 2: the others wait in a collective until runtime.comm_timeout_s
#   ckthrow:R     MGRL_FAULT_INJECT: rank R throws while the step-3 checkpoint is written (rank 0 half way through
#                 the file); then resume = auto from the step-2 checkpoint finishes the run
#   cksegv:R      MGRL_FAULT_INJECT: rank R calls a null function pointer while the step-3 checkpoint is written (as a
#                 crashing library would): its one line names the rank, host, pid, signal, address and phase, its
#                 first frame resolves (addr2line) to the caller, and the job ends
#   ckslow:0      MGRL_FAULT_INJECT: rank 0's write of the step-3 checkpoint takes comm_timeout_s + 5 s (a slow file
#                 system) while the others wait for it: the job goes on and ends as an uninterrupted run does (a wait
#                 for a checkpoint may take the timeout twice, or the time its bytes take at 20 MB/s)
#   ckstall:0     the same write takes 30 s (a file system that hangs): the job ends after twice the timeout with
#                 one line naming the wait, the write and its file
set -uo pipefail
scenario=$1 work=$2 check=$3
shift 3
[ "$1" = -- ] && shift
what=${scenario%%:*} victim=${scenario#*:}
timeout_s=6   # runtime.comm_timeout_s of the job
margin=10     # what "a small margin" allows on a loaded 2-core machine (mpirun's own teardown included)
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; echo "--- stderr"; cat "$work/err" 2>/dev/null; exit 1; }

# Every process of this test carries $work on its command line: mpirun and the ranks.
ours() { pgrep -f -- "--log.dir=$work/log" || true; }
cleanup() {
  # A stopped rank must not outlive the test, whatever happened.
  for p in $(ours); do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
}
trap cleanup EXIT

rank_pid() {  # the pid of rank $1 of the job (OMPI_COMM_WORLD_RANK / PMI_RANK in its environment)
  for p in $(ours); do
    [ "$p" = "$launcher" ] && continue
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -Eqx "(OMPI_COMM_WORLD_RANK|PMI_RANK)=$1"; then
      echo "$p"
      return
    fi
  done
}

steps=100000  # far more than the test lets it run
extra=()
if [ "$what" = ckthrow ] || [ "$what" = cksegv ] || [ "$what" = ckslow ] || [ "$what" = ckstall ]; then
  steps=5
  extra=(--checkpoint.every_steps=1)
  export MGRL_FAULT_INJECT="checkpoint_write:rank=$victim:step=3"
  [ "$what" = cksegv ] && MGRL_FAULT_INJECT+=":action=segv"
  [ "$what" = ckslow ] && MGRL_FAULT_INJECT+=":action=sleep:secs=$((timeout_s + 5))"
  [ "$what" = ckstall ] && MGRL_FAULT_INJECT+=":action=sleep:secs=30"
fi
start=$(date +%s.%N)
"$@" --train.max_steps=$steps --runtime.comm_timeout_s=$timeout_s --checkpoint.dir="$work/ck" --log.dir="$work/log" \
  "${extra[@]}" > "$work/out" 2> "$work/err" &
launcher=$!
unset MGRL_FAULT_INJECT

case $what in
  kill9|sigstop)
    for _ in $(seq 1200); do  # 60 s at most for the start (loading, first steps)
      grep -q '"step":2[,}]' "$work/log/metrics.jsonl" 2>/dev/null && break
      kill -0 "$launcher" 2>/dev/null || fail "the job ended before step 2"
      sleep 0.05
    done
    # Once seen on a loaded machine (CI, once in ~20 runs): rank 2 not found right after step 2. Ask again for 10 s,
    # and if it stays unfound, say what was seen, so that the next time tells why.
    pid=
    for _ in $(seq 200); do
      pid=$(rank_pid "$victim")
      [ -n "$pid" ] && break
      kill -0 "$launcher" 2>/dev/null || fail "the job ended before rank $victim was found"
      sleep 0.05
    done
    if [ -z "$pid" ]; then
      for p in $(ours); do
        echo "pid $p (launcher $launcher): $(tr '\0' ' ' < "/proc/$p/cmdline" 2>&1 | cut -c1-80)...;" \
          "$(tr '\0' '\n' < "/proc/$p/environ" 2>&1 | grep -E 'RANK=|^tr:' | tr '\n' ' ')"
      done
      fail "no process found for rank $victim"
    fi
    if [ "$what" = kill9 ]; then kill -KILL "$pid"; else kill -STOP "$pid"; fi
    start=$(date +%s.%N)
    ;;
esac
wait "$launcher"
rc=$?
secs=$(echo "$(date +%s.%N) - $start" | bc)
echo "scenario $scenario: launcher exit $rc after ${secs}s"
echo "--- stderr"; cat "$work/err"
echo "---"

limit=$((timeout_s + margin))
case $what in ckslow|ckstall) limit=$((2 * timeout_s + margin));; esac
[ "$(echo "$secs < $limit" | bc)" = 1 ] || fail "the job took ${secs}s to end, more than ${limit}s"
if [ "$what" = cksegv ]; then
  # The crashed rank's line (its frames below it), and at most one line of a survivor naming it.
  line=$(grep '^mgrl: rank ' "$work/err" | head -n 1)
  echo "$line" | grep -Eq "^mgrl: rank $victim on host [^ ]+ \(pid [0-9]+\): SIGSEGV \(invalid memory access\) at address 0x0 during the run; its frames follow" ||
    fail "no line naming rank $victim, its host and pid, the signal, the address and the phase"
  others=$(grep '^mgrl:' "$work/err" | grep -v '^mgrl: rank ' || true)
  [ "$(grep -c . <<< "$others")" -le 1 ] || fail "more than one line of the other ranks: $others"
  [ -z "$others" ] || grep -Eq "rank $victim \(pid [0-9]+\) has ended \(killed or crashed\)" <<< "$others" ||
    fail "a survivor's line does not name rank $victim: $others"
  grep -q 'Process received signal' "$work/err" && fail "Open MPI's own report too (ours must be the one installed)"
  # The first frame is the caller of the null pointer: fault::point, as addr2line resolves its module+offset.
  frame=$(grep -m1 '^  #0 (the caller of the bad address) ' "$work/err") || fail "no caller frame"
  module=$(sed -E 's/^.*\) ([^ (]+)\(.*$/\1/' <<< "$frame")
  offset=$(sed -E 's/^.*\(\+(0x[0-9a-f]+)\).*$/\1/' <<< "$frame")
  where=$(addr2line -Cfe "$module" "$offset" | head -n 1)
  echo "frame #0: $frame -> $where"
  [[ $where == mgrl::fault::point* ]] || fail "frame #0 resolves to '$where', not mgrl::fault::point"
  [ "$(grep -c '^  #[0-9]* ' "$work/err")" -ge 4 ] || fail "fewer than 4 frames"
  # A crash in the run keeps its signal (a bug is not requeued): not exit code 4, which a start-up crash gets.
  [ "$rc" != 0 ] && [ "$rc" != 4 ] || fail "exit code $rc: a crash in the run must end with its signal"
  grep -q "exited on signal 11" "$work/err" || fail "the launcher does not report rank $victim's SIGSEGV"
  what=done
fi
if [ "$what" = ckslow ]; then
  [ "$rc" = 0 ] || fail "exit code $rc: the wait for a slow checkpoint write ended the job"
  grep -q '^mgrl: error' "$work/err" && fail "an error line: $(grep '^mgrl: error' "$work/err")"
  [ "$(ls "$work/ck" | tail -n 1)" = step_00000005.h5 ] || fail "checkpoints: $(ls "$work/ck")"
  "$@" --train.max_steps=$steps --checkpoint.dir="$work/straight" --log.dir="$work/straight" > /dev/null 2>&1 ||
    fail "the uninterrupted run failed"
  "$check" weights "$work/straight/step_00000005.h5" "$work/ck/step_00000005.h5" --exact || fail "weights differ"
  what=done
fi
lines=$(grep -c '^mgrl:' "$work/err")
[ "$what" = done ] || [ "$lines" = 1 ] || fail "$lines lines from mgrl on stderr, expected 1"
line=$(grep -m1 '^mgrl:' "$work/err")
case $what in
  kill9)
    [ "$rc" != 0 ] || fail "exit code 0"
    echo "$line" | grep -Eq "^mgrl: error: (\[rank [0-9]+\] )?rank $victim \(pid $pid\) has ended \(killed or crashed\) while this rank (waited in [a-z_.]+ #[0-9]+|was computing)" ||
      fail "the line does not name rank $victim and the operation: $line"
    ;;
  sigstop)
    [ "$rc" != 0 ] || fail "exit code 0"
    [ "$(echo "$secs >= $timeout_s - 1" | bc)" = 1 ] || fail "ended after ${secs}s, before the timeout: by what?"
    echo "$line" | grep -Eq "^mgrl: error: (\[rank [0-9]+\] )?[a-z_.]+ #[0-9]+ \([^)]*\) did not complete within $timeout_s s \(runtime.comm_timeout_s\): rank $victim \(pid $pid\) is stopped" ||
      fail "the line does not name the collective and rank $victim: $line"
    ;;
  ckstall)
    [ "$rc" = 1 ] || fail "exit code $rc, expected 1"
    [ "$(echo "$secs >= 2 * $timeout_s" | bc)" = 1 ] || fail "ended after ${secs}s, before twice the timeout"
    echo "$line" | grep -Eq "^mgrl: error: (\[rank [0-9]+\] )?env.allreduce_max #[0-9]+ \(i32 x 1\) did not complete within $((2 * timeout_s)) s \(runtime.comm_timeout_s \+ $timeout_s s for rank 0's write of .*/ck/step_00000003.h5 \([0-9.]+ MB\)\): it has not ended \(a file system or reward program that hangs\?\), or another rank has failed; ending the job$" ||
      fail "the line does not name the wait, the write and its file: $line"
    ;;
  ckthrow)
    if [ "$victim" = 0 ]; then
      [ "$rc" = 2 ] || fail "exit code $rc, expected 2 (a write that fails is the file system's doing)"
      echo "$line" | grep -Eq "^mgrl: error: .*/ck/step_00000003.h5: cannot write the checkpoint .*: fault injected by MGRL_FAULT_INJECT: checkpoint_write on rank 0 at step 3$" ||
        fail "the line does not name the file, the write and rank 0: $line"
    else
      [ "$rc" = 1 ] || fail "exit code $rc, expected 1"
      echo "$line" | grep -Eq "^mgrl: error: rank $victim: fault injected by MGRL_FAULT_INJECT: checkpoint_write on rank $victim at step 3$" ||
        fail "the line does not name rank $victim and the write: $line"
    fi
    ls "$work/ck" | grep -q tmp && fail "a temporary file is left: $(ls "$work/ck")"
    # Rank 0's failed write leaves step 2 the newest; another rank's failure does not stop rank 0's write (the
    # weights were checked equal on every rank before it), so step 3 is complete.
    newest=$([ "$victim" = 0 ] && echo 2 || echo 3)
    [ "$(ls "$work/ck" | tail -n 1)" = "step_0000000$newest.h5" ] || fail "checkpoints: $(ls "$work/ck")"
    # The run goes on from the newest complete checkpoint and ends as an uninterrupted run does.
    "$@" --train.max_steps=$steps --checkpoint.dir="$work/ck" --log.dir="$work/log" --checkpoint.every_steps=1 \
      --checkpoint.resume=auto > "$work/resume.log" 2>&1 || fail "resume failed: $(cat "$work/resume.log")"
    grep -q "resumed from .*step_0000000$newest.h5" "$work/resume.log" || fail "not resumed from step $newest"
    "$@" --train.max_steps=$steps --checkpoint.dir="$work/straight" --log.dir="$work/straight" > /dev/null 2>&1 ||
      fail "the uninterrupted run failed"
    "$check" weights "$work/straight/step_00000005.h5" "$work/ck/step_00000005.h5" --exact || fail "weights differ"
    ;;
esac

# No process of the job is left (mpirun reaps its ranks; allow it a moment).
for _ in $(seq 40); do [ -z "$(ours)" ] && break; sleep 0.1; done
left=$(ours)
[ -z "$left" ] || fail "processes left behind: $(ps -o pid,stat,args -p "$(echo $left | tr ' ' ,)")"
echo "PASS: $scenario ended after ${secs}s (limit ${limit}s), exit $rc, one line: $line"
