#!/usr/bin/env bash
# test_slurm.sh: mgrl and its batch scripts on the real test SLURM of tests/slurm/cluster.sh (CPU backend).
#   test_slurm.sh CASE       cases below; exit 77 (skipped) only when the test SLURM could not be had at all
# Environment (set by tests/cluster.cmake): MGRL_TEST_STATE (the cluster's state directory), MGRL_TEST_BIN (the
# built mgrl), MGRL_TEST_SRC, MGRL_TEST_WORK (a scratch directory), MGRL_TEST_CHECK (check_train),
# MGRL_TEST_PREFIX (an installed prefix).
set -euo pipefail
case_=$1
: "${MGRL_TEST_STATE:?}" "${MGRL_TEST_BIN:?}" "${MGRL_TEST_SRC:?}" "${MGRL_TEST_WORK:?}"
if [ -f "$MGRL_TEST_STATE/unavailable" ]; then
  echo "SKIPPED: $(cat "$MGRL_TEST_STATE/unavailable")"
  exit 77
fi
[ -f "$MGRL_TEST_STATE/env.sh" ] || { echo "FAIL: the test SLURM is not running (see the output of slurm.cluster_start)"; exit 1; }
# shellcheck disable=SC1091
source "$MGRL_TEST_STATE/env.sh"
src=$MGRL_TEST_SRC
models=$src/tests/data/models
mkdir -p "$MGRL_TEST_WORK"
work=$(mktemp -d "$MGRL_TEST_WORK/$case_.XXXXXX")
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
show_log() { [ -f "$1" ] && sed 's/^/    | /' "$1" || true; }
# wait_state JOB STATE... [timeout]: until the job is in one of the states.
wait_state() {
  local job=$1 want=$2 limit=${3:-90} s=""
  for _ in $(seq $((limit * 5))); do
    s=$(field "$job" JobState)
    [[ " $want " == *" $s "* ]] && return 0
    sleep 0.2
  done
  fail "job $job is '$s' after ${limit} s, expected one of: $want"
}
# run_job NAME SBATCH_ARGS... -- SCRIPT ARGS...: submits, waits for the end, prints the job id.
submit() { sbatch --parsable "$@" | cut -d';' -f1; }
expect_done() {  # JOB RUN_DIR STEPS: completed, not requeued, run directory complete
  local job=$1 dir=$2 steps=$3
  wait_state "$job" "COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY" 120
  echo "job $job: $(field "$job" JobState), exit $(field "$job" ExitCode), restarts $(field "$job" Restarts)"
  show_log "$dir/job.log"
  [ "$(field "$job" JobState)" = COMPLETED ] || fail "job $job did not complete"
  [ "$(field "$job" ExitCode)" = 0:0 ] || fail "job $job exit code $(field "$job" ExitCode)"
  [ "$(field "$job" Restarts)" = 0 ] || fail "a finished job was requeued"
  for f in job.log metrics.jsonl job_summary.txt "checkpoints/step_$(printf %08d "$steps").h5"; do
    [ -s "$dir/$f" ] || fail "$dir/$f is missing or empty"
  done
  grep -q '"step":'"$steps"'[,}]' "$dir/metrics.jsonl" || fail "metrics.jsonl has no step $steps"
  grep -q "mgrl finished (exit 0): done" "$dir/job.log" || fail "job.log does not end with done"
  ls "$dir"/events.out.tfevents.* >/dev/null || fail "no TensorBoard events in $dir"
}

export MGRL=$MGRL_TEST_BIN   # the build tree's mgrl (the installed-script case unsets it)
SFT_ARGS=(--runtime.backend=cpu --runtime.threads=1 --model.path="$models/qwen2_bias_tied" --model.tokenizer="$src/inputs/quickstart"
          --data.input="$src/tests/data/sft/train.jsonl" --eval.input="$src/tests/data/sft/heldout.jsonl"
          --train.batch_size=8 --train.lr=2e-3 --lora.r=4 --lora.alpha=8 --model.init=pretrained --train.full_finetune=false
          --train.max_seq_len=64 --eval.accuracy=false --log.every_steps=1)
GRPO_TINY=(--runtime.backend=cpu --runtime.threads=1 --model.path="$models/qwen2_bias_tied" --model.tokenizer="$src/inputs/quickstart"
           --data.input="$src/tests/data/sft/train.jsonl" --train.batch_size=4 --train.max_steps=3 --grpo.num_generations=4
           --grpo.max_prompt_length=12 --grpo.max_completion_length=5 --train.chat_format=none --checkpoint.every_steps=0)

case $case_ in
  srun_info)
    # srun starts the ranks itself (PMIx, no mpirun): 2 ranks on one node, local ranks 0 and 1.
    out=$(srun --mpi=pmix -n 2 "$MGRL" info --runtime.backend=cpu 2>&1)
    echo "$out"
    grep -q "^rank 0/2 .*local rank 0/2 .*device CPU" <<< "$out" || fail "no line for rank 0 of 2"
    grep -q "^rank 1/2 .*local rank 1/2 .*device CPU" <<< "$out" || fail "no line for rank 1 of 2"
    grep -q "2 ranks on 1 node" <<< "$out" || fail "not 2 ranks on 1 node"
    # A singleton under srun, and mpirun inside an allocation (salloc).
    out=$(srun --mpi=pmix -n 1 "$MGRL" info --runtime.backend=cpu 2>&1)
    echo "$out"
    grep -q "^rank 0/1 .*local rank 0/1" <<< "$out" || fail "srun -n 1: not one rank"
    out=$(salloc -n 2 mpirun -n 2 --oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo "$MGRL" info --runtime.backend=cpu 2>&1)
    echo "$out"
    grep -q "^rank 1/2 .*local rank 1/2" <<< "$out" || fail "mpirun in an allocation: no rank 1 of 2" ;;

  grpo_script)
    # The 2xV100 script unchanged (the test node offers 2 GPUs of type volta to the scheduler), on the CPU. Its input's
    # reward (answer_match) reads the column "answer": the test data's completions under that name (without it the
    # reward could earn nothing: it trained on 0 until 2026-11-28, refused since).
    sed 's/"completion"/"answer"/' "$src/tests/data/sft/train.jsonl" > "$work/answers.jsonl"
    job=$(submit "$src/slurm/grpo_2xV100.sh" "${GRPO_TINY[@]}" --data.input="$work/answers.jsonl" --rollouts.every_steps=1)
    expect_done "$job" "$work/runs/mgrl-grpo-$job" 3
    ls "$work/runs/mgrl-grpo-$job/rollouts/step_00000001.h5" >/dev/null || fail "no rollouts in the run directory"
    grep -q "LoRA on 2 ranks" "$work/runs/mgrl-grpo-$job/job.log" || fail "not 2 ranks" ;;

  multinode_script)
    # N x G on the one test node: 1 node x 2 tasks (= GPUs per node).
    job=$(submit --nodes=1 --ntasks-per-node=2 --gpus-per-node=2 "$src/slurm/multinode.sh" "$src/tests/data/grpo_cli/grpo.toml" "${GRPO_TINY[@]}")
    expect_done "$job" "$work/runs/mgrl-multinode-$job" 3
    grep -q "LoRA on 2 ranks" "$work/runs/mgrl-multinode-$job/job.log" || fail "not 2 ranks" ;;

  sft_script_installed)
    # The installed script, with no MGRL and no mgrl on PATH: it must find the installed binary by itself.
    : "${MGRL_TEST_PREFIX:?}"
    [ -x "$MGRL_TEST_PREFIX/bin/mgrl" ] || fail "no installed mgrl in $MGRL_TEST_PREFIX (install fixture)"
    job=$(env -u MGRL PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin sbatch --parsable \
          "$MGRL_TEST_PREFIX/share/mgrl/slurm/sft.sh" "$src/inputs/quickstart_sft.toml" "${SFT_ARGS[@]}" --train.max_steps=3 | cut -d';' -f1)
    dir=$work/runs/mgrl-sft-$job
    expect_done "$job" "$dir" 3
    grep -q "mgrl: $MGRL_TEST_PREFIX/bin/mgrl;" "$dir/job.log" || fail "the installed script did not run the installed binary" ;;

  scaling_script)
    # perf/scaling (issue 12) from the source tree, short mode, at 1 and 2 ranks of a 2-task allocation (one srun job
    # step per rank count; 4 and 8 are skipped): the job completes, each count's output passes the harness's check
    # (every point ran, phases present, efficiency in (0, 1.5], the 2-rank one against np1's baseline), and the table
    # of both counts is written beside them.
    job=$(submit --ntasks-per-node=2 --gpus-per-node=2 "$src/slurm/scaling.sh" --short)
    wait_state "$job" "COMPLETED FAILED CANCELLED TIMEOUT" 200
    dir=$work/runs/mgrl-scaling-$job
    show_log "$dir/job.log"
    [ "$(field "$job" JobState)" = COMPLETED ] && [ "$(field "$job" ExitCode)" = 0:0 ] || fail "the scaling job failed"
    grep -q "skipping 4 GPUs: the allocation has 2 tasks" "$dir/job.log" || fail "4 GPUs not skipped"
    for n in 1 2; do
      "$src/perf/scaling" --check="$dir/np$n" --ranks=$n || fail "the output of $n rank(s) is incomplete"
    done
    [ -s "$dir/scaling.md" ] || fail "no table of both counts in $dir"
    for row in "| sft | weak | 1 |" "| sft | weak | 2 |" "| grpo | strong | 1 |" "| grpo | strong | 2 |"; do
      grep -qF "$row" "$dir/scaling.md" || fail "no row '$row' in $dir/scaling.md"
    done
    cat "$dir/scaling.md"
    # A harness that is not there: the job fails at once (exit 2), saying so, and is not requeued.
    job=$(MGRL_SCALING=/nonexistent/scaling submit --ntasks-per-node=2 --gpus-per-node=2 "$src/slurm/scaling.sh")
    wait_state "$job" "COMPLETED FAILED CANCELLED TIMEOUT" 60
    dir=$work/runs/mgrl-scaling-$job
    show_log "$dir/job.log"
    [ "$(field "$job" JobState)" = FAILED ] && [ "$(field "$job" ExitCode)" = 2:0 ] || fail "the job should fail with exit 2"
    grep -q "scaling.sh: error: the scaling harness perf/scaling was not found" "$dir/job.log" || fail "no clear message"
    [ "$(field "$job" Restarts)" = 0 ] || fail "a failed job was requeued" ;;

  failure_not_requeued)
    # mgrl fails for another reason (a user error: exit 2): the job fails and is not requeued.
    job=$(submit "$src/slurm/sft.sh" "$src/inputs/quickstart_sft.toml" "${SFT_ARGS[@]}" --train.batch_size=3)
    wait_state "$job" "COMPLETED FAILED CANCELLED" 90
    dir=$work/runs/mgrl-sft-$job
    show_log "$dir/job.log"
    [ "$(field "$job" JobState)" = FAILED ] || fail "expected FAILED, got $(field "$job" JobState)"
    [ "$(field "$job" ExitCode)" = 2:0 ] || fail "expected exit 2, got $(field "$job" ExitCode)"
    [ "$(field "$job" Restarts)" = 0 ] || fail "a failed job was requeued"
    grep -q "must be divisible by the number of ranks" "$dir/job.log" || fail "no error line"
    grep -q "mgrl failed (exit 2): not requeued" "$dir/job.log" || fail "no 'not requeued' line" ;;

  preempt_requeue_resume)
    # The same SFT run twice: straight, and signalled (scancel --signal=USR1 --batch) while it runs: mgrl checkpoints,
    # exits 3, the script requeues the job, the job resumes and ends with bitwise the same weights.
    # Enough work that the signal (about 1 s from scancel to mgrl) arrives well before the end: a step of the tiny
    # model takes about 1 ms at batch 8, so batch 32 and 2000 steps (seconds).
    steps=${MGRL_TEST_PREEMPT_STEPS:-2000}
    args=("$src/inputs/quickstart_sft.toml" "${SFT_ARGS[@]}" --train.batch_size=32 --train.max_steps="$steps"
          --checkpoint.every_steps=0 --log.every_steps=10)
    ref=$(submit --job-name=ref "$src/slurm/sft.sh" "${args[@]}")
    job=$(submit --job-name=pre "$src/slurm/sft.sh" "${args[@]}")
    dir=$work/runs/pre-$job
    for _ in $(seq 600); do  # until step 30 is done
      [ -f "$dir/metrics.jsonl" ] && grep -q '"step":30[,}]' "$dir/metrics.jsonl" && break
      sleep 0.1
    done
    grep -q '"step":30[,}]' "$dir/metrics.jsonl" || { show_log "$dir/job.log"; fail "the job did not reach step 30"; }
    scancel --signal=USR1 --batch "$job"
    echo "signalled job $job (SIGUSR1 to its batch shell) after step 30"
    for _ in $(seq 300); do  # requeued: pending again, one restart
      [ "$(field "$job" Restarts)" = 1 ] && break
      sleep 0.2
    done
    [ "$(field "$job" Restarts)" = 1 ] || { show_log "$dir/job.log"; fail "job $job was not requeued ($(field "$job" JobState))"; }
    echo "job $job requeued: $(field "$job" JobState), reason $(field "$job" Reason)"
    wait_state "$job" "PENDING RUNNING COMPLETED" 30
    scontrol update JobId="$job" StartTime=now 2>/dev/null || true  # else it waits ~2 minutes (BeginTime)
    expect_done "$ref" "$work/runs/ref-$ref" "$steps"
    wait_state "$job" "COMPLETED FAILED CANCELLED" 120
    show_log "$dir/job.log"
    if [ "$(field "$job" JobState)" != COMPLETED ]; then  # seen once (2026-11-27): the second start never logged
      scontrol show job "$job" | sed 's/^/    scontrol: /'
      # what SLURM itself said about the job's second start (the cause was never seen: the logs were gone)
      grep -E "JobId=$job([^0-9]|$)|job_id[=:] *$job([^0-9]|$)" "$MGRL_TEST_STATE"/slurmctld.log "$MGRL_TEST_STATE"/slurmd.log \
        2>/dev/null | tail -n 40 | sed 's/^/    slurm log: /'
      tail -n 20 "$MGRL_TEST_STATE"/slurmd.log 2>/dev/null | sed 's/^/    slurmd.log: /'
      cat "$work/pre-$job.out" 2>/dev/null | sed 's/^/    batch output: /'
      fail "the resumed job did not complete ($(field "$job" JobState), reason $(field "$job" Reason), exit $(field "$job" ExitCode))"
    fi
    [ "$(field "$job" Restarts)" = 1 ] || fail "restarts $(field "$job" Restarts), expected 1"
    stopped=$(sed -n 's/.*stopping after step \([0-9]*\): SIGUSR1.*/\1/p' "$dir/job.log" | head -n 1)
    [ -n "$stopped" ] && [ "$stopped" -lt "$steps" ] || fail "no 'stopping after step N: SIGUSR1' before the end"
    grep -q "requeueing job $job" "$dir/job.log" || fail "no requeue line"
    grep -q "start 2 on" "$dir/job.log" || fail "the log of the second start is not appended"
    grep -q "resumed from .*step_$(printf %08d "$stopped").h5 at step $stopped" "$dir/job.log" || fail "did not resume from step $stopped"
    "$MGRL_TEST_CHECK" weights "$work/runs/ref-$ref/checkpoints/step_$(printf %08d "$steps").h5" \
                               "$dir/checkpoints/step_$(printf %08d "$steps").h5" --exact
    "$MGRL_TEST_CHECK" losses "$work/runs/ref-$ref/metrics.jsonl" "$dir/metrics.jsonl" --after="$stopped"
    echo "stopped after step $stopped of $steps, requeued, resumed: the same weights as the straight run" ;;

  *) echo "unknown case $case_"; exit 2 ;;
esac
echo "PASS: $case_"
