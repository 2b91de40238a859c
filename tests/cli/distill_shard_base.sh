#!/usr/bin/env bash
# distill_shard_base.sh WORK CHECK HELDOUT TEACHER MPIEXEC NUMPROC_FLAG [MPI FLAGS...] -- MGRL ARGS...: `mgrl distill`
# with model.shard_base (the student's base and the teacher both sharded over the ranks, each layer gathered before it
# runs) trains what the unsharded run trains, bit for bit, at 1, 2 and 4 ranks: LoRA weights and AdamW moments, and
# every logged figure (loss, entropy, grad norm, completion lengths, the held-out divergence every 2 steps and at the
# end). Both models have 5 layers (the student random, model.num_layers; TEACHER), more than the two a rank keeps
# gathered, so that every pass gathers. HELDOUT: its first 3 lines are the held-out prompts, so that 2 ranks hold 1
# and 2 of them and 4 ranks 0, 1, 1, 1 (a rank without any still gathers with the others: the teacher's pass and the
# student's, in a chunk's order; with grad_accum 2 on 2 ranks, chunks of one: 1 and 2 of them). 4 ranks also with
# model.shard_base_keep (the student's layers kept for its
# backward); 2 ranks also over an NF4 (QLoRA) student; a sharded run stopped at step 2 resumes to the straight run bit
# for bit; the step line says the memory of both on a rank.
set -uo pipefail
work=$1 check=$2 heldout=$3 teacher=$4
shift 4
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
take_launcher "$@"
set -- "${rest[@]}" --eval.every_steps=2 --distill.teacher="$teacher" --model.init=random --model.num_layers=5
head -n 3 "$heldout" > "$work/eval3.jsonl"
set -- "$@" --eval.input="$work/eval3.jsonl"
keys="loss entropy grad_norm completions/mean_length completions/min_length completions/max_length
      completions/clipped_ratio eval_loss eval_entropy"
same() {  # same A B STEP: bitwise the same weights and moments, and every logged figure
  "$check" weights "$(ck "$1" "$3")" "$(ck "$2" "$3")" --exact || fail "$2: other weights than $1"
  local m=0
  for k in $keys; do
    "$check" losses "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" --key="$k" > /dev/null ||
      fail "$2: $k differs from $1's: $("$check" field "$work/$2/metrics.jsonl" "$k")"
    m=$((m + 1))
  done
  local evals
  evals=$("$check" field "$work/$2/metrics.jsonl" eval_loss | wc -w)
  [ "$evals" -ge 4 ] || fail "$2: held-out divergence logged at $((evals - 2)) steps, not 2 (steps 2 and 4)"
  echo "$2 = $1: weights bitwise, $m metrics"
}
for n in 1 2 4; do
  run plain$n $n "$@"
  run shard$n $n "$@" --model.shard_base=true
  same plain$n shard$n 4
  grep -q "^step 4/4 .* | base [0-9.]* MiB/rank + gather [0-9.]* MiB | teacher [0-9.]* MiB/rank + gather [0-9.]* MiB" \
    "$work/shard$n.log" || fail "shard$n: the step line does not say the memory: $(grep '^step 4/4' "$work/shard$n.log")"
done
# grad_accum 2 on 2 ranks: micro-batches of one, and held-out chunks of one (1 and 2 of them: an idle pass)
run acc2 2 "$@" --train.grad_accum=2
run acc2s 2 "$@" --train.grad_accum=2 --model.shard_base=true
same acc2 acc2s 4
run keep4 4 "$@" --model.shard_base=true --model.shard_base_keep=true
same plain4 keep4 4
# the ranks, sharded or not, sample and train the same (the completions depend on their slots only)
"$check" weights "$(ck plain1 4)" "$(ck shard4 4)" --rtol=1e-5 --moments > /dev/null || fail "4 sharded ranks train another run than 1"
echo "1, 2 and 4 ranks: sharded = unsharded"
run q2 2 "$@" --model.quantize=nf4
run q2s 2 "$@" --model.quantize=nf4 --model.shard_base=true
same q2 q2s 4
echo "2 ranks over an NF4 student: sharded = unsharded"
run res 2 "$@" --model.shard_base=true --train.stop_at_step=2
on_ranks 2 "$@" --model.shard_base=true --checkpoint.dir="$work/res/ck" --log.dir="$work/res" --checkpoint.every_steps=1 \
  --checkpoint.resume=auto > "$work/res2.log" 2>&1 || fail "resume: $(tail -n 3 "$work/res2.log")"
grep -q "resumed from .*step_00000002.h5" "$work/res2.log" || fail "not resumed: $(tail -n 3 "$work/res2.log")"
"$check" weights "$(ck shard2 4)" "$(ck res 4)" --exact || fail "resume: other weights"
echo "a sharded run resumes exactly"
echo "PASS: distill shard_base"
