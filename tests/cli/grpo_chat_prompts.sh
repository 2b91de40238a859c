#!/usr/bin/env bash
# grpo_chat_prompts.sh WORK CHECK -- MGRL ARGS...: trl's conversational prompt column, {"prompt": [messages]}, reads
# as mgrl's {"messages": [...]} does (through the chat template with the generation prompt): the same run, bitwise.
# Until 2026-11-28 such a line was refused ("\"prompt\" must be a string"), so trl's GRPO datasets did not load as
# they are.
set -uo pipefail
work=$1 check=$2
shift 3
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
for i in 1 2 3 4 5 6 7 8; do
  echo "{\"messages\": [{\"role\": \"system\", \"content\": \"Add.\"}, {\"role\": \"user\", \"content\": \"$i+$((i * 3))=\"}], \"completion\": \"$((i * 4))\"}"
done > messages.jsonl
sed 's/^{"messages": /{"prompt": /' messages.jsonl > trl.jsonl
for f in messages trl; do
  "$@" --data.input=$f.jsonl --train.chat_format=chatml --train.max_steps=2 --rollouts.every_steps=1 \
    --checkpoint.dir=$f/ck --log.dir=$f > $f.log 2>&1 || fail "$f: $(tail -n 3 $f.log)"
done
h5diff messages/rollouts/step_00000001.h5 trl/rollouts/step_00000001.h5 /prompt_tokens /prompt_tokens ||
  fail "other prompt tokens"
"$check" weights messages/ck/step_00000002.h5 trl/ck/step_00000002.h5 --exact || fail "other weights"
echo "PASS: trl's conversational prompts"
