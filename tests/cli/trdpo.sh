#!/usr/bin/env bash
# trdpo.sh WORK CHECK FIXTURES MPIEXEC NUMPROC_FLAG [MPI FLAGS...] -- MGRL DPO_ARGS... -- KTO_ARGS... -- GRPO_ARGS...:
# TR-DPO (trl's sync_ref_model: every ref_model_sync_steps steps the reference becomes (1 - alpha) reference + alpha
# policy) in mgrl dpo, kto and grpo.
# - Against trl itself (FIXTURES = tests/data/trdpo, tools/make_trdpo_fixtures.py: DPOTrainer.train() of trl 1.16,
#   full fine-tuning of the Qwen2 fixture, 5 steps of the same 8 pairs, sync every 2 steps at alpha 0.6, and the same
#   run without the sync): every step's loss within 2e-6, the final weights and the synced reference's within 1e-4
#   (relative norm; the two trl runs are 1.3e-3 apart);
# - a resume across a sync (stopped at step 3, after the sync at 2) ends on the straight run's weights and reference
#   bit for bit; 2 ranks train the 1-rank run's weights and reference (1e-4: full fine-tuning's rounding);
# - a checkpoint of a run without the sync resumed with it past its first sync, and one of a synced run resumed
#   without it: refused in one line (exit 2);
# - LoRA (mgrl's extension; trl syncs full fine-tuning only): before the first sync bit for bit the run without it,
#   after it other weights; KTO and GRPO (beta > 0) the same, and their resumes across a sync are exact (GRPO's
#   also with a sync inside a generation round);
# - dpo.precompute_ref_log_probs and grpo.beta = 0 with the sync refused in one line; the start-up line says the
#   sync; `mgrl plan` counts the reference copy.
set -uo pipefail
work=$1 check=$2 fixtures=$3
shift 3
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
take_launcher "$@"
set -- "${rest[@]}"
mgrl=$1
shift
split_parts dpo kto grpo --words "$@"
near() {  # NAME CASE: every step's loss of run NAME within 2e-6 of trl's (FIXTURES/CASE/case.json)
  local got want
  got=$("$check" field "$work/$1/metrics.jsonl" loss | cut -d: -f3)
  want=$(sed -n 's/^ *"loss": \(.*\),$/\1/p' "$fixtures/$2/case.json" | tr '\n' ' ')
  [ "$(echo $want | wc -w)" -eq 5 ] || fail "$2: trl's losses: $want"
  echo "$got" | awk -v want="$want" '{ n = split(want, w, " "); if (NF != n) exit 1;
    for (i = 1; i <= n; ++i) { d = $i - w[i]; if (d < 0) d = -d; if (!(d <= 2e-6)) exit 1 } }' ||
    fail "$1: losses $got, trl's $want"
  echo "$1: every step's loss within 2e-6 of trl's ($want)"
}
head -n 8 "$fixtures/../dpo_cli/train.jsonl" > "$work/pairs8.jsonl"
full=("${dpo[@]}" --data.input="$work/pairs8.jsonl" --eval.input= --train.batch_size=8 --train.max_steps=5
      --train.lr=1e-3 --train.schedule=constant --train.full_finetune=true --dpo.beta=0.1)
sync=(--dpo.sync_ref_model=true --dpo.ref_model_sync_steps=2 --dpo.ref_model_mixup_alpha=0.6)
run plain 1 "$mgrl" "${full[@]}"
run sync 1 "$mgrl" "${full[@]}" "${sync[@]}"
grep -q "^dpo: .*reference a copy of the starting weights, mixed with the policy every 2 steps (alpha 0.6: TR-DPO)" \
  "$work/sync.log" || fail "the start-up line: $(grep '^dpo:' "$work/sync.log")"
near plain plain
near sync sync
"$check" hf_weights "$(ck plain 5)" "$fixtures/plain/model.safetensors" --rtol=1e-4 || fail "plain: weights"
"$check" hf_weights "$(ck sync 5)" "$fixtures/sync/model.safetensors" --rtol=1e-4 || fail "sync: weights"
"$check" hf_weights "$(ck sync 5)" "$fixtures/sync/ref_model.safetensors" --rtol=1e-4 --reference ||
  fail "sync: the reference's weights"
"$check" hf_weights "$(ck sync 5)" "$fixtures/plain/model.safetensors" --rtol=1e-4 > /dev/null &&
  fail "the synced run's weights are the plain run's"
echo "trl: the same losses, weights and reference"
# a resume across the sync at step 2: stopped at 3, resumed to 5
run res 1 "$mgrl" "${full[@]}" "${sync[@]}" --train.stop_at_step=3
run res 1 "$mgrl" "${full[@]}" "${sync[@]}" --checkpoint.resume=auto
grep -q "resumed from .*step_00000003.h5" "$work/res.log" || fail "not resumed: $(tail -n 3 "$work/res.log")"
"$check" weights "$(ck sync 5)" "$(ck res 5)" --exact | grep -q "synced reference weights: in both, .* bitwise equal: yes" ||
  fail "resume: other weights or reference"
"$check" weights "$(ck sync 5)" "$(ck res 5)" --exact > /dev/null || fail "resume: other weights"
echo "resume across a sync: the straight run's weights and reference bit for bit"
run np2 2 "$mgrl" "${full[@]}" "${sync[@]}"
"$check" weights "$(ck sync 5)" "$(ck np2 5)" --rtol=1e-4 > /dev/null || fail "2 ranks: other weights"
echo "2 ranks: the same weights and reference"
refused resume_without_sync 1 "step_00000003.h5: its run's reference policy moves with training \(sync_ref_model\)" \
  "$mgrl" "${full[@]}" --checkpoint.dir="$work/res/ck" --checkpoint.resume="$work/res/ck/step_00000003.h5"
refused resume_with_sync 1 "step_00000003.h5: step 3, written without the weights of a reference policy that moves" \
  "$mgrl" "${full[@]}" "${sync[@]}" --checkpoint.dir="$work/plain/ck" --checkpoint.resume="$work/plain/ck/step_00000003.h5"
refused precompute 1 "key 'dpo.sync_ref_model' with dpo.precompute_ref_log_probs = true" \
  "$mgrl" "${full[@]}" "${sync[@]}" --dpo.precompute_ref_log_probs=true --checkpoint.dir=
# LoRA: before the first sync (step 2) the reference is the starting adapter (B = 0: the base), bit for bit
lora=("${dpo[@]}" --train.max_steps=4)
run lplain 1 "$mgrl" "${lora[@]}"
run lsync 1 "$mgrl" "${lora[@]}" "${sync[@]}"
"$check" weights "$(ck lplain 2)" "$(ck lsync 2)" --any-step --exact --reference-in-one > /dev/null ||
  fail "LoRA: step 2 differs"
"$check" weights "$(ck lplain 3)" "$(ck lsync 3)" --rtol=1e-6 --reference-in-one > /dev/null &&
  fail "LoRA: the sync changed nothing"
echo "LoRA: the run without the sync until the first, other weights after it"
# the boundary: a run without the sync stopped at step 1 (before the first sync) resumes with it to the straight
# synced run bit for bit; stopped at step 2 (= ref_model_sync_steps: the synced run mixed there) it is refused
run lb 1 "$mgrl" "${lora[@]}" --train.stop_at_step=1
run lb 1 "$mgrl" "${lora[@]}" "${sync[@]}" --checkpoint.resume=auto
"$check" weights "$(ck lsync 4)" "$(ck lb 4)" --exact | grep -q "synced reference weights: in both, .* bitwise equal: yes" ||
  fail "LoRA: resumed with the sync before its first: other weights or reference"
refused lora_at_tau 1 "step_00000002.h5: step 2, written without the weights of a reference policy that moves" \
  "$mgrl" "${lora[@]}" "${sync[@]}" --checkpoint.dir="$work/lplain/ck" --checkpoint.resume="$work/lplain/ck/step_00000002.h5"
echo "LoRA: resumed with the sync from before its first sync exact, from its step refused"
# KTO and GRPO: the same, and an exact resume across a sync
for m in kto grpo; do
  if [ $m = kto ]; then args=("${kto[@]}" --train.max_steps=4); else args=("${grpo[@]}" --grpo.beta=0.04 --train.max_steps=4); fi
  s=(--$m.sync_ref_model=true --$m.ref_model_sync_steps=2)
  run ${m}plain 1 "$mgrl" "${args[@]}"
  run ${m}sync 1 "$mgrl" "${args[@]}" "${s[@]}"
  grep -q "mixed with the policy every 2 steps" "$work/${m}sync.log" || fail "$m: the start-up line"
  "$check" weights "$(ck ${m}plain 2)" "$(ck ${m}sync 2)" --any-step --exact --reference-in-one > /dev/null ||
    fail "$m: step 2 differs"
  "$check" weights "$(ck ${m}plain 4)" "$(ck ${m}sync 4)" --rtol=1e-6 --reference-in-one > /dev/null &&
    fail "$m: the sync changed nothing"
  run ${m}res 1 "$mgrl" "${args[@]}" "${s[@]}" --train.stop_at_step=3
  run ${m}res 1 "$mgrl" "${args[@]}" "${s[@]}" --checkpoint.resume=auto
  "$check" weights "$(ck ${m}sync 4)" "$(ck ${m}res 4)" --exact > /dev/null || fail "$m: resume not exact"
  echo "$m: the sync acts after step 2; resume across it exact"
done
# GRPO's rounds serve 2 steps (grpo.toml: num_iterations 2): with a sync after every step one falls inside a round
# (after step 3), whose reference log-probs were taken at its start; stopped there and resumed: exact
g1=("${grpo[@]}" --grpo.beta=0.04 --train.max_steps=4 --grpo.sync_ref_model=true --grpo.ref_model_sync_steps=1)
run g1 1 "$mgrl" "${g1[@]}"
run g1res 1 "$mgrl" "${g1[@]}" --train.stop_at_step=3
run g1res 1 "$mgrl" "${g1[@]}" --checkpoint.resume=auto
"$check" weights "$(ck g1 4)" "$(ck g1res 4)" --exact > /dev/null || fail "grpo: a resume inside a round not exact"
echo "grpo: a sync inside a generation round, resumed there: exact"
refused grpo_beta0 1 "key 'grpo.sync_ref_model' with grpo.beta = 0" "$mgrl" "${grpo[@]}" --grpo.beta=0 \
  --grpo.sync_ref_model=true --checkpoint.dir=
echo 'mode = "dpo"' > "$work/dpo.toml"  # mgrl plan reads the mode from its config file
"$mgrl" plan "$work/dpo.toml" "${full[@]:1}" "${sync[@]}" --plan.target=cpu | grep -E "^  reference copy " ||
  fail "plan: no reference copy"
"$mgrl" plan "$work/dpo.toml" "${full[@]:1}" --plan.target=cpu | grep -qE "^  reference copy " &&
  fail "plan: a reference copy without the sync (the reference log-probs are computed once)"
echo "PASS: trdpo"
