#!/usr/bin/env bash
# kto_shard_base.sh WORK CHECK HELDOUT MPIEXEC NUMPROC_FLAG [MPI FLAGS...] -- MGRL ARGS...: `mgrl kto` on a sharded
# base (model.shard_base; 5 random layers, more than the two a rank keeps gathered, so that every pass gathers) trains
# and evaluates what the unsharded run does, bit for bit, on 2 and 4 ranks: LoRA weights and AdamW moments, the
# logged losses, the held-out loss (HELDOUT's first 13 pairs in batches of 3, every 2 steps: ranks of unequal shares).
set -uo pipefail
work=$1 check=$2 heldout=$3
shift 3
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
take_launcher "$@"
head -n 13 "$heldout" > "$work/eval13.jsonl"
set -- "${rest[@]}" --model.init=random --model.num_layers=5 --eval.input="$work/eval13.jsonl" --eval.batch_size=3 \
  --eval.every_steps=2
for n in 2 4; do
  run plain$n $n "$@"
  run shard$n $n "$@" --model.shard_base=true
  "$check" weights "$(ck plain$n 4)" "$(ck shard$n 4)" --exact || fail "$n ranks: other weights"
  for key in loss eval_loss; do
    "$check" losses "$work/plain$n/metrics.jsonl" "$work/shard$n/metrics.jsonl" --key=$key || fail "$n ranks: $key"
  done
  grep -q "^step 4/4 .* | base [0-9.]* MiB/rank" "$work/shard$n.log" || fail "$n ranks: no memory in the step line"
  echo "$n ranks: sharded = unsharded"
done
echo "PASS: kto shard_base"
