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
# Open MPI's start-up crash (docs/reliability.md, "A rank lost during MPI's start-up"): on a loaded machine a rank of a
# multi-node start-up can, rarely (about 1 in 500 loaded 3-node start-ups here), die inside MPI_Init (mca_btl_tcp.so);
# mgrl reports it ("... during MPI start-up ...") and ends with exit code 4, which the batch scripts requeue. The tests
# do what the scripts do, and only for that report: a direct srun runs once more (msrun), a batch job requeued for it
# is released at once (startup_requeue). Each occurrence is printed (NOTE) with the report; a second one in a test
# fails it. Everything else that fails still fails the test.
export MGRL_STARTUP_TIMEOUT_S=30  # ranks still inside MPI_Init when another crashed end within 30 s, not 300
crashes=0     # start-ups of this test ended by that crash (each may have several ranks' reports)
crash_requeues=0  # requeues of the batch job under test caused by them (its expected Restarts count shifts by these)
crash_seen=0  # the bytes of the batch job's log already looked at for crash reports
startup_crashes_in() { grep -c "during MPI start-up" "$1" 2>/dev/null || true; }
note_startup_crash() {  # LOG [OFFSET]: the reports in LOG after byte OFFSET
  crashes=$((crashes + 1))
  echo "NOTE: Open MPI's start-up crash (docs/reliability.md) ended a start-up of this test; the report:"
  tail -c +$((${2:-0} + 1)) "$1" | grep -A 16 "during MPI start-up" | sed 's/^/    | /'
  [ "$crashes" -le 1 ] || fail "a second start-up crash in one test"
}
# msrun OUT SRUN_ARGS...: `srun -K SRUN_ARGS > OUT 2>&1` (-K: the step ends as soon as a rank exits non-zero); once
# more when the first try ended with a start-up crash report. MSRUN_FIRST_FAULT: an MGRL_FAULT_INJECT for the first
# try only (srun_info checks this path with an injected crash). Returns srun's exit status.
msrun() {
  local out=$1 rc=0
  shift
  MGRL_FAULT_INJECT=${MSRUN_FIRST_FAULT:-${MGRL_FAULT_INJECT:-}} srun -K "$@" > "$out" 2>&1 || rc=$?
  if [ "$rc" != 0 ] && [ "$(startup_crashes_in "$out")" != 0 ]; then
    note_startup_crash "$out"
    echo "NOTE: srun exit $rc; running it once more, as the batch scripts' requeue would"
    rc=0
    srun -K "$@" > "$out" 2>&1 || rc=$?
  fi
  return "$rc"
}
# startup_requeue JOB LOG NODE...: true, after releasing JOB on NODEs, when JOB is pending again because a start of
# it ended with a start-up crash not yet handled (LOG: its job.log); false otherwise.
startup_requeue() {
  local job=$1 log=$2
  shift 2
  [ "$(field "$job" JobState)" = PENDING ] || return 1
  [ "$(field "$job" Restarts)" -gt "$crash_requeues" ] || return 1
  local size
  size=$(stat -c %s "$log" 2>/dev/null || echo 0)
  # (grep reads a process substitution: `tail | grep -q` under pipefail fails when grep stops at its match while tail
  # still has output, tail dying of SIGPIPE)
  grep -q "during MPI start-up" < <(tail -c +$((crash_seen + 1)) "$log" 2>/dev/null) || return 1
  note_startup_crash "$log" "$crash_seen"
  crash_seen=$size
  crash_requeues=$((crash_requeues + 1))
  echo "NOTE: job $job was requeued for it (restart $crash_requeues); releasing it"
  release "$job" "$@"
}
# wait_step JOB DIR STEP NODE...: until DIR/metrics.jsonl has STEP (a requeue for a start-up crash released and
# waited through); fails after 120 s of running without it.
wait_step() {
  local job=$1 dir=$2 step=$3
  shift 3
  local t=0
  while [ "$t" -lt 1200 ]; do
    alive_cluster
    [ -f "$dir/metrics.jsonl" ] && grep -q '"step":'"$step"'[,}]' "$dir/metrics.jsonl" && return 0
    if startup_requeue "$job" "$dir/job.log" "$@"; then t=0; wait_state "$job" RUNNING 60; continue; fi
    sleep 0.1
    t=$((t + 1))
  done
  show_log "$dir/job.log"
  fail "the job did not reach step $step"
}
# wait_end JOB DIR LIMIT NODE...: until JOB has ended (COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL), releasing it
# when it was requeued for a start-up crash.
wait_end() {
  local job=$1 dir=$2 limit=$3 s=""
  shift 3
  for _ in $(seq $((limit * 5))); do
    alive_cluster
    s=$(field "$job" JobState)
    [[ " COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL " == *" $s "* ]] && return 0
    startup_requeue "$job" "$dir/job.log" "$@" || sleep 0.2
  done
  fail "job $job is '$s' after ${limit} s, expected it to have ended"
}
# The rank lines of `mgrl info` on 2 nodes x 2 ranks (srun ARGS... may add a node list): both hosts, local ranks.
info_lines() {
  local out=$work/info.$$.out
  msrun "$out" -N2 --ntasks-per-node=2 --mpi=pmix "$@" "$MGRL" info --runtime.backend=cpu || { cat "$out"; fail "srun mgrl info failed"; }
  grep '^rank \|ranks on' "$out"
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
  wait_step "$job" "$dir" $((every + 10)) n1 n2  # until a checkpoint is written and the run has gone on past it
  local t0 log0 restarts=$((crash_requeues + 1))
  log0=$(wc -l < "$dir/job.log")  # what the job logs from the loss on: $dir/after.log
  t0=$(now)
  if [ "$how" = kill ]; then bash "$cluster" node-kill "$S" "$lost"; else bash "$cluster" link-down "$S" "$lost"; fi
  local said=""
  for _ in $(seq 600); do
    tail -n +$((log0 + 1)) "$dir/job.log" > "$dir/after.log"
    grep -q '^mgrl: error' "$dir/after.log" && { said=$(since "$t0"); break; }
    sleep 0.05
  done
  [ -n "$said" ] || { show_log "$dir/job.log"; fail "no line from the surviving ranks 30 s after the loss"; }
  echo "the surviving ranks' line came ${said} s after node $lost was lost (runtime.comm_timeout_s = $tmo)"
  for _ in $(seq 300); do [ "$(field "$job" Restarts)" = "$restarts" ] && break; sleep 0.2; done
  echo "the job was requeued $(since "$t0") s after the loss"
  [ "$(field "$job" Restarts)" = "$restarts" ] || { show_log "$dir/job.log"; fail "job $job was not requeued ($(field "$job" JobState))"; }
  tail -n +$((log0 + 1)) "$dir/job.log" > "$dir/after.log"
  [ "$(echo "$said <= $tmo + 1" | bc)" = 1 ] || { show_log "$dir/job.log"; fail "the line came ${said} s after the loss, later than runtime.comm_timeout_s ($tmo s) + 1 s"; }
  [ "$(grep -c '^mgrl: error' "$dir/after.log")" = 1 ] || { show_log "$dir/job.log"; fail "not exactly one error line from the surviving ranks"; }
  local line
  line=$(grep '^mgrl: error' "$dir/after.log")
  echo "$line"
  if [ "$how" = kill ]; then
    grep -Eq "^mgrl: error: rank [23](, rank [23])? on host $lost ha(s|ve) ended \(killed, crashed or its node lost: [0-9.]+:[0-9]+ refuses connections\) while this rank waited in [a-z_.]+ #[0-9]+ \([a-z0-9]+ x [0-9]+\); ending the job$" <<< "$line" ||
      fail "the line does not name the lost ranks, host $lost and the operation"
  else
    grep -Eq "^mgrl: error: [a-z_.]+ #[0-9]+ \([a-z0-9]+ x [0-9]+\) did not complete within $tmo s \(runtime.comm_timeout_s\): rank [23](, rank [23])? on host $lost cannot be reached \(no connection to [0-9.]+:[0-9]+ within [0-9.]+ s: the node is down or its network is cut\); ending the job$" <<< "$line" ||
      fail "the line does not name the operation, the lost ranks and host $lost"
  fi
  grep -q "mgrl lost a rank or node (exit 4.*requeueing job $job" "$dir/after.log" || fail "the script did not requeue on exit 4"
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
  wait_end "$job" "$dir" 180 n1 "$lost"
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
    info_lines > "$work/info_lines.out"
    out=$(cat "$work/info_lines.out")
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
    msrun "$work/n3.out" -N3 -n6 --distribution=arbitrary -w n1,n1,n1,n2,n3,n3 --mpi=pmix "$MGRL" info --runtime.backend=cpu ||
      { cat "$work/n3.out"; fail "srun on 3 nodes failed"; }
    out=$(cat "$work/n3.out")
    grep '^rank \|ranks on' <<< "$out"
    for spec in "0 n1 0/3" "2 n1 2/3" "3 n2 0/1" "4 n3 0/2" "5 n3 1/2"; do
      read -r r h l <<< "$spec"
      grep -q "^rank $r/6  host $h  local rank $l " <<< "$out" || fail "rank $r: not on $h with local rank $l"
    done
    grep -q "6 ranks on 3 nodes" <<< "$out" || fail "not 6 ranks on 3 nodes"
    # The tests' answer to Open MPI's start-up crash, itself checked: rank 3 (alone on n2) crashes in the start-up on
    # the first try (injected); msrun reports it, the step ends at once (srun -K), and the second try passes.
    [ "$crashes" = 0 ] || { echo "(a real start-up crash was met above: the injected one is not tried)"; echo "PASS: $case_"; exit 0; }
    t0=$(now)
    MSRUN_FIRST_FAULT=startup:rank=3:step=0:action=segv msrun "$work/retry.out" -N3 -n6 --distribution=arbitrary \
      -w n1,n1,n1,n2,n3,n3 --mpi=pmix "$MGRL" info --runtime.backend=cpu > "$work/retry.note" ||
      { cat "$work/retry.note" "$work/retry.out"; fail "the srun after an injected start-up crash failed"; }
    secs=$(since "$t0")
    cat "$work/retry.note"
    grep -q "^    | mgrl: rank 3 on host n2 (pid [0-9]*): SIGSEGV (invalid memory access) at address 0x0 during MPI start-up " "$work/retry.note" ||
      fail "msrun did not show the injected crash's report"
    grep -q "running it once more" "$work/retry.note" || fail "msrun did not run srun once more"
    grep -q "6 ranks on 3 nodes" "$work/retry.out" || fail "the second try did not pass"
    [ "$(echo "$secs < 30" | bc)" = 1 ] || fail "the crash and the second try took ${secs} s"
    echo "an injected start-up crash of rank 3: reported, the step ended, the second try passed (${secs} s in all)" ;;

  sft_same_weights)
    # srun -N 2 --ntasks-per-node=2 against the one-node 4-rank run (mpirun): the same weights (the rank-count tests'
    # tolerance; bitwise in practice, the reduction order being the same).
    info_lines
    reference "$work/np4" "${SFT[@]}" --train.max_steps=4 --train.grad_accum=2
    msrun "$work/mn.out" -N2 --ntasks-per-node=2 --mpi=pmix "$MGRL" "${SFT[@]}" --train.max_steps=4 --train.grad_accum=2 \
      --log.dir="$work/mn" --checkpoint.dir="$work/mn/checkpoints" || { cat "$work/mn.out"; fail "the 2-node run failed"; }
    grep "^sft: " "$work/mn.out"
    grep -q "LoRA on 4 ranks" "$work/mn.out" || fail "not 4 ranks"
    "$MGRL_TEST_CHECK" weights "$work/mn/checkpoints/step_00000004.h5" "$work/np4/checkpoints/step_00000004.h5" --rtol=1e-5 ;;

  grpo_same_weights)
    info_lines
    reference "$work/np4" grpo "${GRPO[@]}"
    msrun "$work/mn.out" -N2 --ntasks-per-node=2 --mpi=pmix "$MGRL" grpo "${GRPO[@]}" --log.dir="$work/mn" \
      --checkpoint.dir="$work/mn/checkpoints" || { cat "$work/mn.out"; fail "the 2-node run failed"; }
    grep "^grpo: " "$work/mn.out" || true
    grep -q "on 4 ranks" "$work/mn.out" || fail "not 4 ranks"
    "$MGRL_TEST_CHECK" weights "$work/mn/checkpoints/step_00000004.h5" "$work/np4/checkpoints/step_00000004.h5" --rtol=1e-5 ;;

  slow_generation_remote)
    # Rank 1, alone on n2, generates far slower than rank 0 on n1 (MGRL_FAULT_INJECT=generate_step: 1.5 s a step, ~9 s
    # a round) at runtime.comm_timeout_s = 4: rank 0 sees its progress only through the probe of n2 (dist/peers.h),
    # waits while it moves, says so once, and the job ends well (it ended at the timeout, exit 1, before 2026-11-28).
    # Then the same rank stopped for good inside its generation (one step of 40 s): the job ends with one line.
    info_lines -w n1,n2
    t0=$(now)
    MGRL_FAULT_INJECT=generate_step:rank=1:step=0:count=1000000:action=sleep:secs=1.5 msrun "$work/slow.out" -w n1,n2 -N2 \
      --ntasks-per-node=1 --mpi=pmix "$MGRL" grpo "${GRPO[@]}" --train.max_steps=2 --runtime.comm_timeout_s=4 \
      --generate.sync_interval=1 --checkpoint.dir= --log.dir="$work/slow" || { cat "$work/slow.out"; fail "the slow-generation run failed"; }
    echo "slow generation on n2: $(since "$t0") s"
    grep '^mgrl' "$work/slow.out" || true
    grep -q "^step 2/2 " "$work/slow.out" || fail "no step 2/2"
    grep -q "^mgrl: warning: rank 0 has waited in .* past runtime.comm_timeout_s (4 s), while rank 1, generating, still makes progress" "$work/slow.out" ||
      fail "no line saying rank 0 waits for rank 1's generation"
    rc=0
    t0=$(now)
    MGRL_FAULT_INJECT=generate_step:rank=1:step=2:action=sleep:secs=40 srun -K -w n1,n2 -N2 --ntasks-per-node=1 --mpi=pmix \
      "$MGRL" grpo "${GRPO[@]}" --train.max_steps=2 --runtime.comm_timeout_s=4 --generate.sync_interval=1 --checkpoint.dir= \
      --log.dir="$work/stall" > "$work/stall.out" 2>&1 || rc=$?
    secs=$(since "$t0")
    grep '^mgrl' "$work/stall.out" || true
    echo "stalled generation on n2: srun exit $rc after ${secs} s"
    [ "$rc" != 0 ] || fail "the job with a stalled rank succeeded"
    [ "$(grep -c '^mgrl: error' "$work/stall.out")" = 1 ] || fail "not exactly one error line"
    grep -q "^mgrl: error: .* did not complete within 4 s (runtime.comm_timeout_s)" "$work/stall.out" || fail "no timeout line"
    [ "$(echo "$secs < 30" | bc)" = 1 ] || fail "the stalled job took ${secs} s to end" ;;

  script_as_written)
    # slurm/multinode.sh with its own #SBATCH lines (2 nodes x 4 tasks, 4 GPUs a node, exclusive): GRPO on 8 ranks,
    # a checkpoint after every step, written with the ranks of both nodes.
    info_lines --ntasks-per-node=4  # the script's layout (the job itself is over in seconds)
    job=$(submit "$src/slurm/multinode.sh" "${GRPO[@]}" --train.batch_size=8 --train.max_steps=3 --checkpoint.every_steps=1 \
                 --runtime.comm_timeout_s=60)
    dir=$work/runs/mgrl-multinode-$job
    wait_end "$job" "$dir" 240 n1 n2 n3
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
          --train.max_steps=$steps --checkpoint.every_steps=0 --log.every_steps=10 --runtime.comm_timeout_s=60)
    reference "$work/ref" "$work/sft.toml" "${args[@]}" --checkpoint.resume=none &
    ref_pid=$!
    job=$(submit -w n1,n2 --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 --job-name=pre "$src/slurm/multinode.sh" \
                 "$work/sft.toml" "${args[@]}")
    dir=$work/runs/pre-$job
    wait_state "$job" "RUNNING" 60
    wait_step "$job" "$dir" 30 n1 n2
    scancel --signal=USR1 --batch "$job"
    restarts=$((crash_requeues + 1))
    for _ in $(seq 300); do [ "$(field "$job" Restarts)" = "$restarts" ] && break; sleep 0.2; done
    [ "$(field "$job" Restarts)" = "$restarts" ] || { show_log "$dir/job.log"; fail "job $job was not requeued"; }
    wait_state "$job" "PENDING" 30
    release "$job" n1 n2
    wait_end "$job" "$dir" 180 n1 n2
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
    for try in 1 2; do  # a second try only after a start-up crash
      rm -rf "$work/stop"
      srun -w n1,n2 -N2 --ntasks-per-node=2 --mpi=pmix "$MGRL" "${SFT[@]}" --train.max_steps=100000 --checkpoint.every_steps=0 \
        --runtime.comm_timeout_s=$tmo --log.every_steps=10 --log.dir="$work/stop" > "$work/stop.out" 2>&1 &
      srun_pid=$!
      for _ in $(seq 600); do
        [ -f "$work/stop/metrics.jsonl" ] && grep -q '"step":20[,}]' "$work/stop/metrics.jsonl" && break
        kill -0 "$srun_pid" 2>/dev/null || break
        sleep 0.1
      done
      [ -f "$work/stop/metrics.jsonl" ] && grep -q '"step":20[,}]' "$work/stop/metrics.jsonl" && break
      kill -0 "$srun_pid" 2>/dev/null && break
      [ "$try" = 1 ] && [ "$(startup_crashes_in "$work/stop.out")" != 0 ] || break
      wait "$srun_pid" || true
      note_startup_crash "$work/stop.out"
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

  startup_crash_requeued)
    # A rank that crashes in MPI's start-up in a batch job (injected: rank 1 at every start, as Open MPI's TCP
    # transport can): SLURM's PMIx plugin then cancels the step's other tasks and srun returns their 137, not 4;
    # slurm/common.sh still finds the task's exit code 4 in srun's lines, requeues the job once (MGRL_MAX_REQUEUES=1)
    # and then gives up with exit 4. Without that, srun's 137 would fail the job at the first crash.
    job=$(MGRL_MAX_REQUEUES=1 MGRL_FAULT_INJECT=startup:rank=1:step=0:action=segv MGRL_STARTUP_TIMEOUT_S=20 \
          submit -w n1,n2 --nodes=2 --ntasks-per-node=2 --job-name=crash "$src/slurm/multinode.sh" "$work/sft.toml" \
          "${SFT[@]}" --train.max_steps=4)
    dir=$work/runs/crash-$job
    for _ in $(seq 300); do
      alive_cluster
      [ "$(field "$job" Restarts)" = 1 ] && [ "$(field "$job" JobState)" = PENDING ] && break
      sleep 0.2
    done
    [ "$(field "$job" Restarts)" = 1 ] || { show_log "$dir/job.log"; fail "job $job was not requeued after the crash"; }
    release "$job" n1 n2
    wait_state "$job" "COMPLETED FAILED CANCELLED" 120
    show_log "$dir/job.log"
    [ "$(field "$job" JobState)" = FAILED ] && [ "$(field "$job" ExitCode)" = 4:0 ] ||
      fail "job $job is $(field "$job" JobState) with exit code $(field "$job" ExitCode), expected FAILED with 4"
    # Each start has a crash report; the first start's is the injected one (rank 1, a null call, after MPI_Init).
    # A start may also meet Open MPI's own start-up crash before it (seen here at a second start: ranks 0 and 1 in
    # mca_btl_tcp.so inside MPI_Init; then every task exits 4, rank 2 and 3 by the start-up deadline, and srun
    # returns 4 itself), so the second start is not required to show the 137.
    [ "$(grep -c '^mgrl: rank [0-3] on host n[12] (pid [0-9]*): SIGSEGV (invalid memory access) at address 0x0 during MPI start-up ' "$dir/job.log")" -ge 2 ] ||
      fail "not a crash report at each start"
    grep -q '^mgrl: rank 1 on host n1 (pid [0-9]*): SIGSEGV (invalid memory access) at address 0x0 during MPI start-up ' "$dir/job.log" ||
      fail "no report of the injected crash"
    [ "$(grep -c 'srun ended with exit 137 after a task exited with code 4 .*: taken as exit 4$' "$dir/job.log")" -ge 1 ] ||
      fail "the script did not take srun's 137 after the task's exit 4 as exit 4"
    [ "$(grep -c "mgrl lost a rank or node (exit 4; " "$dir/job.log")" = 2 ] || fail "not two starts ended as exit 4"
    grep -q "mgrl lost a rank or node (exit 4; .*requeueing job $job (restart 1)$" "$dir/job.log" || fail "not requeued once"
    grep -q "mgrl lost a rank or node (exit 4; .*already requeued 1 times (MGRL_MAX_REQUEUES): not requeued$" "$dir/job.log" ||
      fail "not given up after MGRL_MAX_REQUEUES"
    echo "a rank crashed in MPI's start-up at both starts: srun's code taken as exit 4, requeued once, then given up" ;;

  node_killed) lost_node kill ;;
  link_cut) lost_node cut ;;

  *) echo "unknown case $case_"; exit 2 ;;
esac
echo "PASS: $case_"
