#!/usr/bin/env bash
# fetch_trl_wheels.sh: downloads into .whl/ (git-ignored) the wheels that perf/grpo_vs_trl.py needs on the GPU
# machine of the `device` tool, which has torch, transformers 5.x, peft and accelerate but no trl or datasets and no
# network (Python 3.12, x86-64). Run it here, in a session with PyPI, then carry ".whl" (perf/gpu_program.sh's grpo
# stage installs them with pip --target). Only what that machine lacks: a second copy of a package it has (numpy,
# pyarrow, fsspec, huggingface-hub) would shadow its own. Versions as checked on 2026-11-24 against transformers
# 5.17.0 and huggingface_hub 1.33.0 there.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qxF '/.whl/' "$(git rev-parse --git-path info/exclude)" || echo '/.whl/' >> "$(git rev-parse --git-path info/exclude)"
mkdir -p .whl
for pkg in trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "$pkg"
done
ls -l .whl
