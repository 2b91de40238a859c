#!/usr/bin/env bash
# build.sh: configures and builds mgrl into build/ (or $MGRL_BUILD_DIR) with CMake + Ninja.
# CUDA architectures: $MGRL_CUDA_ARCHS if set, else the GPU of this machine ("native"), else one
# architecture (80) to keep builds on GPU-less machines short. Extra cmake arguments pass through.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MGRL_BUILD_DIR:-$root/build}
archs=${MGRL_CUDA_ARCHS:-}
if [ -z "$archs" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then archs=native; else archs=80; fi
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${MGRL_BUILD_TYPE:-Release} \
      -DCMAKE_CUDA_ARCHITECTURES="$archs" "$@"
cmake --build "$build" --parallel "$(nproc)"
