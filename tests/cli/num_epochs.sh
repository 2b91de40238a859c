#!/usr/bin/env bash
# num_epochs.sh WORK MGRL MODELS DATA TOKENIZER: train.num_epochs (trl's num_train_epochs) sets the run's length as
# transformers counts it, ceil(epochs x ceil(rows / batch)) optimizer steps: SFT over 48 examples in batches of 8 for
# 1.5 epochs is 9 steps (and runs them); with train.packing the rows are the packed ones; DPO over 48 pairs in batches
# of 16 for 2 epochs is 6; GRPO over 48 prompts in batches of 4 for 0.25 epochs with num_iterations 2 is 3 x 2 = 6
# (GRPO counted as trl's: below);
# PPO over 48 prompts in batches of 8 for 0.25 epochs with 2 epochs x 2 mini-batches an update is 2 x 4 = 8;
# given beside train.max_steps it is refused (exit 2).
set -uo pipefail
work=$1 mgrl=$2 models=$3 data=$4 tok=$5
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
base=(--runtime.backend=cpu --model.path="$models/qwen2_bias_tied" --model.tokenizer="$tok" --checkpoint.dir= --log.dir=)
out=$("$mgrl" sft "${base[@]}" --data.input="$data/sft/train.jsonl" --train.batch_size=8 --train.num_epochs=1.5 2>&1) ||
  fail "sft: $out"
echo "$out" | grep -q '48 training examples, .* 9 steps x 8 sequences = 1.5 epochs' || fail "sft: $out"
echo "$out" | grep -q 'mean over 9 steps' || fail "sft did not run 9 steps: $out"
echo "sft: 9 steps"
out=$("$mgrl" sft "${base[@]}" --data.input="$data/sft/train.jsonl" --train.batch_size=2 --train.num_epochs=1 \
  --train.packing=true --train.max_seq_len=64 --train.max_steps=100 2>&1)
[ $? = 2 ] && echo "$out" | grep -q "keys 'train.num_epochs' and 'train.max_steps' are both given" ||
  fail "both keys: $out"
echo "both given: refused"
out=$("$mgrl" sft "${base[@]}" --data.input="$data/sft/train.jsonl" --train.batch_size=2 --train.num_epochs=1 \
  --train.packing=true --train.max_seq_len=64 2>&1) || fail "packed sft: $out"
rows=$(echo "$out" | sed -n 's/.* packed into \([0-9]*\) rows .*/\1/p')
[ -n "$rows" ] && [ "$rows" -lt 48 ] || fail "packing: $out"
want=$(( (rows + 1) / 2 ))
echo "$out" | grep -q "; $want steps x 2 rows = " || fail "packed sft, $rows rows: $out"
echo "packed sft: $rows rows, $want steps"
out=$("$mgrl" dpo "${base[@]}" --data.input="$data/dpo_cli/train.jsonl" --train.batch_size=16 --train.num_epochs=2 2>&1) ||
  fail "dpo: $out"
echo "$out" | grep -q '; 6 steps x 16 pairs = 2 epochs' || fail "dpo: $out"
echo "dpo: 6 steps"
grep -v '^max_steps' "$data/grpo_cli/grpo.toml" > "$work/grpo.toml"
out=$("$mgrl" "$work/grpo.toml" "${base[@]}" --data.input="$data/sft/train.jsonl" --train.num_epochs=0.25 2>&1) ||
  fail "grpo: $out"
echo "$out" | grep -q '; 6 steps = 0.25 epochs' || fail "grpo: $out"
echo "grpo: 6 steps"
# GRPO as trl 1.16 counts it (each figure read from GRPOTrainer + transformers' set_initial_training_values over 48
# prompts): whole generation rounds only, the epochs x their steps rounded up. 5 prompts a step: 9 rounds, 9 steps
# (not 10); rounds of 3 steps (steps_per_generation 3) over 0.3 epochs: ceil(0.3 x 4 x 3) = 4 steps (not 6), with
# num_iterations 2: 8; a round larger than the data: refused.
for c in "5 1 1 1 9" "4 3 1 0.3 4" "4 3 2 0.3 8"; do
  read -r b s mu e want <<< "$c"
  out=$("$mgrl" "$work/grpo.toml" "${base[@]}" --data.input="$data/sft/train.jsonl" --train.batch_size="$b" \
    --grpo.steps_per_generation="$s" --grpo.num_iterations="$mu" --train.num_epochs="$e" --train.stop_at_step=1 2>&1) ||
    fail "grpo $c: $out"
  echo "$out" | grep -q "; $want steps = " || fail "grpo $c: $out"
  echo "grpo: batch $b, steps_per_generation $s, num_iterations $mu, $e epochs: $want steps"
done
out=$("$mgrl" "$work/grpo.toml" "${base[@]}" --data.input="$data/sft/train.jsonl" --train.batch_size=16 \
  --grpo.steps_per_generation=4 --train.num_epochs=1 2>&1)
[ $? = 2 ] && echo "$out" | grep -q "the 48 prompts do not fill one generation round of 64" || fail "grpo round > data: $out"
echo "grpo: a round larger than the data refused"
grep -v '^max_steps' "$data/ppo_cli/ppo.toml" > "$work/ppo.toml"
out=$("$mgrl" "$work/ppo.toml" "${base[@]}" --data.input="$data/sft/train.jsonl" --train.num_epochs=0.25 \
  --train.stop_at_step=4 2>&1) || fail "ppo: $out"
echo "$out" | grep -q 'step 4/8 ' || fail "ppo: $out"
echo "ppo: 8 steps"
echo "PASS: num_epochs"
