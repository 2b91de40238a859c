#!/bin/bash
# info.sh: SLURM batch job that runs `mgrl info` with one rank per GPU on one node.
#   sbatch slurm/info.sh                 (edit the partition / account lines for your site)
#SBATCH --job-name=mgrl-info
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=4
#SBATCH --time=00:05:00
#SBATCH --output=mgrl-info-%j.out
##SBATCH --partition=gpu
##SBATCH --account=myproject
set -euo pipefail
# With Lmod: module load mgrl (see README.md, "On a cluster"); otherwise put mgrl on PATH.
command -v module >/dev/null 2>&1 && module load mgrl 2>/dev/null || true
MGRL=${MGRL:-$(command -v mgrl || echo ./build/mgrl)}
# One rank per GPU; mgrl binds rank i of a node to its GPU i (or to the one GPU SLURM shows it).
srun --cpu-bind=cores "$MGRL" info
