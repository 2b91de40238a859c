#!/bin/bash
# sft.sh: supervised fine-tuning on one node, one rank (task) per GPU. Preemptible like grpo_2xV100.sh: 5 minutes
# before the time limit mgrl checkpoints, the job requeues itself and resumes (docs/cluster.md).
#   sbatch slurm/sft.sh                                  inputs/quickstart_sft.toml (submit from the source tree)
#   sbatch slurm/sft.sh my_sft.toml --train.max_steps=500
# Output: runs/<job name>-<job id>/ (job.log, metrics.jsonl, checkpoints/, job_summary.txt).
#SBATCH --job-name=mgrl-sft
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=8
#SBATCH --mem-per-cpu=4G
#SBATCH --time=02:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
##SBATCH --partition=gpu
##SBATCH --account=myproject
# Typed GPU requests for sites that need them: --gpus-per-node=a100:2, --gres=gpu:volta:2.

# ---- Site: modules (edit). ----
if command -v module >/dev/null 2>&1; then
  # module load gcc/12.2.0 openmpi/4.1.4 cuda/12.4 nccl/2.21
  module load mgrl 2>/dev/null || true
fi
# ---- NCCL: see grpo_2xV100.sh and docs/cluster.md (NCCL_DEBUG, NCCL_SOCKET_IFNAME, NCCL_IB_HCA). ----
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

input=$MGRL_SLURM_DIR/../inputs/quickstart_sft.toml
if [ $# -gt 0 ] && [[ $1 == *.toml ]]; then input=$1; shift; fi
mgrl_train "$input" "$@"
