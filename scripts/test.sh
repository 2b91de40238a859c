#!/usr/bin/env bash
# test.sh: the whole test suite from a fresh checkout: installs what is missing, builds, runs CTest
# (labels unit, mpi, cli, slurm, module, packaging; gpu tests run where a GPU is usable and are skipped elsewhere).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install_deps.sh"
bash "$root/scripts/build.sh"
cd "${MGRL_BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 600 -j "$(nproc)"
