#!/bin/bash
# multinode.sh: SFT or GRPO (the input's mode) over N nodes x G GPUs: one rank (task) per GPU, so ranks per node =
# GPUs per node. Change both lines together: --ntasks-per-node must equal the GPUs per node. Preemptible and
# requeued like grpo_2xV100.sh (docs/cluster.md).
#   sbatch slurm/multinode.sh my_grpo.toml                       2 nodes x 4 GPUs = 8 ranks
#   sbatch --nodes=4 slurm/multinode.sh my_grpo.toml             4 x 4 = 16 ranks (train.batch_size must divide)
#   sbatch slurm/multinode.sh                                    inputs/grpo_gsm8k.toml
#SBATCH --job-name=mgrl-multinode
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --mem-per-cpu=4G
#SBATCH --exclusive
#SBATCH --time=08:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
##SBATCH --partition=gpu
##SBATCH --account=myproject
# Typed GPU requests for sites that need them: --gpus-per-node=a100:4, --gres=gpu:volta:4.

# ---- Site: modules (edit). ----
if command -v module >/dev/null 2>&1; then
  # module load gcc/12.2.0 openmpi/4.1.4 cuda/12.4 nccl/2.21
  module load mgrl 2>/dev/null || true
fi
# ---- NCCL between nodes: these matter (see docs/cluster.md) ----
# export NCCL_DEBUG=INFO              # once, to see which transport (IB, sockets) NCCL picked; then WARN
# export NCCL_SOCKET_IFNAME=ib0       # the interface for NCCL's bootstrap and socket transport (or ^docker,lo)
# export NCCL_IB_HCA=mlx5             # the InfiniBand adapters NCCL may use (prefix match); NCCL_IB_DISABLE=1: no IB
# export NCCL_IB_GID_INDEX=3          # RoCE networks usually need the RoCEv2 GID index
# export NCCL_NET_GDR_LEVEL=PHB       # GPUDirect RDMA when the NIC and the GPU share a PCIe host bridge

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
mgrl_train "$input" "$@"
