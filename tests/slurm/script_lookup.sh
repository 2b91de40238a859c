#!/usr/bin/env bash
# script_lookup.sh SRC WORK: the batch scripts of slurm/ find common.sh through `scontrol show job` (sbatch runs a
# copy of the script from slurmd's spool), and an scontrol that fails (slurmctld busy, as right after a requeue) is
# asked again: the job starts and logs. Until 2026-11-28 one failed scontrol ended the job with exit 1 under
# `set -e` and nothing logged (slurm.preempt_requeue_resume's requeued start, seen twice under load). Stubs stand in
# for scontrol and srun; no SLURM is needed. Each script is run as sbatch runs it: a copy in another directory.
set -uo pipefail
src=$1 work=$2
rm -rf "$work" && mkdir -p "$work/bin" "$work/spool" && cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
for script in sft.sh grpo_2xV100.sh scaling.sh multinode.sh; do
  rm -f "$work/calls" && : > "$work/srun_args"
  # scontrol: fails on its first call, then names the original script.
  cat > bin/scontrol <<STUB
#!/bin/bash
n=\$(cat "$work/calls" 2>/dev/null || echo 0); echo \$((n + 1)) > "$work/calls"
[ "\$1 \$2" = "show job" ] || exit 0
[ "\$n" -ge 1 ] || { echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2; exit 1; }
echo "   Command=$src/slurm/$script"
STUB
  printf '#!/bin/bash\necho "$@" >> "%s/srun_args"\nexit 0\n' "$work" > bin/srun
  chmod +x bin/scontrol bin/srun
  cp "$src/slurm/$script" spool/slurm_script
  rc=0
  out=$(env -u MGRL_SLURM_DIR PATH="$work/bin:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NAME=lookup MGRL=/bin/true \
        MGRL_RUN_DIR="$work/run_$script" MGRL_REQUEUE=0 bash spool/slurm_script 2>&1) || rc=$?
  [ "$(cat "$work/calls")" -ge 2 ] || fail "$script: scontrol was not asked again ($(cat "$work/calls") calls)"
  [ -f "$work/run_$script/job.log" ] || fail "$script: exit $rc, no job.log: $out"
  grep -q "job 4242 (lookup) start 1" "$work/run_$script/job.log" || fail "$script: $(cat "$work/run_$script/job.log")"
  [ -s "$work/srun_args" ] || fail "$script: srun never ran (exit $rc): $(tail -n 5 "$work/run_$script/job.log")"
  echo "$script: scontrol failed once, asked again; started and logged (exit $rc)"
done
echo "PASS: script lookup"
