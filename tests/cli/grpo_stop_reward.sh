#!/usr/bin/env bash
# grpo_stop_reward.sh WORK -- MGRL GRPO.toml ARGS...: rewards see a completion's text cut at grpo.stop, in training as
# in held-out evaluation (docs/rewards.md). GRPO.toml's settings with its [[reward]] tables replaced by one regex
# reward for "1", and stop = ["1"]: no completion can hold a "1" once cut (one that held it stopped there), so the
# reward is 0 for every completion, while some completions stop. Until 2026-11-28 the training round decoded the
# tokens again, past the stop string: the reward was 1 for those.
set -uo pipefail
work=$1
shift 2
mgrl=$1 toml=$2
shift 2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
sed '/^\[\[reward\]\]/,$d' "$toml" > stop.toml
printf '[[reward]]\nkind = "regex"\nname = "has1"\npattern = "1"\n' >> stop.toml
"$mgrl" stop.toml "$@" '--grpo.stop=["1"]' --grpo.temperature=1.5 --grpo.max_completion_length=8 --train.max_steps=2 \
  --rollouts.every_steps=1 --checkpoint.dir= --log.dir=run > out.log 2>&1 || fail "run: $(tail -n 3 out.log)"
stops=0
for f in run/rollouts/step_*.h5; do
  n=$(h5dump -y -d /finish_reason "$f" | sed -n '/DATA {/,/}/p' | grep -o '[0-9]\+' | grep -c '^2$')
  stops=$((stops + n))
done
[ "$stops" -gt 0 ] || fail "no completion stopped at \"1\" (the test needs some)"
grep '"rewards/has1/mean"' run/metrics.jsonl | grep -Eqv '"rewards/has1/mean":0(\.0*)?[,}]' &&
  fail "a completion cut at \"1\" still held it: $(grep -o '"rewards/has1/mean":[^,}]*' run/metrics.jsonl | tr '\n' ' ')"
echo "$stops completions stopped at \"1\"; the reward for \"1\" was 0 for every completion"
