#!/usr/bin/env bash
# kto.sh WORK CHECK PAIRS MPIEXEC NUMPROC_FLAG [MPI FLAGS...] -- MGRL ARGS...: `mgrl kto` end to end (the objective
# itself: unit.dpo KtoTrlCase against trl's KTOTrainer) on tests/data/kto_cli (40 labelled quickstart completions, 27
# desirable), LoRA on the Qwen2 fixture:
# - it trains and logs trl's metrics (kl, rewards/chosen, rewards/rejected, ...), held-out figures before and after;
#   the desirability balance (27 x 1 against 13 x 1) is said with trl's ranges;
# - 1 and 2 ranks train the same weights, with train.grad_accum 1 and with 2 (grad_accum changes the micro-batches
#   whose KL is estimated, as in trl, so each is compared with itself; a global micro-batch is the same examples on
#   any rank count);
# - from a starting adapter (the reference a frozen copy of it, swapped in) 1 and 2 ranks train the same weights;
# - preference pairs (PAIRS, DPO's data) are read unpaired and train;
# - a checkpoint at step 2 resumes to the straight run's weights bit for bit;
# - kto.loss_type = "apo_zero_unpaired": no KL estimate (kl 0 in every log line), other weights than kto's, the
#   same on 1 and 2 ranks, and a micro-batch of one example trains (kto's needs two);
# - with LoRA dropout (kto.disable_dropout = false) 1 and 2 ranks train the same weights, other than without.
set -uo pipefail
work=$1 check=$2 pairs=$3
shift 3
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
take_launcher "$@"
set -- "${rest[@]}"
run a 1 "$@"
grep -q "^kto: pretrained .*, 40 training examples, .* beta 0.1, weights 1 desirable, 1 undesirable" "$work/a.log" ||
  fail "start-up line: $(grep '^kto:' "$work/a.log")"
grep -q "27 desirable and 13 undesirable examples: .* set kto.desirable_weight in \[0.48, 0.64\] or kto.undesirable_weight in \[1.56, 2.08\]" "$work/a.log" ||
  fail "no balance warning: $(grep -i balance "$work/a.log")"
grep -q "^eval before step 0 | loss 0.5000 | kl 0.0000" "$work/a.log" || fail "eval before: $(grep '^eval before' "$work/a.log")"
for key in kl rewards/chosen rewards/rejected rewards/margins logps/chosen logps/rejected entropy logits/chosen eval_kl; do
  [ "$("$check" field "$work/a/metrics.jsonl" "$key" | wc -w)" -ge 3 ] || fail "metric $key missing"
done
"$check" field "$work/a/metrics.jsonl" rewards/accuracies > /dev/null 2>&1 &&
  [ "$("$check" field "$work/a/metrics.jsonl" rewards/accuracies | wc -w)" -gt 2 ] && fail "a DPO metric in kto's log"
kl=$("$check" field "$work/a/metrics.jsonl" kl)
echo "$kl"
[ "$(echo "$kl" | awk '{for (i = 3; i <= NF; ++i) if ($i > 0) n++; print n + 0}')" -ge 1 ] || fail "the KL estimate is never above 0"
# Step 1's policy is its reference (a fresh adapter against the adapter switched off; below, a starting adapter against
# its frozen copy): the KL sequences, scored in passes of their own (the policy's without a backward), give a KL of
# exactly 0 and the loss is 0.5, as the completions' log-ratios are 0
first_step() { "$check" field "$work/$1/metrics.jsonl" "$2" | awk '{print $3}'; }
[ "$(first_step a kl) $(first_step a loss)" = "0 0.5" ] || fail "step 1: kl $(first_step a kl), loss $(first_step a loss)"
echo "trains: trl's metrics, the balance said"
run a2 2 "$@"
"$check" weights "$(ck a 4)" "$(ck a2 4)" --rtol=1e-5 || fail "2 ranks differ"
run acc 1 "$@" --train.grad_accum=2
run acc2 2 "$@" --train.grad_accum=2
"$check" weights "$(ck acc 4)" "$(ck acc2 4)" --rtol=1e-6 --moments || fail "2 ranks with grad_accum 2 differ"
# (the KL is detached and small here: grad_accum moves the weights by ~5e-6, 40x the 1-vs-2-rank difference)
"$check" weights "$(ck a 4)" "$(ck acc 4)" --rtol=1e-6 > /dev/null && fail "grad_accum 2 changed nothing (its KL blocks differ)"
on_ranks 1 "${@:1:1}" export --checkpoint.dir="$work/a/ck" --export.output="$work/adapter" > "$work/export.log" 2>&1 ||
  fail "export: $(tail -n 2 "$work/export.log")"
run start 1 "$@" --lora.adapter="$work/adapter" --train.grad_accum=2
run start2 2 "$@" --lora.adapter="$work/adapter" --train.grad_accum=2
grep -q "reference a frozen copy of the starting weights" "$work/start.log" || fail "start: $(grep '^kto:' "$work/start.log")"
grep -q "^eval before step 0 | loss 0.5000 | kl 0.0000" "$work/start.log" ||
  fail "the reference is not the starting adapter: $(grep '^eval before' "$work/start.log")"
[ "$(first_step start kl) $(first_step start loss)" = "0 0.5" ] ||
  fail "from an adapter, step 1: kl $(first_step start kl), loss $(first_step start loss)"
"$check" weights "$(ck start 4)" "$(ck start2 4)" --rtol=1e-6 --moments || fail "from an adapter: 2 ranks differ"
echo "the same weights on 1 and 2 ranks (grad_accum 1 and 2, and from a starting adapter)"
# LoRA dropout (kto.disable_dropout = false): each sequence's mask by its slot in the step, the KL sequences' in their
# own pass, so 1 and 2 ranks train the same weights; and the dropout acts
run drop 1 "$@" --lora.dropout=0.2 --kto.disable_dropout=false
run drop2 2 "$@" --lora.dropout=0.2 --kto.disable_dropout=false
"$check" weights "$(ck drop 4)" "$(ck drop2 4)" --rtol=1e-5 --moments || fail "dropout: 2 ranks differ"
"$check" weights "$(ck a 4)" "$(ck drop 4)" --rtol=1e-4 --moments > /dev/null && fail "dropout did not act"
echo "dropout: the same on 1 and 2 ranks, and it acts"
run paired 1 "$@" --data.input="$pairs"
grep -q "96 training examples" "$work/paired.log" || fail "pairs: $(grep '^kto:' "$work/paired.log")"
"$check" weights "$(ck a 4)" "$(ck paired 4)" --rtol=1e-5 > /dev/null && fail "pairs trained the labelled file's weights"
echo "pairs: unpaired and trained"
run res 1 "$@" --train.stop_at_step=2
run res 1 "$@" --checkpoint.resume=auto
grep -q "resumed from .*step_00000002.h5" "$work/res.log" || fail "not resumed: $(tail -n 3 "$work/res.log")"
"$check" weights "$(ck a 4)" "$(ck res 4)" --exact || fail "resume: other weights"
run apo 1 "$@" --kto.loss_type=apo_zero_unpaired
grep -q "^kto: .*, loss apo_zero_unpaired, beta 0.1" "$work/apo.log" || fail "apo: $(grep '^kto:' "$work/apo.log")"
[ "$("$check" field "$work/apo/metrics.jsonl" kl | awk '{for (i = 3; i <= NF; ++i) if ($i != 0) n++; print n + 0}')" = 0 ] ||
  fail "apo: a KL estimate: $("$check" field "$work/apo/metrics.jsonl" kl)"
# (the KL is detached: without it the gradients change by a few %; AdamW's moments show it, 30x the ranks' difference)
"$check" weights "$(ck a 4)" "$(ck apo 4)" --rtol=1e-5 --moments > /dev/null && fail "apo trained kto's weights"
run apo2 2 "$@" --kto.loss_type=apo_zero_unpaired
"$check" weights "$(ck apo 4)" "$(ck apo2 4)" --rtol=1e-5 --moments || fail "apo: 2 ranks differ"
run apo1 1 "$@" --kto.loss_type=apo_zero_unpaired --train.batch_size=2 --train.grad_accum=2
grep -q "^step 4/4 " "$work/apo1.log" || fail "apo with micro-batches of one: $(tail -n 2 "$work/apo1.log")"
echo "apo_zero_unpaired: no KL, its own weights, the same on 1 and 2 ranks, micro-batches of one"
echo "PASS: kto"
