#!/usr/bin/env bash
# null_rewards.sh WORK GRPO_TOML PPO_TOML -- MGRL ARGS...: a command reward that prints null (trl's reward function
# returning None: no value for that completion) for every other completion. GRPO: those completions, which no
# reward scores, get advantage 0 and stay out of the reward statistics (trl 1.16's nan-aware means); one warning
# with their count; the run ends (exit 0) with the logged reward 0.5 (the scored ones' mean, not 0.25). PPO, whose
# GAE needs a score for every completion: one error line, exit 2. A judge printing inf: still refused. Until
# 2026-11-29 a null (or nan) ended every run as "not a number". The held-out accuracy with that judge as its reward:
# the nulls are not correct, and their count is said. ARGS: model, tokenizer and data (both modes).
set -uo pipefail
work=$1 grpo=$2 ppo=$3
shift 4
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
judge() {  # FILE VALUE: a judge printing null for even completions, VALUE for odd ones
  printf '#!/usr/bin/env bash\nn=0\nwhile IFS= read -r _; do n=$((n + 1)); done\nfor ((i = 0; i < n; i++)); do\n  if [ $((i %% 2)) = 0 ]; then echo null; else echo %s; fi\ndone\n' "$2" > "$1"
  chmod +x "$1"
}
with_judge() {  # TOML JUDGE OUT: TOML with the judge as its only reward
  sed '/^\[\[reward\]\]/,$d' "$1" > "$3"
  printf '[[reward]]\nkind = "command"\nname = "judge"\ncommand = ["%s"]\n' "$2" >> "$3"
}
judge "$work/judge.sh" 0.5
with_judge "$grpo" "$work/judge.sh" "$work/grpo.toml"
"$@" "$work/grpo.toml" --train.max_steps=2 --checkpoint.dir= --log.dir="$work/log" > "$work/out" 2> "$work/err" ||
  fail "grpo: exit $? ($(tail -n 2 "$work/err"))"
[ "$(grep -c 'warning: 8 of the 16 completions of step 1 got no value from any \[\[reward\]\] (null): advantage 0' "$work/err")" = 1 ] ||
  fail "grpo: not one warning naming 8 of 16: $(cat "$work/err")"
python3 - "$work/log/metrics.jsonl" <<'PY' || fail "grpo: the logged reward statistics"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"reward"' in l]
assert recs, "no reward records"
for r in recs:
    assert r["reward"] == 0.5 and r["rewards/judge/mean"] == 0.5 and r["rewards/judge/std"] == 0.0, r
print("grpo: reward %.2f, rewards/judge/mean %.2f over the scored completions" % (recs[0]["reward"], recs[0]["rewards/judge/mean"]))
PY
# The held-out evaluation with the judge as the accuracy reward: of 5 greedy completions (one call of the judge) the
# 3 it gives null are not correct, and said (counted wrong in silence until 2026-11-29).
data=
for a in "$@"; do case $a in --data.input=*) data=${a#--data.input=} ;; esac; done
head -n 5 "$data" > "$work/eval5.jsonl"
judge "$work/acc.sh" 1
with_judge "$grpo" "$work/acc.sh" "$work/acc.toml"
"$@" "$work/acc.toml" --train.max_steps=1 --eval.input="$work/eval5.jsonl" --eval.accuracy_reward=judge \
  --checkpoint.dir= --log.dir="$work/acc" > "$work/acc.out" 2> "$work/acc.err" || fail "eval: exit $? ($(tail -n 2 "$work/acc.err"))"
grep -q "^eval before step 0 | held-out mean reward 1.0000 | held-out accuracy 40.0% (2/5), 3 unjudged (null)$" \
  "$work/acc.out" || fail "eval: $(grep '^eval' "$work/acc.out")"
grep -q '"eval_unjudged":3' "$work/acc/metrics.jsonl" || fail "eval: no eval_unjudged 3 in metrics.jsonl"
echo "grpo: held-out accuracy 2/5 with 3 unjudged (null), said"
with_judge "$ppo" "$work/judge.sh" "$work/ppo.toml"
rc=0
"$@" "$work/ppo.toml" --train.max_steps=4 --checkpoint.dir= --log.dir= > /dev/null 2> "$work/err" || rc=$?
[ "$rc" = 2 ] || fail "ppo: exit $rc, expected 2"
grep -q '^mgrl: error: no \[\[reward\]\] gave a value (each printed null) for a completion of prompt [0-9]*: ppo needs a score for every completion$' "$work/err" ||
  fail "ppo: no line saying so: $(cat "$work/err")"
judge "$work/inf.sh" inf
with_judge "$grpo" "$work/inf.sh" "$work/inf.toml"
rc=0
"$@" "$work/inf.toml" --train.max_steps=1 --checkpoint.dir= --log.dir= > /dev/null 2> "$work/err" || rc=$?
[ "$rc" = 2 ] && grep -q "output line 2 is not a number (nor null for no value): 'inf'" "$work/err" ||
  fail "inf: exit $rc, $(cat "$work/err")"
echo "PASS: null rewards: grpo trains on the scored completions and says the unjudged held-out ones, ppo refuses, inf is refused"
