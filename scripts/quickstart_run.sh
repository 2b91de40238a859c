#!/usr/bin/env bash
# quickstart_run.sh: the quickstart's runs, on an existing build (scripts/quickstart.sh builds first; the slow test
# cli.quickstart_grpo runs this): mgrl info on 2 ranks, the short SFT, its export, GRPO, both accuracies.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# Open MPI on one machine: allow 2 ranks on fewer cores, keep traffic on loopback.
run() { mpirun -n 2 --oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo "${MGRL_BUILD_DIR:-$root/build}/mgrl" "$@"; }
cd "$root"
run info
# Run directories: runs/ (or $MGRL_RUNS_DIR: the tests keep theirs in the build tree).
runs=${MGRL_RUNS_DIR:-runs}
rm -rf "$runs/quickstart" "$runs/quickstart_grpo"  # fresh runs (their checkpoints would otherwise be resumed)
run inputs/quickstart_sft.toml --train.max_steps="${MGRL_QUICKSTART_SFT_STEPS:-500}" --eval.every_steps=0 \
    --log.dir="$runs/quickstart" --checkpoint.dir="$runs/quickstart/checkpoints"
"${MGRL_BUILD_DIR:-$root/build}/mgrl" export inputs/quickstart_sft.toml --checkpoint.dir="$runs/quickstart/checkpoints" \
    --export.output="$runs/quickstart/sft_model"
run inputs/quickstart_grpo.toml --model.path="$runs/quickstart/sft_model" --log.dir="$runs/quickstart_grpo" \
    --checkpoint.dir="$runs/quickstart_grpo/checkpoints" | tee "$runs/quickstart_grpo.log"
before=$(sed -n 's/^eval before .*held-out accuracy \([0-9.]*%\).*/\1/p' "$runs/quickstart_grpo.log")
after=$(sed -n 's/^eval after .*held-out accuracy \([0-9.]*%\).*/\1/p' "$runs/quickstart_grpo.log")
echo "held-out accuracy before GRPO ${before}, after GRPO ${after}"
