#!/usr/bin/env bash
# install_deps.sh: installs what mgrl needs to build and run on Debian 12 / Ubuntu 24.04
# (apt; with sudo when not root). Installs only the packages that are missing.
# The CUDA toolkit and NCCL are not apt packages here: install them from NVIDIA, or build
# without them (the CPU backend is then the only one; see README.md).
set -euo pipefail

packages=(
  build-essential cmake ninja-build git pkg-config
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libboost-program-options-dev libtomlplusplus-dev nlohmann-json3-dev
  libopenblas-dev
  libpcre2-dev libutf8proc-dev
  libgtest-dev libbenchmark-dev
  # the cluster tests (tests/cluster.cmake): a real SLURM, Lmod, and a venv for EasyBuild
  slurm-wlm slurmctld slurmd slurm-client munge lmod python3-venv
  # the multi-node cluster tests (tests/slurm/multinode_cluster.sh): network namespaces, veth pairs and a bridge
  # (ip), nsenter and unshare (UTS and mount namespaces per node), bc for their timings
  iproute2 util-linux bc
  # perf/scaling's PNG plots
  python3-matplotlib
  # the sanitizer and fuzzing job (scripts/sanitize.sh): clang with its sanitizer and libFuzzer runtimes
  clang libclang-rt-dev
)
# EasyBuild (from PyPI) for the easyconfig checks, in its own venv; $MGRL_EASYBUILD_VENV to put it elsewhere.
eb_venv=${MGRL_EASYBUILD_VENV:-$HOME/.cache/mgrl/easybuild-venv}
install_easybuild() {
  [ -x "$eb_venv/bin/eb" ] && return 0
  echo "install_deps: EasyBuild into $eb_venv (pip)"
  /usr/bin/python3 -m venv "$eb_venv" && "$eb_venv/bin/pip" install -q easybuild-framework easybuild-easyblocks pycodestyle ||
    echo "install_deps: EasyBuild could not be installed (the packaging.easybuild test will be skipped)" >&2
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages are installed"
  install_easybuild
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install_deps: no apt-get here; install these (or your distribution's equivalents) by hand: ${missing[*]}" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
echo "install_deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
install_easybuild
echo "install_deps: done"
