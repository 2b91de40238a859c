#!/usr/bin/env bash
# stop_edges.sh: a stop signal at the edges of a training run (core/stop.h).   stop_edges.sh CASE WORK -- LAUNCH...
# (LAUNCH: the mgrl sft command line, without --log.dir, --checkpoint.dir and --train.max_steps.)
#   no_checkpoint_dir   SIGTERM mid-run with checkpoint.dir empty: exit 3 and a warning that nothing is saved (it
#                       said "checkpoint, then exit code 3" while none was written, until 2026-11-28)
#   final_eval          SIGKILL during the final evaluation (a preemption's SIGTERM then, KillWait later, SIGKILL):
#                       the final checkpoint is already written (it came after the evaluation: all the run's steps
#                       since its last periodic checkpoint were lost, until 2026-11-28)
#   during_setup        SIGUSR1 during a long set-up (MGRL_FAULT_INJECT=training_setup sleeps), after a first run
#                       left a checkpoint: exit 3 at once with one line, the checkpoint untouched, and a run again
#                       resumes from it; SIGTERM there: its default action (143), no line. (SIGUSR1 killed the
#                       process with 138 and no line until 2026-11-29: SLURM's job scripts then did not requeue.)
set -uo pipefail
case_=$1 work=$2
shift 2
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; echo "--- output"; cat "$work/out" 2>/dev/null; exit 1; }
wait_step() {  # STEP: until metrics.jsonl has it (or the run has ended)
  for _ in $(seq 1200); do
    grep -q "\"step\":$1[,}]" "$work/log/metrics.jsonl" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
case $case_ in
  no_checkpoint_dir)
    "$@" --train.max_steps=100000 --log.dir="$work/log" --checkpoint.dir= > "$work/out" 2>&1 &
    pid=$!
    wait_step 2 || fail "the run did not reach step 2"
    kill -TERM "$pid"
    rc=0
    wait "$pid" || rc=$?
    grep -v '^step ' "$work/out"
    [ "$rc" = 3 ] || fail "exit code $rc, expected 3"
    grep -q "^mgrl: warning: stopping after step [0-9]*: SIGTERM on rank 0, exit code 3; no checkpoint\.dir is set, so nothing of this run is saved" "$work/out" ||
      fail "no line saying that nothing is saved"
    ! grep -q "(checkpoint, then exit code 3" "$work/out" || fail "it claims a checkpoint"
    echo "PASS: SIGTERM without checkpoint.dir: exit 3, said that nothing is saved" ;;
  final_eval)
    # 3 steps, then the final evaluation with greedy accuracy, whose generation steps take 1 s each here
    # (MGRL_FAULT_INJECT=generate_step): it lasts far longer than the final checkpoint.
    MGRL_FAULT_INJECT=generate_step:rank=0:step=0:count=1000000:action=sleep:secs=1 \
      "$@" --train.max_steps=3 --log.dir="$work/log" --checkpoint.dir="$work/ck" --eval.accuracy=true \
      --eval.every_steps=0 > "$work/out" 2>&1 &
    pid=$!
    wait_step 3 || fail "the run did not reach step 3"
    # The checkpoint follows the step's line at once; give it 5 s (the evaluation takes far longer: 1 s a generation step).
    for _ in $(seq 100); do [ -f "$work/ck/step_00000003.h5" ] && break; sleep 0.05; done
    alive=0
    kill -0 "$pid" 2>/dev/null && alive=1
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    [ "$alive" = 1 ] && ! grep -q "held-out loss" "$work/out" || fail "the evaluation had ended before the check: it proves nothing"
    [ -f "$work/ck/step_00000003.h5" ] || fail "killed during the final evaluation, and no final checkpoint (step 3)"
    echo "PASS: killed during the final evaluation: the final checkpoint (step 3) was already written" ;;
  during_setup)
    "$@" --train.max_steps=2 --log.dir="$work/log" --checkpoint.dir="$work/ck" > "$work/out" 2>&1 ||
      fail "the first run failed"
    [ -f "$work/ck/step_00000002.h5" ] || fail "the first run left no checkpoint"
    before=$(cksum < "$work/ck/step_00000002.h5")
    for sig in USR1 TERM; do
      MGRL_FAULT_INJECT=training_setup:rank=0:step=0:action=sleep:secs=60 \
        "$@" --train.max_steps=4 --log.dir="$work/log" --checkpoint.dir="$work/ck" --checkpoint.resume=auto \
        > "$work/out" 2>&1 &
      pid=$!
      sleep 1.5
      kill -0 "$pid" 2>/dev/null || fail "the run ended before SIG$sig"
      start=$SECONDS
      kill "-$sig" "$pid"
      rc=0
      wait "$pid" || rc=$?
      [ $((SECONDS - start)) -le 5 ] || fail "SIG$sig during set-up: the run went on for $((SECONDS - start)) s"
      want=3 lines=1
      [ "$sig" = TERM ] && want=143 lines=0
      [ "$rc" = "$want" ] || fail "SIG$sig during set-up: exit code $rc, expected $want"
      [ "$(grep -c "^mgrl: SIG$sig before the first training step: stopped with nothing new to save (exit 3" \
           "$work/out")" = "$lines" ] || fail "SIG$sig during set-up: not $lines line(s) saying it stopped"
      [ "$(cksum < "$work/ck/step_00000002.h5")" = "$before" ] || fail "the checkpoint changed"
      [ ! -e "$work/ck/step_00000004.h5" ] || fail "a step was trained"
    done
    "$@" --train.max_steps=4 --log.dir="$work/log" --checkpoint.dir="$work/ck" --checkpoint.resume=auto > "$work/out" 2>&1 ||
      fail "the run again failed"
    grep -q "resumed from .*step_00000002\.h5" "$work/out" || fail "the run again did not resume from step 2"
    echo "PASS: SIGUSR1 during set-up: exit 3 and its line, SIGTERM: 143 and no line; checkpoint untouched, resumed" ;;
  *) fail "unknown case $case_" ;;
esac
