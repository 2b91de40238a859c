#!/usr/bin/env bash
# test_multinode.sh: mgrl across the hosts of the multi-node test SLURM (tests/slurm/multinode_cluster.sh): ranks on
# 2 nodes talking TCP between network namespaces, the batch scripts, preemption, and a node lost mid-job.
#   test_multinode.sh CASE    cases below; exit 77 (skipped) only when the cluster could not be had at all
# Environment (tests/cluster.cmake): MGRL_TEST_MN_STATE (the cluster's state directory), MGRL_TEST_BIN, MGRL_TEST_SRC,
# MGRL_TEST_WORK (scratch), MGRL_TEST_CHECK (check_train), MPIEXEC (mpirun, for the one-node reference runs).
set -euo pipefail
case_=$1
: "${MGRL_TEST_MN_STATE:?}" "${MGRL_TEST_BIN:?}" "${MGRL_TEST_SRC:?}" "${MGRL_TEST_WORK:?}" "${MGRL_TEST_CHECK:?}"
S=$MGRL_TEST_MN_STATE
if [ -f "$S/unavailable" ]; then
  echo "SKIPPED: $(cat "$S/unavailable")"
  exit 77
fi
[ -f "$S/env.sh" ] || { echo "FAIL: the multi-node test SLURM is not running (see the output of slurm.multinode.cluster_start)"; exit 1; }
# shellcheck disable=SC1091
source "$S/env.sh"
src=$MGRL_TEST_SRC
cluster=$src/tests/slurm/multinode_cluster.sh
models=$src/tests/data/models
mkdir -p "$MGRL_TEST_WORK"
work=$(mktemp -d "$MGRL_TEST_WORK/$case_.XXXXXX")
cd "$work"
export MGRL=$MGRL_TEST_BIN
fail() { echo "FAIL: $*"; exit 1; }
# The background reference runs of this script end with it (by their pids), however it ends.
trap 'for p in $(jobs -p); do pkill -TERM -P "$p" 2>/dev/null; kill "$p" 2>/dev/null || true; done' EXIT
# The cluster gone (stopped by its watcher when ctest was killed): end now rather than after every wait's limit.
alive_cluster() { [ -f "$S/env.sh" ] || fail "the multi-node test SLURM has been stopped"; }
field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
show_log() { [ -f "$1" ] && sed 's/^/    | /' "$1" || true; }
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
wait_state() {  # JOB "STATES..." [timeout]
  local job=$1 want=$2 limit=${3:-90} s=""
  for _ in $(seq $((limit * 5))); do
    alive_cluster
    s=$(field "$job" JobState)
    [[ " $want " == *" $s "* ]] && return 0
    sleep 0.2
  done
  fail "job $job is '$s' after ${limit} s, expected one of: $want"
}
submit() { sbatch --parsable "$@" | cut -d';' -f1; }
# wait_idle NODE...: until every node named is idle (a node back after a loss, or a job's nodes released).
wait_idle() {
  local n
  for _ in $(seq 300); do
    alive_cluster
    local all=1
    for n in "$@"; do [ "$(sinfo -h -n "$n" -o %t 2>/dev/null)" = idle ] || all=0; done
    [ $all = 1 ] && return 0
    sleep 0.2
  done
  sinfo -N
  fail "nodes $* are not idle after 60 s"
}
# release JOB NODE...: a requeued job may start now (else it waits ~2 minutes, BeginTime), once its nodes are idle
# and no process of its last run is left on them: a start while they still complete that run fails ("Job credential
# revoked"), and the new run reuses the step ids (and PMIx sockets) of the last.
release() {
  local job=$1 n left=""
  shift
  wait_idle "$@"
  for n in "$@"; do
    for i in $(seq 150); do
      left=$(bash "$cluster" leftovers "$S" "$n")
      [ -z "$left" ] && break
      [ "$i" = 1 ] && echo "node $n is idle but still runs $left: waiting"
      sleep 0.2
    done
    [ -z "$left" ] || fail "node $n still runs $left 30 s after it became idle"
  done
  sleep 2
  scontrol update JobId="$job" StartTime=now
}
# The rank lines of `mgrl info` on 2 nodes x 2 ranks (srun ARGS... may add a node list): both hosts, local ranks.
info_lines() {
  local out
  out=$(srun -N2 --ntasks-per-node=2 --mpi=pmix "$@" "$MGRL" info --runtime.backend=cpu 2>&1) || { echo "$out"; fail "srun mgrl info failed"; }
  grep '^rank \|ranks on' <<< "$out"
}
# One-node reference run with mpirun (4 ranks): the weights a multi-node run must reach.
reference() {  # DIR ARGS...
  local dir=$1
  shift
  env -u OMPI_MCA_btl_tcp_if_include -u OMPI_MCA_oob_tcp_if_include OMPI_MCA_btl=self,vader \
    "${MPIEXEC:-mpirun}" -n 4 --oversubscribe --mca oob_tcp_if_include lo "$MGRL" "$@" --log.dir="$dir" \
    --checkpoint.dir="$dir/checkpoints" > "$dir.out" 2>&1 || { cat "$dir.out"; fail "the one-node reference run failed"; }
}

printf 'mode = "sft"\n' > "$work/sft.toml"  # the batch scripts take an input file; everything else is on the command line
SFT=(sft --runtime.backend=cpu --runtime.threads=1 --model.path="$models/qwen2_bias_tied" --model.tokenizer="$src/inputs/quickstart"
     --data.input="$src/tests/data/sft/train.jsonl" --eval.input="$src/tests/data/sft/heldout.jsonl"
     --train.batch_size=8 --train.lr=2e-3 --lora.r=4 --lora.alpha=8 --checkpoint.resume=none)
GRPO=("$src/tests/data/grpo_cli/grpo.toml" --model.path="$models/qwen2_bias_tied" --model.tokenizer="$src/inputs/quickstart"
      --data.input="$src/tests/data/sft/train.jsonl" --runtime.threads=1)

# lost_node HOW: a 2 x 2 SFT job of slurm/multinode.sh on n1 and n2 loses n2 after a checkpoint (HOW = kill: the
# node's ranks, slurmstepd and slurmd killed; cut: its link set down). The surviving ranks end within
# runtime.comm_timeout_s with one line naming the lost ranks, their host and the operation they waited in (exit 4),
# the script requeues the job, which resumes from its last checkpoint once the node is back (slurmd started again;
# the link up again) and ends with bitwise the weights of an uninterrupted run.
# The job is held to n1,n2 (-w): SLURM 22.05.8 fails the step of a job with --gpus-per-node requeued onto another
# node set ("Invalid generic resource (gres) specification"; slurmctld: "_step_get_gres_cnt ... node offset
# invalid"), and its GPU accounting stays wrong afterwards (docs/cluster.md).
lost_node() {
  local how=$1 steps=400 every=20 tmo=6 lost=n2
  local args=(--model.path="$models/qwen2_bias_tied" --model.tokenizer="$src/inputs/quickstart" --runtime.threads=1
              --data.input="$src/tests/data/sft/train.jsonl" --train.batch_size=8 --train.lr=2e-3 --lora.r=4 --lora.alpha=8
              --train.max_steps=$steps --checkpoint.every_steps=$every --checkpoint.keep_last=0 --log.every_steps=10
              --runtime.comm_timeout_s=$tmo)
  reference "$work/ref" "$work/sft.toml" --runtime.backend=cpu "${args[@]}" --checkpoint.resume=none &
  local ref_pid=$!
  local job
  job=$(submit -w n1,n2 --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 --job-name=lost "$src/slurm/multinode.sh" \
               "$work/sft.toml" --runtime.backend=cpu "${args[@]}")
  local dir=$work/runs/lost-$job
  wait_state "$job" "RUNNING" 60
  echo "job $job runs on $(field "$job" NodeList) (batch shell on n1); node $lost will be lost ($how)"
  info_lines --jobid="$job" --overlap
  for _ in $(seq 1200); do  # until a checkpoint is written and the run has gone on past it
    alive_cluster
    [ -f "$dir/metrics.jsonl" ] && grep -q '"step":'$((every + 10))'[,}]' "$dir/metrics.jsonl" && break
    sleep 0.1
  done
  grep -q '"step":'$((every + 10))'[,}]' "$dir/metrics.jsonl" || { show_log "$dir/job.log"; fail "the job did not reach step $((every + 10))"; }
  local t0
  t0=$(now)
  if [ "$how" = kill ]; then bash "$cluster" node-kill "$S" "$lost"; else bash "$cluster" link-down "$S" "$lost"; fi
  local said=""
  for _ in $(seq 600); do
    grep -q '^mgrl: error' "$dir/job.log" && { said=$(since "$t0"); break; }
    sleep 0.05
  done
  [ -n "$said" ] || { show_log "$dir/job.log"; fail "no line from the surviving ranks 30 s after the loss"; }
  echo "the surviving ranks' line came ${said} s after node $lost was lost (runtime.comm_timeout_s = $tmo)"
  for _ in $(seq 300); do [ "$(field "$job" Restarts)" = 1 ] && break; sleep 0.2; done
  echo "the job was requeued $(since "$t0") s after the loss"
  [ "$(field "$job" Restarts)" = 1 ] || { show_log "$dir/job.log"; fail "job $job was not requeued ($(field "$job" JobState))"; }
  [ "$(echo "$said <= $tmo + 1" | bc)" = 1 ] || { show_log "$dir/job.log"; fail "the line came ${said} s after the loss, later than runtime.comm_timeout_s ($tmo s) + 1 s"; }
  [ "$(grep -c '^mgrl: error' "$dir/job.log")" = 1 ] || { show_log "$dir/job.log"; fail "not exactly one error line from the surviving ranks"; }
  local line
  line=$(grep '^mgrl: error' "$dir/job.log")
  echo "$line"
  if [ "$how" = kill ]; then
    grep -Eq "^mgrl: error: rank [23](, rank [23])? on host $lost ha(s|ve) ended \(killed, crashed or its node lost: [0-9.]+:[0-9]+ refuses connections\) while this rank waited in [a-z_.]+ #[0-9]+ \([a-z0-9]+ x [0-9]+\); ending the job$" <<< "$line" ||
      fail "the line does not name the lost ranks, host $lost and the operation"
  else
    grep -Eq "^mgrl: error: [a-z_.]+ #[0-9]+ \([a-z0-9]+ x [0-9]+\) did not complete within $tmo s \(runtime.comm_timeout_s\): rank [23](, rank [23])? on host $lost cannot be reached \(no connection to [0-9.]+:[0-9]+ within [0-9.]+ s: the node is down or its network is cut\); ending the job$" <<< "$line" ||
      fail "the line does not name the operation, the lost ranks and host $lost"
  fi
  grep -q "mgrl lost a rank or node (exit 4.*requeueing job $job" "$dir/job.log" || fail "the script did not requeue on exit 4"
  # The node comes back.
  if [ "$how" = kill ]; then
    bash "$cluster" node-start "$S" "$lost"
  else
    bash "$cluster" link-up "$S" "$lost"
    # What the cut left on the node (its slurmstepd and ranks, cut off from srun) ends once slurmctld reaches its
    # slurmd again; what is left after 20 s is killed and slurmd restarted (an admin's reboot).
    local left=""
    for _ in $(seq 100); do
      left=$(bash "$cluster" leftovers "$S" "$lost")
      [ -z "$left" ] && break
      sleep 0.2
    done
    if [ -n "$left" ]; then
      echo "left behind on the cut node 20 s after its link came back: $left; restarting the node"
      bash "$cluster" node-kill "$S" "$lost"
      bash "$cluster" node-start "$S" "$lost"
    else
      echo "the cut node's slurmstepd and ranks ended by themselves once its link was back"
    fi
  fi
  release "$job" n1 "$lost"
  wait_state "$job" "COMPLETED FAILED CANCELLED" 180
  show_log "$dir/job.log"
  [ "$(field "$job" JobState)" = COMPLETED ] || fail "the requeued job did not complete"
  local ck
  ck=$(sed -n 's/.*resumed from .*step_\([0-9]*\)\.h5 at step.*/\1/p' "$dir/job.log" | head -n 1)
  [ -n "$ck" ] || fail "the second start did not resume from a checkpoint"
  ck=$((10#$ck))
  [ "$ck" -ge "$every" ] && [ $((ck % every)) = 0 ] || fail "resumed from step $ck, not from a periodic checkpoint"
  wait "$ref_pid" || fail "the reference run failed"
  "$MGRL_TEST_CHECK" weights "$work/ref/checkpoints/step_$(printf %08d $steps).h5" "$dir/checkpoints/step_$(printf %08d $steps).h5" --exact
  "$MGRL_TEST_CHECK" losses "$work/ref/metrics.jsonl" "$dir/metrics.jsonl" --after="$ck"
  wait_idle n1 n2 n3
  echo "node $lost lost ($how) after step $((every + 10)): one line after ${said} s, requeued, resumed from step $ck once the node was back: the same weights as the uninterrupted run"
}

case $case_ in
  srun_info)
    # 2 nodes x 2 ranks under srun (PMIx): both hosts, local ranks 0 and 1 on each, the allreduce self-test over TCP.
    out=$(info_lines)
    echo "$out"
    for r in 0 1 2 3; do
      h=n$((r / 2 + 1))
      grep -q "^rank $r/4  host $h  local rank $((r % 2))/2 " <<< "$out" || fail "no line for rank $r on host $h with local rank $((r % 2))/2"
    done
    grep -q "4 ranks on 2 nodes; communicator mpi, allreduce self-test passed" <<< "$out" || fail "not 4 ranks on 2 nodes"
    # Between the nodes there is only TCP: with shared memory alone, Open MPI cannot connect the ranks of n1 and n2.
    if out=$(OMPI_MCA_btl=self,vader srun -N2 --ntasks-per-node=2 --mpi=pmix "$MGRL" info --runtime.backend=cpu 2>&1); then
      echo "$out"; fail "the ranks of two nodes reached each other without TCP"
    fi
    grep -q "unable to reach each other" <<< "$out" || { echo "$out"; fail "no 'unable to reach' from Open MPI without TCP"; }
    echo "without the TCP transport the two nodes' ranks cannot reach each other (Open MPI refuses): no shared memory across nodes"
    # 3 nodes, uneven: 3 + 1 + 2 ranks, local ranks counted per host.
    out=$(srun -N3 -n6 --distribution=arbitrary -w n1,n1,n1,n2,n3,n3 --mpi=pmix "$MGRL" info --runtime.backend=cpu 2>&1) ||
      { echo "$out"; fail "srun on 3 nodes failed"; }
    grep '^rank \|ranks on' <<< "$out"
    for spec in "0 n1 0/3" "2 n1 2/3" "3 n2 0/1" "4 n3 0/2" "5 n3 1/2"; do
      read -r r h l <<< "$spec"
      grep -q "^rank $r/6  host $h  local rank $l " <<< "$out" || fail "rank $r: not on $h with local rank $l"
    done
    grep -q "6 ranks on 3 nodes" <<< "$out" || fail "not 6 ranks on 3 nodes" ;;

  sft_same_weights)
    # srun -N 2 --ntasks-per-node=2 against the one-node 4-rank run (mpirun): the same weights (the rank-count tests'
    # tolerance; bitwise in practice, the reduction order being the same).
    info_lines
    reference "$work/np4" "${SFT[@]}" --train.max_steps=4 --train.grad_accum=2
    srun -N2 --ntasks-per-node=2 --mpi=pmix "$MGRL" "${SFT[@]}" --train.max_steps=4 --train.grad_accum=2 \
      --log.dir="$work/mn" --checkpoint.dir="$work/mn/checkpoints" > "$work/mn.out" 2>&1 || { cat "$work/mn.out"; fail "the 2-node run failed"; }
    grep "^sft: " "$work/mn.out"
    grep -q "LoRA on 4 ranks" "$work/mn.out" || fail "not 4 ranks"
    "$MGRL_TEST_CHECK" weights "$work/mn/checkpoints/step_00000004.h5" "$work/np4/checkpoints/step_00000004.h5" --rtol=1e-5 ;;

  grpo_same_weights)
    info_lines
    reference "$work/np4" grpo "${GRPO[@]}"
    srun -N2 --ntasks-per-node=2 --mpi=pmix "$MGRL" grpo "${GRPO[@]}" --log.dir="$work/mn" --checkpoint.dir="$work/mn/checkpoints" \
      > "$work/mn.out" 2>&1 || { cat "$work/mn.out"; fail "the 2-node run failed"; }
    grep "^grpo: " "$work/mn.out" || true
    grep -q "on 4 ranks" "$work/mn.out" || fail "not 4 ranks"
    "$MGRL_TEST_CHECK" weights "$work/mn/checkpoints/step_00000004.h5" "$work/np4/checkpoints/step_00000004.h5" --rtol=1e-5 ;;

  script_as_written)
    # slurm/multinode.sh with its own #SBATCH lines (2 nodes x 4 tasks, 4 GPUs a node, exclusive): GRPO on 8 ranks,
    # a checkpoint after every step, written with the ranks of both nodes.
    info_lines --ntasks-per-node=4  # the script's layout (the job itself is over in seconds)
    job=$(submit "$src/slurm/multinode.sh" "${GRPO[@]}" --train.batch_size=8 --train.max_steps=3 --checkpoint.every_steps=1)
    dir=$work/runs/mgrl-multinode-$job
    wait_state "$job" "COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL" 240
    show_log "$dir/job.log"
    [ "$(field "$job" JobState)" = COMPLETED ] && [ "$(field "$job" ExitCode)" = 0:0 ] || fail "the job did not complete"
    grep -q "2 node(s), 8 task(s)" "$dir/job.log" || fail "not 2 nodes x 4 tasks"
    grep -q "on 8 ranks" "$dir/job.log" || fail "not 8 ranks"
    for s in 1 2 3; do "$MGRL_TEST_CHECK" read "$dir/checkpoints/step_0000000$s.h5" || fail "the checkpoint of step $s does not read back"; done ;;

  preempt_requeue_resume)
    # The 2 x 2 job of multinode.sh signalled (scancel --signal=USR1 --batch) while it runs: SIGUSR1 reaches the ranks
    # of both nodes through srun, they agree on the step, checkpoint, exit 3; the script requeues; the job resumes
    # on the same nodes (-w: see lost_node) and ends with bitwise the weights of the uninterrupted one-node run.
    steps=500
    args=(--runtime.backend=cpu --runtime.threads=1 --model.path="$models/qwen2_bias_tied" --model.tokenizer="$src/inputs/quickstart"
          --data.input="$src/tests/data/sft/train.jsonl" --train.batch_size=8 --train.lr=2e-3 --lora.r=4 --lora.alpha=8
          --train.max_steps=$steps --checkpoint.every_steps=0 --log.every_steps=10)
    reference "$work/ref" "$work/sft.toml" "${args[@]}" --checkpoint.resume=none &
    ref_pid=$!
    job=$(submit -w n1,n2 --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 --job-name=pre "$src/slurm/multinode.sh" \
                 "$work/sft.toml" "${args[@]}")
    dir=$work/runs/pre-$job
    wait_state "$job" "RUNNING" 60
    info_lines --jobid="$job" --overlap
    for _ in $(seq 1200); do
      alive_cluster
      [ -f "$dir/metrics.jsonl" ] && grep -q '"step":30[,}]' "$dir/metrics.jsonl" && break
      sleep 0.1
    done
    grep -q '"step":30[,}]' "$dir/metrics.jsonl" || { show_log "$dir/job.log"; fail "the job did not reach step 30"; }
    scancel --signal=USR1 --batch "$job"
    for _ in $(seq 300); do [ "$(field "$job" Restarts)" = 1 ] && break; sleep 0.2; done
    [ "$(field "$job" Restarts)" = 1 ] || { show_log "$dir/job.log"; fail "job $job was not requeued"; }
    wait_state "$job" "PENDING" 30
    release "$job" n1 n2
    wait_state "$job" "COMPLETED FAILED CANCELLED" 180
    show_log "$dir/job.log"
    [ "$(field "$job" JobState)" = COMPLETED ] || { scontrol show job "$job"; tail -n 30 "$S"/slurmctld.log; fail "the resumed job did not complete"; }
    stopped=$(sed -n 's/.*stopping after step \([0-9]*\): SIGUSR1.*/\1/p' "$dir/job.log" | head -n 1)
    [ -n "$stopped" ] && [ "$stopped" -lt "$steps" ] || fail "no 'stopping after step N: SIGUSR1' before the end"
    grep -q "resumed from .*step_$(printf %08d "$stopped").h5 at step $stopped" "$dir/job.log" || fail "did not resume from step $stopped"
    wait "$ref_pid" || fail "the reference run failed"
    "$MGRL_TEST_CHECK" weights "$work/ref/checkpoints/step_$(printf %08d $steps).h5" "$dir/checkpoints/step_$(printf %08d $steps).h5" --exact
    "$MGRL_TEST_CHECK" losses "$work/ref/metrics.jsonl" "$dir/metrics.jsonl" --after="$stopped"
    echo "stopped after step $stopped of $steps on 2 nodes, requeued, resumed: the same weights as the straight run" ;;

  rank_stopped)
    # The ranks of n2 stopped (SIGSTOP) in a 2 x 2 srun job: their probe ports accept but nobody answers, and at
    # runtime.comm_timeout_s one line names the operation, the ranks and their host as not answering; exit 1 (a hang,
    # not a lost node: the batch scripts would not requeue it).
    tmo=4
    info_lines -w n1,n2
    rm -rf "$work/stop"
    srun -w n1,n2 -N2 --ntasks-per-node=2 --mpi=pmix "$MGRL" "${SFT[@]}" --train.max_steps=100000 --checkpoint.every_steps=0 \
      --runtime.comm_timeout_s=$tmo --log.every_steps=10 --log.dir="$work/stop" > "$work/stop.out" 2>&1 &
    srun_pid=$!
    for _ in $(seq 600); do
      [ -f "$work/stop/metrics.jsonl" ] && grep -q '"step":20[,}]' "$work/stop/metrics.jsonl" && break
      sleep 0.1
    done
    grep -q '"step":20[,}]' "$work/stop/metrics.jsonl" || { cat "$work/stop.out"; fail "the job did not reach step 20"; }
    pids=$(bash "$cluster" leftovers "$S" n2 | grep -o 'mgrl (pid [0-9]*)' | grep -o '[0-9]*')
    [ "$(wc -w <<< "$pids")" = 2 ] || fail "not 2 ranks on n2: $pids"
    # shellcheck disable=SC2086
    kill -STOP $pids
    t0=$(now)
    rc=0
    wait "$srun_pid" || rc=$?
    secs=$(since "$t0")
    for p in $pids; do kill -CONT "$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
    grep -v '^step ' "$work/stop.out"
    echo "srun exit $rc, ${secs} s after the ranks of n2 were stopped (runtime.comm_timeout_s = $tmo)"
    [ "$(grep -c '^mgrl: error' "$work/stop.out")" = 1 ] || fail "not exactly one error line"
    grep -Eq "^mgrl: error: [a-z_.]+ #[0-9]+ \([a-z0-9]+ x [0-9]+\) did not complete within $tmo s \(runtime.comm_timeout_s\): rank 2, rank 3 on host n2 do not answer \(the process is stopped or hung\); ending the job$" "$work/stop.out" ||
      fail "the line does not name the operation, ranks 2, 3 and host n2 as not answering"
    [ "$rc" = 1 ] || fail "srun exit $rc, expected 1 (nothing was lost)"
    [ "$(echo "$secs < $tmo + 12" | bc)" = 1 ] || fail "srun ended ${secs} s after the stop" ;;

  node_killed) lost_node kill ;;
  link_cut) lost_node cut ;;

  *) echo "unknown case $case_"; exit 2 ;;
esac
echo "PASS: $case_"
