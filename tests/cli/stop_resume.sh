#!/usr/bin/env bash
# stop_resume.sh: a training run stopped by a signal checkpoints, exits 3, and resumes to bitwise the weights of a
# straight run.   stop_resume.sh SIGNAL WORK CHECK_TRAIN -- LAUNCH... (the mgrl sft command line, without dirs)
# STOP_RC: the exit codes the launcher may return (default 3; mpirun ends with 1 after SIGTERM or SIGINT, as it
# tears the job down itself once the ranks have stopped). STOP_STEPS: the run's length (default 1000).
set -euo pipefail
sig=$1 work=$2 check=$3
shift 3
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work"
want_rc=${STOP_RC:-3}
steps=${STOP_STEPS:-1000}  # ~1 ms a step (15 at 2 ranks on 2 cores): the signal after step 2 must land well before the end
"$@" --train.max_steps=$steps --log.dir="$work/a" --checkpoint.dir="$work/a/ck" > "$work/a.log" 2>&1
set -m  # job control: the background run gets SIGINT like a foreground program at a terminal would
"$@" --train.max_steps=$steps --log.dir="$work/b" --checkpoint.dir="$work/b/ck" > "$work/b.log" 2>&1 &
pid=$!
set +m
for _ in $(seq 600); do
  grep -q '"step":2[,}]' "$work/b/metrics.jsonl" 2>/dev/null && break
  sleep 0.05
done
kill "-$sig" "$pid"
rc=0
wait "$pid" || rc=$?
cat "$work/b.log" | grep -v '^step ' || true
[[ "$rc" =~ ^($want_rc)$ ]] || { echo "FAIL: exit code $rc after SIG$sig, expected $want_rc"; exit 1; }
for _ in $(seq 40); do pgrep -f -- "--log.dir=$work/b" > /dev/null || break; sleep 0.1; done
! pgrep -f -- "--log.dir=$work/b" > /dev/null || { echo "FAIL: processes left: $(pgrep -af -- "--log.dir=$work/b")"; exit 1; }
# STOP_ABORT_OK=1 (SIGTERM/SIGINT to Open MPI's mpirun, which aborts the job and kills the ranks 1 s after its own
# SIGTERM): the ranks may not have finished the step and its checkpoint in that second (rank 0 can even block on a
# stdout pipe that mpirun no longer reads). Then what counts is that nothing is left running and that resume = auto
# from the newest complete checkpoint (written every STOP_CKPT_EVERY steps) reaches the straight run's weights.
if [ "${STOP_ABORT_OK:-0}" = 1 ] && [ ! -s "$work/b/job_summary.txt" ]; then
  newest=$(ls "$work/b/ck" 2>/dev/null | grep -E '^step_[0-9]{8}\.h5$' | tail -n 1 || true)
  "$@" --train.max_steps=$steps --log.dir="$work/b" --checkpoint.dir="$work/b/ck" --checkpoint.resume=auto > "$work/c.log" 2>&1
  [ -z "$newest" ] || grep -q "resumed from .*$newest" "$work/c.log" || { echo "FAIL: not resumed from $newest"; exit 1; }
  "$check" weights "$work/a/ck/step_$(printf %08d $steps).h5" "$work/b/ck/step_$(printf %08d $steps).h5" --exact
  echo "SIG$sig: mpirun aborted the job (exit $rc) before the ranks' checkpoint; nothing left running; resumed from" \
       "${newest:-scratch} to the same weights"
  exit 0
fi
# Rank 0 went through the end of the run (the summary is its last file).
[ -s "$work/b/job_summary.txt" ] || { echo "FAIL: no job_summary.txt: the run did not reach its end"; exit 1; }
stopped=$(sed -n 's/.*stopping after step \([0-9]*\).*/\1/p' "$work/b.log" | head -n 1)
[ -n "$stopped" ] && [ "$stopped" -lt $steps ] && [ -f "$work/b/ck/step_$(printf %08d "$stopped").h5" ] ||
  { echo "FAIL: no checkpoint of the stopped step"; exit 1; }
"$@" --train.max_steps=$steps --log.dir="$work/b" --checkpoint.dir="$work/b/ck" --checkpoint.resume=auto > "$work/c.log" 2>&1
grep -q "resumed from .*step_$(printf %08d "$stopped").h5" "$work/c.log" || { echo "FAIL: not resumed"; exit 1; }
"$check" weights "$work/a/ck/step_$(printf %08d $steps).h5" "$work/b/ck/step_$(printf %08d $steps).h5" --exact
echo "SIG$sig: stopped after step $stopped of $steps with exit 3, resumed, the same weights"
