#!/usr/bin/env bash
# distill.sh WORK CHECK OTHER_TEACHER MPIEXEC NUMPROC_FLAG [MPI FLAGS...] -- MGRL ARGS...: `mgrl distill` end to end
# (the step itself: unit.distill against trl's DistillationTrainer) on the quickstart prompts, LoRA on the Qwen2
# fixture, a wider random teacher (tests/data/distill/teachers):
# - it trains: the divergence falls from its first step to its last, trl's metrics in metrics.jsonl (loss, entropy,
#   completions/*), a held-out divergence before the end; the phase table has generation;
# - 1 and 2 ranks, and grad_accum 2, train the same weights (a completion depends on its slot, not on the ranks);
#   dynamic loss scaling the same bit for bit (the gradient scaled, the loss accumulated unscaled);
# - beta 0 and 0.5 train other weights than beta 1;
# - a checkpoint at step 2 resumes to the straight run's weights bit for bit; under another teacher
#   (OTHER_TEACHER, of the same vocabulary) the resume is refused in one line (exit 2).
set -uo pipefail
work=$1 check=$2 other=$3
shift 3
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
take_launcher "$@"
set -- "${rest[@]}"
run a 1 "$@"
grep -q "^distill: pretrained Qwen2ForCausalLM from teacher Qwen2ForCausalLM (2 layers, hidden 64), .* reverse KL (beta 1)" "$work/a.log" ||
  fail "start-up line: $(grep '^distill:' "$work/a.log")"
loss=$("$check" field "$work/a/metrics.jsonl" loss)
echo "$loss"
echo "$loss" | awk '{ if (!($NF < $3)) exit 1 }' || fail "the divergence did not fall: $loss"
for key in entropy completions/mean_length completions/min_length completions/max_length completions/clipped_ratio eval_loss eval_entropy; do
  [ -n "$("$check" field "$work/a/metrics.jsonl" "$key" | awk '{print $3}')" ] || fail "metric $key missing"
done
grep -q "^held-out loss [0-9.]* | entropy" "$work/a.log" || fail "no held-out divergence"
grep -q "^  generation " "$work/a.log" || fail "no generation in the phase table"
echo "trains: the divergence falls, trl's metrics, held-out"
run a2 2 "$@"
"$check" weights "$(ck a 4)" "$(ck a2 4)" --rtol=1e-5 --moments || fail "2 ranks differ"
run acc 1 "$@" --train.grad_accum=2
"$check" weights "$(ck a 4)" "$(ck acc 4)" --rtol=1e-5 --moments || fail "grad_accum 2 differs"
echo "the same weights on 1 and 2 ranks and with grad_accum 2"
run ls 1 "$@" --train.loss_scaling=dynamic
"$check" weights "$(ck a 4)" "$(ck ls 4)" --exact || fail "dynamic loss scaling changed the weights"
for key in loss entropy; do
  [ "$("$check" field "$work/a/metrics.jsonl" $key)" = "$("$check" field "$work/ls/metrics.jsonl" $key)" ] ||
    fail "dynamic loss scaling changed the logged $key: $("$check" field "$work/ls/metrics.jsonl" $key)"
done
echo "dynamic loss scaling: the same weights bit for bit"
run fwd 1 "$@" --distill.beta=0
run jsd 1 "$@" --distill.beta=0.5
"$check" weights "$(ck a 4)" "$(ck fwd 4)" --rtol=1e-4 > /dev/null && fail "beta 0 trained beta 1's weights"
"$check" weights "$(ck a 4)" "$(ck jsd 4)" --rtol=1e-4 > /dev/null && fail "beta 0.5 trained beta 1's weights"
grep -q "forward KL (beta 0)" "$work/fwd.log" && grep -q "generalized JSD (beta 0.5)" "$work/jsd.log" || fail "beta not said"
echo "beta 0 and 0.5: other weights"
run res 1 "$@" --train.stop_at_step=2
run res 1 "$@" --checkpoint.resume=auto
grep -q "resumed from .*step_00000002.h5" "$work/res.log" || fail "not resumed: $(tail -n 3 "$work/res.log")"
"$check" weights "$(ck a 4)" "$(ck res 4)" --exact || fail "resume: other weights"
run other 1 "$@" --train.stop_at_step=2
on_ranks 1 "$@" --distill.teacher="$other" --checkpoint.dir="$work/other/ck" --checkpoint.resume=auto > "$work/other2.log" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "another teacher: exit $rc"
grep -q "^mgrl: error: .*its run's reference policy was the teacher (distill.teacher = \"[^\"]*qwen2_wide\"), this run's is the teacher (distill.teacher = \"[^\"]*\") (other weights): .* Resume with its distill.teacher as it was" "$work/other2.log" ||
  fail "another teacher: $(grep error "$work/other2.log")"
echo "resume: exact; under another teacher refused"
echo "PASS: distill"
