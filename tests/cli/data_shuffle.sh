#!/usr/bin/env bash
# data_shuffle.sh WORK MGRL CHECK MODELS DATA TOKENIZER GRPO_TOML MPIEXEC NUMPROC_FLAG [MPI FLAGS...]: data.shuffle
# = false (trl's shuffle_dataset = False) takes the training data in the file's order, epoch after epoch:
# - SFT: step 1 trains on the file's first 8 examples (its loss is that of a run over a file holding just them); the
#   default, shuffled, trains others; 1 and 2 ranks train the same weights over 7 steps (into the second epoch);
# - GRPO: the rollouts of steps 1 and 2 hold prompts 0-3 and 4-7 of the file, in order;
# - DPO: 1 and 2 ranks train the same weights, other than shuffled.
set -uo pipefail
work=$1 mgrl=$2 check=$3 models=$4 data=$5 tok=$6 grpo=$7
shift 7
mpirun=("$@")
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
base=(--runtime.backend=cpu --model.path="$models/qwen2_bias_tied" --model.tokenizer="$tok" --checkpoint.resume=none)
sft=(sft "${base[@]}" --train.batch_size=8 --train.lr=1e-2 --lora.r=4 --lora.alpha=8)

head -n 8 "$data/sft/train.jsonl" > "$work/first8.jsonl"
"$mgrl" "${sft[@]}" --data.input="$work/first8.jsonl" --train.max_steps=1 --log.dir="$work/first8" --checkpoint.dir= \
  > "$work/first8.log" 2>&1 || fail "first8: $(tail -n 2 "$work/first8.log")"
for s in false true; do
  "$mgrl" "${sft[@]}" --data.input="$data/sft/train.jsonl" --data.shuffle=$s --train.max_steps=7 --log.dir="$work/sft_$s" \
    --checkpoint.dir="$work/sft_$s/ck" > "$work/sft_$s.log" 2>&1 || fail "sft $s: $(tail -n 2 "$work/sft_$s.log")"
done
first=$("$check" field "$work/first8/metrics.jsonl" loss | awk '{print $3}')
plain=$("$check" field "$work/sft_false/metrics.jsonl" loss)
mixed=$("$check" field "$work/sft_true/metrics.jsonl" loss | awk '{print $3}')
read -r _ _ l1 _ _ _ _ _ l7 <<< "$plain"
awk -v a="$first" -v b="$l1" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }' ||
  fail "step 1 in file order: loss $l1, the first 8 examples' $first"
awk -v a="$first" -v b="$mixed" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d > 1e-3 * a) }' ||
  fail "shuffled, step 1 trained the first 8 examples too ($mixed)"
echo "sft: step 1 in file order trains the first 8 examples (loss $l1 = $first; shuffled $mixed)"
[ -n "$l7" ] || fail "no step 7: $plain"
on_ranks 2 "$mgrl" "${sft[@]}" --data.input="$data/sft/train.jsonl" --data.shuffle=false --train.max_steps=7 --log.dir= \
  --checkpoint.dir="$work/sft_np2/ck" > "$work/sft_np2.log" 2>&1 || fail "sft np2: $(tail -n 2 "$work/sft_np2.log")"
"$check" weights "$work/sft_false/ck/step_00000007.h5" "$work/sft_np2/ck/step_00000007.h5" --rtol=1e-5 ||
  fail "sft in file order: 2 ranks differ"

"$mgrl" "$grpo" "${base[@]}" --data.input="$data/sft/train.jsonl" --data.shuffle=false --grpo.num_iterations=1 \
  --train.max_steps=2 --log.dir="$work/grpo" --checkpoint.dir= > "$work/grpo.log" 2>&1 || fail "grpo: $(tail -n 2 "$work/grpo.log")"
for s in 1 2; do
  idx=$(h5dump -d prompt_index -y -w 0 "$work/grpo/rollouts/step_0000000$s.h5" | sed -n '/DATA {/,/}/p' | tr -dc '0-9,\n' |
    tr ',' '\n' | grep -v '^$' | sort -un | tr '\n' ' ')
  want=$( [ "$s" = 1 ] && echo "0 1 2 3 " || echo "4 5 6 7 ")
  [ "$idx" = "$want" ] || fail "grpo step $s: prompts $idx, not $want"
done
echo "grpo: steps 1 and 2 sample prompts 0-3 and 4-7"

dpo=(dpo "${base[@]}" --data.input="$data/dpo_cli/train.jsonl" --train.batch_size=8 --train.max_steps=3 --log.dir=)
"$mgrl" "${dpo[@]}" --data.shuffle=false --checkpoint.dir="$work/dpo1" > "$work/dpo1.log" 2>&1 || fail "dpo: $(tail -n 2 "$work/dpo1.log")"
on_ranks 2 "$mgrl" "${dpo[@]}" --data.shuffle=false --checkpoint.dir="$work/dpo2" > "$work/dpo2.log" 2>&1 || fail "dpo np2"
"$mgrl" "${dpo[@]}" --checkpoint.dir="$work/dpos" > "$work/dpos.log" 2>&1 || fail "dpo shuffled"
"$check" weights "$work/dpo1/step_00000003.h5" "$work/dpo2/step_00000003.h5" --rtol=1e-5 || fail "dpo: 2 ranks differ"
"$check" weights "$work/dpo1/step_00000003.h5" "$work/dpos/step_00000003.h5" --rtol=1e-5 > /dev/null &&
  fail "dpo: in file order and shuffled trained the same weights"
echo "PASS: data.shuffle"
