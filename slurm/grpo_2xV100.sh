#!/bin/bash
# grpo_2xV100.sh: GRPO with LoRA on one node with 2 V100 GPUs, one rank (task) per GPU. Preemptible: 5 minutes
# before the time limit (or on scancel --signal=USR1 --batch, or preemption) mgrl finishes its step, writes a
# checkpoint and the job requeues itself; the next start resumes from that checkpoint (docs/cluster.md).
#   sbatch slurm/grpo_2xV100.sh                                 the example input (inputs/grpo_gsm8k.toml)
#   sbatch slurm/grpo_2xV100.sh --train.max_steps=100           any --section.key=value overrides a key
#   sbatch slurm/grpo_2xV100.sh my_grpo.toml --train.lr=1e-5    another input (a first argument ending in .toml)
# Output: runs/<job name>-<job id>/ (job.log, metrics.jsonl, checkpoints/, rollouts/, job_summary.txt).
#SBATCH --job-name=mgrl-grpo
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=8
#SBATCH --mem-per-cpu=4G
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
##SBATCH --partition=gpu
##SBATCH --account=myproject
# The GPU request: --gpus-per-node=2 is SLURM's common form. Sites that name GPU types use a typed form instead,
# e.g. --gpus-per-node=v100:2 or --gres=gpu:volta:2 (see `sinfo -o "%N %G"` for the names of your site).

# ---- Site: modules (edit). The toolchain mgrl was built with, then mgrl (it puts mgrl on PATH). ----
if command -v module >/dev/null 2>&1; then
  # module load gcc/12.2.0 openmpi/4.1.4 cuda/12.4 nccl/2.21
  module load mgrl 2>/dev/null || true
fi
# ---- NCCL on clusters (uncomment what your site needs; one node with 2 GPUs rarely needs any) ----
# export NCCL_DEBUG=WARN              # INFO prints the rings/trees and the transport chosen; WARN only problems
# export NCCL_SOCKET_IFNAME=ib0       # the interface NCCL bootstraps on (exclude docker/virbr: ^docker,lo)
# export NCCL_IB_HCA=mlx5_0           # which InfiniBand adapters to use; NCCL_IB_DISABLE=1 forces TCP sockets
# export NCCL_P2P_LEVEL=NVL           # GPU peer-to-peer only over NVLink (PCIe P2P is broken on some boards)

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

input=$MGRL_SLURM_DIR/../inputs/grpo_gsm8k.toml
if [ $# -gt 0 ] && [[ $1 == *.toml ]]; then input=$1; shift; fi
# A V100 has 16 or 32 GB: the example's training micro-batch (64 completions of up to 512 tokens a rank) keeps its
# activations only with recomputation (about 4 GiB instead of more than 32 at Qwen2.5-0.5B; docs/cluster.md, V100).
# Later arguments win: --model.recompute=false (or --train.grad_accum=4) on the command line replaces it.
mgrl_train "$input" --model.recompute=true "$@"
