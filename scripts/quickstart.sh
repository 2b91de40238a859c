#!/usr/bin/env bash
# quickstart.sh: the main job from a fresh checkout: installs what is missing, builds, shows what the 2 MPI
# ranks run on (`mgrl info`), then on 2 ranks: SFT of a tiny Llama from scratch on multi-digit addition
# (inputs/quickstart_sft.toml, deliberately short: 500 steps, so it is far from perfect), its export as a Hugging
# Face model directory, and GRPO on it (inputs/quickstart_grpo.toml, reward: the exact sum); prints the held-out
# accuracy before and after GRPO. A few minutes on 2 CPU cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install_deps.sh"
bash "$root/scripts/build.sh"
exec bash "$root/scripts/quickstart_run.sh"
