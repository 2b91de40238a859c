#!/usr/bin/env bash
# reference_resume.sh WORK CHECK MPIEXEC NUMPROC_FLAG [MPI FLAGS...] -- MGRL KTO_ARGS... -- DPO_ARGS... -- GRPO_ARGS...:
# a resume keeps its run's reference policy (train::reference_identity in every checkpoint). Until 2026-11-29 a run
# started from lora.adapter (whose reference is that adapter) resumed without it against the base model with only a
# warning that a setting differed, and against another adapter under the same path in silence.
# - KTO from adapter A, stopped at step 2: resumed without lora.adapter, or with another adapter B, it is refused in
#   one line naming both references (exit 2, on 1 rank and on 2), its checkpoints untouched; with A copied elsewhere
#   it resumes, and ends on the straight run's weights bit for bit;
# - KTO from a copy of A rewritten in place after the stop (B's tensors; A's tensors with another lora_alpha): refused;
#   KTO from a fresh adapter (reference the base) resumed with lora.adapter = A: refused;
# - DPO with full fine-tuning from random weights resumed with another train.seed (other starting weights): refused,
#   with the advice of its kind;
# - DPO from A (its reference log-probs computed from A before training): resumed without A, refused;
# - GRPO from A with grpo.beta > 0 (reference "initial": A): resumed with grpo.reference = "base", refused; with
#   grpo.beta = 0 (no reference) resumed without A, accepted.
set -uo pipefail
work=$1 check=$2
shift 2
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
take_launcher "$@"
set -- "${rest[@]}"
mgrl=$1
shift
split_parts kto dpo grpo --words "$@"
export_adapter() {  # RUN OUTPUT
  "$mgrl" export --checkpoint.dir="$work/$1/ck" --export.output="$2" > "$work/export_$1.log" 2>&1 ||
    fail "export $1: $(tail -n 2 "$work/export_$1.log")"
}
# Two adapters: A (4 steps from a fresh one), B (1 step)
run a 1 "$mgrl" "${kto[@]}" --train.max_steps=4
export_adapter a "$work/A"
run b 1 "$mgrl" "${kto[@]}" --train.max_steps=1
export_adapter b "$work/B"
run straight 1 "$mgrl" "${kto[@]}" --lora.adapter="$work/A"
run part 1 "$mgrl" "${kto[@]}" --lora.adapter="$work/A" --train.stop_at_step=2
save=$(cd "$work/part/ck" && sha256sum ./*)
resume=(--checkpoint.dir="$work/part/ck" --log.dir="$work/part" --checkpoint.every_steps=1 --checkpoint.resume=auto)
refused kto_without 1 "^mgrl: error: [^ ]*step_00000002.h5: its run's reference policy was the starting adapter \(lora.adapter = \"[^\"]*/A\"\), this run's is the base model \(the adapter switched off\): the objective would change" \
  "$mgrl" "${kto[@]}" "${resume[@]}"
refused kto_other 1 "^mgrl: error: .*reference policy was the starting adapter \(lora.adapter = \"[^\"]*/A\"\), this run's is the starting adapter \(lora.adapter = \"[^\"]*/B\"\) \(other weights\)" \
  "$mgrl" "${kto[@]}" "${resume[@]}" --lora.adapter="$work/B"
refused kto_without_np2 2 "^mgrl: error: .*its run's reference policy was the starting adapter" \
  "$mgrl" "${kto[@]}" "${resume[@]}"
[ "$(cd "$work/part/ck" && sha256sum ./*)" = "$save" ] || fail "a refused resume changed the checkpoints: $(ls "$work/part/ck")"
cp -r "$work/A" "$work/A_moved"
on_ranks 1 "$mgrl" "${kto[@]}" "${resume[@]}" --lora.adapter="$work/A_moved" > "$work/moved.log" 2>&1 ||
  fail "A moved: $(tail -n 2 "$work/moved.log")"
grep -q "resumed from .*step_00000002.h5" "$work/moved.log" || fail "A moved: not resumed"
"$check" weights "$(ck straight 4)" "$(ck part 4)" --exact || fail "A moved: not the straight run's weights"
echo "kto: the same adapter elsewhere resumes to the straight run's weights"
# The same path rewritten after the stop: B's tensors, then A's with another lora_alpha (the adapter's scale)
cp -r "$work/A" "$work/same"
run same 1 "$mgrl" "${kto[@]}" --lora.adapter="$work/same" --train.stop_at_step=2
cp "$work/B/adapter_model.safetensors" "$work/same/"
refused kto_rewritten 1 "^mgrl: error: .*reference policy was the starting adapter \(lora.adapter = \"[^\"]*/same\"\), this run's is the starting adapter \(lora.adapter = \"[^\"]*/same\"\) \(other weights\): .* Resume with its lora.adapter as it was" \
  "$mgrl" "${kto[@]}" --lora.adapter="$work/same" --checkpoint.dir="$work/same/ck" --checkpoint.resume=auto
cp "$work/A/adapter_model.safetensors" "$work/same/"
python3 -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); c['lora_alpha'] = 4 * c['lora_alpha']; json.dump(c, open(p, 'w'))" \
  "$work/same/adapter_config.json" || fail "lora_alpha not rewritten"
refused kto_other_alpha 1 "^mgrl: error: .*reference policy was the starting adapter .* \(other weights\)" \
  "$mgrl" "${kto[@]}" --lora.adapter="$work/same" --checkpoint.dir="$work/same/ck" --checkpoint.resume=auto
# A fresh adapter's run (reference: the base) resumed with one
run fresh 1 "$mgrl" "${kto[@]}" --train.stop_at_step=2
refused kto_base_then_adapter 1 "^mgrl: error: .*its run's reference policy was the base model \(the adapter switched off\), this run's is the starting adapter .*: .* Resume without lora.adapter, as its run started" \
  "$mgrl" "${kto[@]}" --lora.adapter="$work/A" --checkpoint.dir="$work/fresh/ck" --checkpoint.resume=auto
# Full fine-tuning: the starting weights are the model's (here random, by train.seed)
run full 1 "$mgrl" "${dpo[@]}" --train.full_finetune=true --model.init=random --train.max_steps=4 --train.stop_at_step=2
refused dpo_full_other_seed 1 "^mgrl: error: .*its run's reference policy was the starting weights \(random weights \(train.seed = [0-9]+, .*\)\), this run's is the starting weights \(random weights \(train.seed = 7, .*\(other weights\): .* Resume over the weights it started from" \
  "$mgrl" "${dpo[@]}" --train.full_finetune=true --model.init=random --train.max_steps=4 --train.seed=7 \
  --checkpoint.dir="$work/full/ck" --checkpoint.resume=auto
run dpo 1 "$mgrl" "${dpo[@]}" --lora.adapter="$work/A" --train.max_steps=4 --train.stop_at_step=2
refused dpo_without 1 "^mgrl: error: .*its run's reference policy was the starting adapter \(lora.adapter = \"[^\"]*/A\"\), this run's is the base model" \
  "$mgrl" "${dpo[@]}" --train.max_steps=4 --checkpoint.dir="$work/dpo/ck" --checkpoint.resume=auto
run grpo 1 "$mgrl" "${grpo[@]}" --lora.adapter="$work/A" --train.stop_at_step=2
refused grpo_base 1 "^mgrl: error: .*its run's reference policy was the starting adapter \(lora.adapter = \"[^\"]*/A\"\), this run's is the base model" \
  "$mgrl" "${grpo[@]}" --lora.adapter="$work/A" --grpo.reference=base --checkpoint.dir="$work/grpo/ck" --checkpoint.resume=auto
run grpo0 1 "$mgrl" "${grpo[@]}" --lora.adapter="$work/A" --grpo.beta=0 --train.stop_at_step=2
on_ranks 1 "$mgrl" "${grpo[@]}" --grpo.beta=0 --checkpoint.dir="$work/grpo0/ck" --checkpoint.resume=auto \
  > "$work/grpo0_resume.log" 2>&1 || fail "grpo beta 0: $(tail -n 2 "$work/grpo0_resume.log")"
grep -q "resumed from .*step_00000002.h5" "$work/grpo0_resume.log" || fail "grpo beta 0: not resumed"
echo "grpo with beta 0 (no reference) resumes without its adapter"
echo "PASS: reference_resume"
