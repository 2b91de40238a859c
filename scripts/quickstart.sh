#!/usr/bin/env bash
# quickstart.sh: the main job from a fresh checkout: installs what is missing, builds, shows what the 2 MPI
# ranks run on (`mgrl info`), then trains a tiny Llama from scratch on multi-digit addition on 2 ranks
# (inputs/quickstart_sft.toml, a few minutes on 2 CPU cores) and prints its held-out accuracy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install_deps.sh"
bash "$root/scripts/build.sh"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# Open MPI on one machine: allow 2 ranks on fewer cores, keep traffic on loopback.
run() { mpirun -n 2 --oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo "${MGRL_BUILD_DIR:-$root/build}/mgrl" "$@"; }
cd "$root"
run info
rm -rf runs/quickstart  # a fresh run each time (its checkpoints would otherwise be resumed)
run inputs/quickstart_sft.toml
