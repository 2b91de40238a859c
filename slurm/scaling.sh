#!/bin/bash
# scaling.sh: the scaling harness (perf/scaling, issue 12) at 1, 2, 4 and 8 GPUs of one allocation (one node with
# 8 GPUs), one rank per GPU: each count runs as its own job step of that many tasks.
#   sbatch slurm/scaling.sh                          every count of MGRL_SCALING_GPUS (default "1 2 4 8")
#   sbatch slurm/scaling.sh --input=my_grpo.toml     arguments after the script go to the harness unchanged
# The harness is called once per GPU count N as
#   perf/scaling --mgrl=<mgrl binary> --ranks=N --launcher="srun --mpi=pmix --ntasks=N --exact" --out=<run dir>/np<N> [ARGS...]
# and is found at $MGRL_SCALING, else beside the binary (build/perf/scaling, <prefix>/bin/mgrl-scaling), else in the
# source tree (perf/scaling). When it is missing the job fails at once (exit 2) saying so.
#SBATCH --job-name=mgrl-scaling
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --mem-per-cpu=4G
#SBATCH --exclusive
#SBATCH --time=01:00:00
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
##SBATCH --partition=gpu
##SBATCH --account=myproject
# Typed GPU requests for sites that need them: --gpus-per-node=a100:8, --gres=gpu:volta:8.

# ---- Site: modules (edit). ----
if command -v module >/dev/null 2>&1; then
  # module load gcc/12.2.0 openmpi/4.1.4 cuda/12.4 nccl/2.21
  module load mgrl 2>/dev/null || true
fi
# ---- NCCL: see grpo_2xV100.sh and docs/cluster.md. ----
# export NCCL_DEBUG=WARN

set -euo pipefail
# sbatch runs a copy of this file: the job record names the original, beside which common.sh sits.
# Asked again while slurmctld is too busy to answer (right after a requeue); a failed `scontrol` ended the job with
# exit 1 under `set -e` and nothing logged, until 2026-11-28.
self=
for _ in 1 2 3 4 5 6; do
  { [ -z "${MGRL_SLURM_DIR:-}" ] && [ -n "${SLURM_JOB_ID:-}" ] && command -v scontrol > /dev/null; } || break
  self=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=\([^ ]*\).*/\1/p' | head -n 1) || self=
  [ -z "$self" ] || break
  sleep 5
done
MGRL_SLURM_DIR=${MGRL_SLURM_DIR:-$(cd "$(dirname "${self:-$0}")" && pwd)}
[ -f "$MGRL_SLURM_DIR/common.sh" ] || { echo "mgrl-job: error: $MGRL_SLURM_DIR/common.sh not found (scontrol named" \
  "no script for job ${SLURM_JOB_ID:-none}): set MGRL_SLURM_DIR to mgrl's slurm directory" >&2; exit 2; }
# shellcheck source=slurm/common.sh
source "$MGRL_SLURM_DIR/common.sh"

mgrl_job_init
harness=${MGRL_SCALING:-}
if [ -z "$harness" ]; then
  bindir=$(dirname "$MGRL")
  for c in "$bindir/perf/scaling" "$bindir/mgrl-scaling" "$MGRL_SLURM_DIR/../perf/scaling"; do
    if [ -f "$c" ] && [ -x "$c" ]; then harness=$c; break; fi
  done
fi
if [ -z "$harness" ] || [ ! -x "$harness" ]; then
  echo "scaling.sh: error: the scaling harness perf/scaling was not found (it comes with issue 12); looked at" \
       "\$MGRL_SCALING, $(dirname "$MGRL")/perf/scaling, $(dirname "$MGRL")/mgrl-scaling and" \
       "$MGRL_SLURM_DIR/../perf/scaling; build it or set MGRL_SCALING" >&2
  exit 2
fi
total=${SLURM_NTASKS:-1}
rc=0
for n in ${MGRL_SCALING_GPUS:-1 2 4 8}; do
  if [ "$n" -gt "$total" ]; then
    mgrl_log "skipping $n GPUs: the allocation has $total tasks"
    continue
  fi
  mgrl_log "$harness --ranks=$n ($n of $total GPUs)"
  "$harness" --mgrl="$MGRL" --ranks="$n" --launcher="srun --mpi=pmix --ntasks=$n --exact" \
             --out="$MGRL_RUN_DIR/np$n" "$@" || { rc=$?; mgrl_log "the harness failed at $n GPUs (exit $rc)"; }
done
exit "$rc"
