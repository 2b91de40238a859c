#!/usr/bin/env bash
# reward_on_error.sh WORK GRPO_TOML -- MGRL ARGS...: reward[].on_error for a command reward (a judge) that fails once,
# at its second batch (exit status 3), beside the grpo_cli rewards:
# - on_error = "null": the run goes on to its last step (exit 0); that batch's completions get no value from the judge
#   (its values are null in the rollout file of step 2, the other steps' are not), said once with the count;
# - the default ("fail"): the run ends at step 2 with one line naming the judge and its status (exit 2);
# - a judge that cannot be started ends the run with on_error = "null" too.
# ARGS: model, tokenizer and data.
set -uo pipefail
work=$1 grpo=$2
shift 3
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
printf '#!/usr/bin/env bash\nn=$(cat count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > count\n[ $n = 2 ] && exit 3\nwhile IFS= read -r _; do echo 0.5; done\n' > "$work/judge.sh"
chmod +x "$work/judge.sh"
toml() {  # OUT ON_ERROR PROGRAM
  cp "$grpo" "$1"
  printf '\n[[reward]]\nkind = "command"\nname = "judge"\ncommand = ["%s"]\non_error = "%s"\n' "$3" "$2" >> "$1"
}
run=(--train.max_steps=4 --grpo.num_iterations=1 --checkpoint.dir=)
toml "$work/null.toml" null "$work/judge.sh"
"$@" "$work/null.toml" "${run[@]}" --log.dir="$work/null" > "$work/null.out" 2> "$work/null.err" ||
  fail "on_error null: exit $? ($(tail -n 2 "$work/null.err"))"
grep -q "step 4/4 " "$work/null.out" || fail "on_error null: no step 4"
[ "$(grep -c "reward 'judge' (command \[\"$work/judge.sh\"\]): exited with status 3: its 16 completions get no value from it (on_error = \"null\"; 1 failed batch so far)" "$work/null.err")" = 1 ] ||
  fail "on_error null: the warning: $(cat "$work/null.err")"
nans() { h5dump -d rewards "$1" | grep -o 'nan' | wc -l; }
[ "$(nans "$work/null/rollouts/step_00000002.h5")" = 16 ] || fail "step 2's judge values: $(h5dump -d rewards "$work/null/rollouts/step_00000002.h5" | head -20)"
for s in 1 3 4; do [ "$(nans "$work/null/rollouts/step_0000000$s.h5")" = 0 ] || fail "step $s has null values"; done
echo "on_error null: the failed batch's 16 values null, the run goes on"
toml "$work/fail.toml" fail "$work/judge.sh"
mkdir -p "$work/fail"
"$@" "$work/fail.toml" "${run[@]}" --log.dir="$work/fail" > "$work/fail.out" 2> "$work/fail.err"
rc=$?
[ $rc = 2 ] && [ "$(grep -c '^mgrl: error: ' "$work/fail.err")" = 1 ] &&
  grep -q "reward 'judge' (command \[\"$work/judge.sh\"\]): exited with status 3$" "$work/fail.err" ||
  fail "on_error fail: exit $rc: $(cat "$work/fail.err")"
toml "$work/gone.toml" null "$work/no_such_judge"
"$@" "$work/gone.toml" "${run[@]}" --log.dir="$work/gone" > /dev/null 2> "$work/gone.err"
rc=$?
[ $rc = 2 ] && grep -q "cannot run it: No such file or directory" "$work/gone.err" || fail "a judge that cannot start: exit $rc: $(cat "$work/gone.err")"
# A judge that prints its values, closes its output and goes on running (with a child of its own): its batch ends at
# timeout_s, the judge and its child killed (the rank waited for it without a limit until 2026-11-29).
printf '#!/usr/bin/env bash\nwhile IFS= read -r _; do echo 0.5; done\nexec 1>&-\nsleep 61 &\nwait\n' > "$work/linger.sh"
chmod +x "$work/linger.sh"
toml "$work/linger.toml" fail "$work/linger.sh"
printf 'timeout_s = 3\n' >> "$work/linger.toml"
start=$(date +%s)
"$@" "$work/linger.toml" "${run[@]}" --log.dir="$work/linger" > /dev/null 2> "$work/linger.err"
rc=$? took=$(( $(date +%s) - start ))
[ $rc = 2 ] && grep -q "did not finish within 3 s (timeout_s)" "$work/linger.err" && [ "$took" -lt 30 ] ||
  fail "a lingering judge: exit $rc after $took s: $(cat "$work/linger.err")"
sleep 1
pgrep -f "sleep 61" > /dev/null && fail "the judge's child outlived it"
echo "a lingering judge: ended at its timeout, its child killed"
echo "PASS: reward on_error"
