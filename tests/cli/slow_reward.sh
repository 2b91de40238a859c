#!/usr/bin/env bash
# slow_reward.sh WORK TOML RANK:SLEEP -- LAUNCH...: a run whose rewards are one command reward (a judge program)
# that takes rank RANK SLEEP seconds more than the others to score; LAUNCH (mpirun -n 2 ... mgrl [mode], its own
# arguments after the config) runs TOML with that reward in place of its own. The job's runtime.comm_timeout_s is
# set by the caller: the ranks that finish scoring first may wait for the others as long as the rewards' own limits
# (reward[].timeout_s, here 60 s), not just the timeout. The judge refuses an empty batch (exit 3): no rank may
# call it without completions (a rank without held-out prompts stepping along with a sharded base did).
set -euo pipefail
work=$1 toml=$2 slow_rank=${3%%:*} sleep_s=${3#*:}
shift 3
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work"
cat > "$work/judge.sh" <<JUDGE
#!/usr/bin/env bash
# one number per input line; rank $slow_rank is slow (a judge far away)
n=0
while IFS= read -r _; do n=\$((n + 1)); done
# like many judges, it refuses an empty batch
[ \$n = 0 ] && { echo "judge: empty input" >&2; exit 3; }
[ "\${OMPI_COMM_WORLD_RANK:-\${PMI_RANK:-0}}" = $slow_rank ] && sleep $sleep_s
for ((i = 0; i < n; i++)); do echo 0.5; done
JUDGE
chmod +x "$work/judge.sh"
sed '/^\[\[reward\]\]/,$d' "$toml" > "$work/grpo.toml"
printf '[[reward]]\nkind = "command"\nname = "judge"\ncommand = ["%s"]\ntimeout_s = 60\n' "$work/judge.sh" >> "$work/grpo.toml"
launch=("$@")
# The config goes right after the program (mgrl), or after its mode when one follows it.
for i in "${!launch[@]}"; do
  if [[ ${launch[$i]} == */mgrl ]]; then
    at=$((i + 1))
    [ $at -lt ${#launch[@]} ] && [[ ${launch[$at]} != -* ]] && at=$((at + 1))
    exec "${launch[@]:0:$at}" "$work/grpo.toml" "${launch[@]:$at}"
  fi
done
echo "slow_reward.sh: no mgrl in the launch command" >&2
exit 9
