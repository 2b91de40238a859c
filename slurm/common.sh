# shellcheck shell=bash
# common.sh: what the mgrl batch scripts share; sourced by them, not run. It
#   - finds the mgrl binary: $MGRL if set, else the one installed beside these scripts (<prefix>/bin/mgrl when they
#     sit in <prefix>/share/mgrl/slurm), else `mgrl` on PATH (module load mgrl), else the source tree's build/mgrl;
#   - makes the job's run directory: $MGRL_RUN_DIR, else the --log.dir=... you gave, else runs/<job name>-<job id>
#     (relative to the submit directory). Requeued runs keep their job id, so they find it again. From then on the
#     job's output is appended to <run dir>/job.log; mgrl writes metrics.jsonl, TensorBoard events, rollouts/,
#     checkpoints/ and job_summary.txt there;
#   - runs mgrl under srun with a graceful stop: SIGUSR1 / SIGTERM / SIGINT reaching this shell (#SBATCH
#     --signal=B:USR1@300, scancel --signal=USR1 --batch, preemption) is passed on to every rank, which finish their
#     step, write a checkpoint and exit with code 3;
#   - decides what comes next from mgrl's exit code: 0, done; 3 (stopped with work left) or 4 (a rank or node of the
#     job was lost: killed, crashed, its node down or its network cut), `scontrol requeue` of this job, which starts
#     again later (on the nodes SLURM then gives it) and resumes from the newest checkpoint (checkpoint.resume =
#     "auto"); anything else, the job fails and is not requeued (except when srun's own lines say a task exited with
#     4: see mgrl_rank_lost_in).
# Environment it reads (all optional): MGRL, MGRL_RUN_DIR, MGRL_SRUN_FLAGS (extra srun options), MGRL_MAX_REQUEUES
# (default 20), MGRL_REQUEUE=0 (never requeue).

# Exit codes of mgrl (src/core/error.h): a stop signal ended a training run before its last step; another rank was
# lost (killed, crashed, its node or network lost) and the job ended.
MGRL_EXIT_STOPPED=3
MGRL_EXIT_RANK_LOST=4

mgrl_log() { echo "[mgrl-job $(date '+%F %T')] $*"; }

# mgrl_find_binary: sets MGRL.
mgrl_find_binary() {
  local here=$1
  if [ -n "${MGRL:-}" ]; then
    :
  elif [ -x "$here/../../../bin/mgrl" ] && [ "$(basename "$(cd "$here/.." && pwd)")" = mgrl ]; then
    MGRL=$(cd "$here/../../../bin" && pwd)/mgrl  # installed: <prefix>/share/mgrl/slurm -> <prefix>/bin/mgrl
  elif command -v mgrl >/dev/null 2>&1; then
    MGRL=$(command -v mgrl)
  elif [ -x "$here/../build/mgrl" ]; then
    MGRL=$(cd "$here/../build" && pwd)/mgrl  # the source tree's build
  else
    echo "mgrl-job: error: no mgrl binary: load the module (module load mgrl), put mgrl on PATH or set MGRL" >&2
    exit 2
  fi
  [ -x "$MGRL" ] || { echo "mgrl-job: error: MGRL=$MGRL is not an executable" >&2; exit 2; }
  export MGRL
}

# mgrl_value KEY ARGS...: the value of the last --KEY=value among ARGS, or nothing.
mgrl_value() {
  local key=$1 v="" a
  shift
  for a in "$@"; do
    case $a in --"$key"=*) v=${a#--"$key"=} ;; esac
  done
  printf '%s' "$v"
}

# mgrl_job_init ARGS...: binary, run directory, job log. ARGS are the mgrl arguments (for --log.dir).
mgrl_job_init() {
  mgrl_find_binary "$MGRL_SLURM_DIR"
  local name=${SLURM_JOB_NAME:-mgrl} id=${SLURM_JOB_ID:-$$}
  local given
  given=$(mgrl_value log.dir "$@")
  MGRL_RUN_DIR=${MGRL_RUN_DIR:-${given:-runs/$name-$id}}
  mkdir -p "$MGRL_RUN_DIR"
  MGRL_RUN_DIR=$(cd "$MGRL_RUN_DIR" && pwd)
  export MGRL_RUN_DIR
  echo "mgrl-job: job ${SLURM_JOB_ID:-none}: output continues in $MGRL_RUN_DIR/job.log"
  exec >> "$MGRL_RUN_DIR/job.log" 2>&1
  mgrl_log "job ${SLURM_JOB_ID:-none} ($name) start $(( ${SLURM_RESTART_COUNT:-0} + 1 )) on ${SLURM_JOB_NODELIST:-$(hostname -s)}:" \
           "${SLURM_NNODES:-1} node(s), ${SLURM_NTASKS:-1} task(s); mgrl: $MGRL; run directory: $MGRL_RUN_DIR"
}

# mgrl_training_args ARGS...: prints (one per line) the overrides that make mgrl write into the run directory and
# resume from its newest checkpoint, for the keys ARGS do not set themselves.
mgrl_training_args() {
  [ -n "$(mgrl_value log.dir "$@")" ] || echo "--log.dir=$MGRL_RUN_DIR"
  [ -n "$(mgrl_value checkpoint.dir "$@")" ] || echo "--checkpoint.dir=$MGRL_RUN_DIR/checkpoints"
  [ -n "$(mgrl_value checkpoint.resume "$@")" ] || echo "--checkpoint.resume=auto"
}

# mgrl_srun_stoppable CMD...: runs `srun --mpi=pmix $MGRL_SRUN_FLAGS CMD...` in the background, passes stop signals
# on to it (srun forwards them to every task) and returns its exit code.
mgrl_srun_stoppable() {
  local pid rc
  # shellcheck disable=SC2086
  srun --mpi=pmix ${MGRL_SRUN_FLAGS:-} "$@" &
  pid=$!
  trap 'mgrl_log "SIGUSR1: asking mgrl to stop after its step"; kill -USR1 "$pid" 2>/dev/null || true' USR1
  trap 'mgrl_log "SIGTERM: asking mgrl to stop after its step"; kill -USR1 "$pid" 2>/dev/null || true' TERM
  trap 'mgrl_log "SIGINT: asking mgrl to stop after its step"; kill -USR1 "$pid" 2>/dev/null || true' INT
  while :; do
    rc=0
    wait "$pid" || rc=$?
    # wait returns early (> 128) when a trapped signal arrives; wait again until srun has ended.
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - USR1 TERM INT
  return "$rc"
}

# mgrl_rank_lost_in LOG OFFSET: true when srun's part of LOG after byte OFFSET says a task exited with code 4 (a rank
# that lost another, or crashed in MPI's start-up). SLURM's PMIx plugin cancels the whole step when a task ends
# before MPI is set up, so srun itself then returns the other tasks' 137 (SIGKILL), not 4; the task's own code is
# only in srun's "task N: Exited with exit code 4" line.
mgrl_rank_lost_in() {
  tail -c +$(($2 + 1)) "$1" 2>/dev/null | grep -Eq '^srun: error: [^ ]+: tasks? [0-9,-]+: Exited with exit code 4$'
}

# mgrl_finish RC [LOG OFFSET]: the end of the job from mgrl's exit code: done, requeue, or fail. With LOG and OFFSET
# (the job log and its size before srun), a run that srun ended with another code after a task exited with code 4
# counts as exit 4.
mgrl_finish() {
  local rc=$1 restarts=${SLURM_RESTART_COUNT:-0}
  if [ "$rc" != 0 ] && [ "$rc" != "$MGRL_EXIT_STOPPED" ] && [ "$rc" != "$MGRL_EXIT_RANK_LOST" ] && [ $# -ge 3 ] &&
     mgrl_rank_lost_in "$2" "$3"; then
    mgrl_log "srun ended with exit $rc after a task exited with code 4 (SLURM's PMIx plugin then ends the step's other tasks): taken as exit 4"
    rc=$MGRL_EXIT_RANK_LOST
  fi
  case $rc in
    0)
      mgrl_log "mgrl finished (exit 0): done"
      exit 0 ;;
    "$MGRL_EXIT_STOPPED" | "$MGRL_EXIT_RANK_LOST")
      local why="mgrl stopped with work left (exit 3) after writing a checkpoint"
      [ "$rc" = "$MGRL_EXIT_RANK_LOST" ] &&
        why="mgrl lost a rank or node (exit 4; its line above names it): the job resumes from its last checkpoint"
      if [ -z "${SLURM_JOB_ID:-}" ] || [ "${MGRL_REQUEUE:-1}" = 0 ]; then
        mgrl_log "$why; not requeued (no SLURM job, or MGRL_REQUEUE=0)"
        exit "$rc"
      fi
      if [ "$restarts" -ge "${MGRL_MAX_REQUEUES:-20}" ]; then
        mgrl_log "$why, but the job was already requeued $restarts times (MGRL_MAX_REQUEUES): not requeued"
        exit "$rc"
      fi
      mgrl_log "$why: requeueing job $SLURM_JOB_ID (restart $((restarts + 1)))"
      if scontrol requeue "$SLURM_JOB_ID"; then
        exit 0
      fi
      mgrl_log "scontrol requeue $SLURM_JOB_ID failed: resubmit this script by hand to resume"
      exit "$rc" ;;
    *)
      mgrl_log "mgrl failed (exit $rc): not requeued"
      exit "$rc" ;;
  esac
}

# mgrl_train ARGS...: the whole job for a training run (sft or grpo): init, srun, then done / requeue / fail.
mgrl_train() {
  mgrl_job_init "$@"
  local extra=() rc=0 log=$MGRL_RUN_DIR/job.log offset
  mapfile -t extra < <(mgrl_training_args "$@")
  mgrl_log "srun --mpi=pmix ${MGRL_SRUN_FLAGS:-}$MGRL $* ${extra[*]}"
  offset=$(stat -c %s "$log")
  mgrl_srun_stoppable "$MGRL" "$@" "${extra[@]}" || rc=$?
  mgrl_finish "$rc" "$log" "$offset"
}
