#!/usr/bin/env bash
# quickstart.sh: the main job from a fresh checkout: installs what is missing, builds, and runs
# `mgrl info` on 2 MPI ranks (what every rank runs on, and the versions of everything).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install_deps.sh"
bash "$root/scripts/build.sh"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# Open MPI on one machine: allow 2 ranks on fewer cores, keep traffic on loopback.
mpirun -n 2 --oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo \
  "${MGRL_BUILD_DIR:-$root/build}/mgrl" info
