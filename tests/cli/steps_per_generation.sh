#!/usr/bin/env bash
# steps_per_generation.sh WORK CHECK MPIEXEC NUMPROC_FLAG [MPI FLAGS...] -- MGRL ARGS...: grpo.steps_per_generation (trl's, in optimizer steps)
# end to end on tests/data/grpo_cli (4 prompts x 4 completions a step, beta > 0), with 2 steps a round and
# num_iterations 1:
# - one generation round of 8 prompts (32 completions) serves steps 1-2 and the next steps 3-4: rollout files at steps
#   1 and 3 only, holding 32 completions, the round's metrics (reward) logged for both of its steps, the generation
#   throughput on a round's first step only;
# - the round's two steps train every completion once: the tokens trained by the end of the round (the checkpoint's
#   tokens seen) are the round's completion tokens (the same slice twice, or half a round, would not be);
# - 1 rank, 2 ranks and 2 ranks with train.grad_accum 2 train the same weights (the slices do not depend on ranks);
# - a checkpoint inside a round (stop_at_step 1) resumes to the straight run's weights bit for bit;
# - a run of one step a round trains other weights (the key acts).
set -uo pipefail
work=$1 check=$2
shift 2
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
take_launcher "$@"
set -- "${rest[@]}"
spg=(--grpo.steps_per_generation=2 --grpo.num_iterations=1)
run() {  # NAME RANKS ARGS...
  local name=$1 ranks=$2
  shift 2
  on_ranks "$ranks" "$@" --checkpoint.dir="$work/$name/ck" --log.dir="$work/$name" > "$work/$name.log" 2>&1 ||
    fail "$name: $(tail -n 3 "$work/$name.log")"
}
run a 1 "$@" "${spg[@]}" --checkpoint.every_steps=2
grep -q "one generation round per 2 steps (8 prompts)" "$work/a.log" || fail "start-up line: $(grep '^grpo:' "$work/a.log")"
files=$(cd "$work/a/rollouts" && echo *.h5)
[ "$files" = "step_00000001.h5 step_00000003.h5" ] || fail "rollout files: $files"
for s in 1 3; do
  out=$("$check" rollouts "$work/a/rollouts/step_0000000$s.h5" "$work/a/metrics.jsonl" --G=4) || fail "rollouts $s: $out"
  echo "$out" | grep -q "rollouts of step $s: 32 completions" || fail "round of step $s: $out"
done
echo "rounds: 32 completions at steps 1 and 3"
r=$("$check" field "$work/a/metrics.jsonl" reward) || fail "reward field"
read -r _ _ r1 r2 r3 r4 <<< "$r"
[ "$r1" = "$r2" ] && [ "$r3" = "$r4" ] || fail "a round's steps log other rewards: $r"
g=$(grep -c '"generated_tokens_per_second"' "$work/a/metrics.jsonl")
[ "$g" = 2 ] || fail "generation logged on $g steps, not 2"
echo "metrics: the round's reward on both of its steps ($r1, $r3), generation on 2 steps"
round_tokens=$("$check" rollouts "$work/a/rollouts/step_00000001.h5" "$work/a/metrics.jsonl" --G=4 |
  sed -n 's/.*(\([0-9]*\) tokens).*/\1/p')
seen=$("$check" state "$work/a/ck/step_00000002.h5" | sed -n 's/.*tokens seen \([0-9]*\)$/\1/p')
[ -n "$round_tokens" ] && [ "$seen" = "$round_tokens" ] ||
  fail "trained $seen tokens in the round's 2 steps; the round holds $round_tokens"
echo "the round's 2 steps trained its $round_tokens tokens"
run np2 2 "$@" "${spg[@]}"
run np2acc2 2 "$@" "${spg[@]}" --train.grad_accum=2
"$check" weights "$work/a/ck/step_00000004.h5" "$work/np2/ck/step_00000004.h5" --rtol=1e-5 || fail "2 ranks differ"
"$check" weights "$work/a/ck/step_00000004.h5" "$work/np2acc2/ck/step_00000004.h5" --rtol=1e-5 ||
  fail "2 ranks with grad_accum 2 differ"
run b 1 "$@" "${spg[@]}" --train.stop_at_step=1
run b 1 "$@" "${spg[@]}" --checkpoint.resume=auto
grep -q "resumed from .*step_00000001.h5" "$work/b.log" || fail "not resumed: $(tail -n 3 "$work/b.log")"
"$check" weights "$work/a/ck/step_00000004.h5" "$work/b/ck/step_00000004.h5" --exact || fail "resume inside a round"
# A checkpoint inside a round resumed on another split of it (2 ranks, grad_accum 2) with beta 0, so that only the
# completions with an advantage had old log-probs: a micro-batch's stand-in completion without them ended the job
# ("old log-probs missing") until 2026-11-29.
run c 1 "$@" "${spg[@]}" --grpo.beta=0 --train.stop_at_step=1
run c 2 "$@" "${spg[@]}" --grpo.beta=0 --train.grad_accum=2 --checkpoint.resume=auto
grep -q "resumed from .*step_00000001.h5" "$work/c.log" || fail "not resumed on 2 ranks: $(tail -n 3 "$work/c.log")"
run c1 1 "$@" "${spg[@]}" --grpo.beta=0
"$check" weights "$work/c1/ck/step_00000004.h5" "$work/c/ck/step_00000004.h5" --rtol=1e-5 ||
  fail "resumed on another split: other weights"
echo "a round resumed on 2 ranks with grad_accum 2 trains the weights of 1 rank"
# mgrl plan sizes the rollout's KV cache for the round's prompts (4 a step x 4 steps x 4 completions).
for s in 1 4; do
  out=$("$1" plan "${@:2}" --grpo.steps_per_generation="$s" 2>&1) || fail "plan: $out"
  want=$((16 * s))
  echo "$out" | grep -q "KV cache .* for $want sequences" || fail "plan with steps_per_generation $s: $out"
done
echo "plan: the KV cache of 16 and 64 sequences"
run one 1 "$@" --grpo.num_iterations=1
"$check" weights "$work/a/ck/step_00000004.h5" "$work/one/ck/step_00000004.h5" --rtol=1e-6 > /dev/null 2>&1 &&
  fail "steps_per_generation 2 trained the weights of 1"
echo "PASS: steps_per_generation"
