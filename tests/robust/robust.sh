#!/usr/bin/env bash
# robust.sh: runs one case of the catalogue of bad inputs (tests/robust/cases.sh) and checks mgrl's promise:
# exit code 2, exactly one line from mgrl on stderr ("mgrl: error: ...") that names the culprit (the case's
# regex), and nothing already on disk changed (sha256 of every file of the case's directory before and after;
# no temporary file left behind).
#   robust.sh MGRL TOOL SOURCE_DIR WORK_ROOT MPIEXEC CASE     (CASE _setup: makes the shared checkpoints)
set -u
mgrl=$1 tool=$2 src=$3 root=$4 mpiexec=$5 case_name=$6
mpiflags="--oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo"

if [ "$case_name" = "_setup" ]; then
  # Checkpoints of a real run (steps 1 and 2), shared read-only by the cases (each copies them).
  rm -rf "$root/_base" && mkdir -p "$root/_base" || exit 1
  exec "$mgrl" sft --runtime.backend=cpu --model.path="$src/tests/data/models/qwen2_bias_tied" \
    --model.tokenizer="$src/inputs/quickstart" --data.input="$src/tests/data/sft/train.jsonl" --train.batch_size=4 \
    --train.max_steps=2 --lora.r=2 --checkpoint.every_steps=1 --checkpoint.resume=none --checkpoint.dir="$root/_base/ck"
fi

w=$root/$case_name
rm -rf "$w" && mkdir -p "$w" && cd "$w" || exit 1
# The good inputs every case starts from (relative paths: messages name them as the user gave them).
cp -r "$src/tests/data/models/qwen2_bias_tied" model
mkdir tok && cp "$src/inputs/quickstart/tokenizer.json" "$src/inputs/quickstart/tokenizer_config.json" tok/
cp "$src/tests/data/sft/train.jsonl" "$src/tests/data/sft/heldout.jsonl" .
cp "$src/tests/data/score/qwen2_bias_tied.jsonl" tokens.jsonl
cp "$src/tests/data/generate/prompts.jsonl" prompts.jsonl
cp "$src/tests/data/grpo_cli/grpo.toml" grpo.toml
cp "$src/tests/data/ppo_cli/ppo.toml" ppo.toml
cp -r "$root/_base/ck" ck || { echo "FAIL: no shared checkpoints (robust.setup must run first)"; exit 1; }
cp ck/step_00000001.h5 old_output.h5   # an earlier output a failing run must leave alone
echo '{"earlier": "output"}' > old_output.jsonl
printf 'mode = "sft"\n\n[train]\nlr = 1e-3\nmax_steps = 2\n' > run.toml

# Command lines the cases extend (word-split on purpose).
SFT="sft --runtime.backend=cpu --model.path=model --model.tokenizer=tok --data.input=train.jsonl --train.batch_size=4 --train.max_steps=2 --lora.r=2 --checkpoint.resume=none"
PPO="ppo.toml --model.path=model --model.tokenizer=tok --data.input=train.jsonl --train.max_steps=4"
GRPO="grpo.toml --model.path=model --model.tokenizer=tok --data.input=train.jsonl --train.max_steps=1 --train.batch_size=2 --grpo.num_generations=2"
SCORE="score --runtime.backend=cpu --model.path=model --data.input=tokens.jsonl --score.output=old_output.h5"
GEN="generate --runtime.backend=cpu --model.path=model --model.tokenizer=tok --data.input=prompts.jsonl --generate.output=old_output.jsonl --generate.max_new_tokens=2"
RESUME="$SFT --train.max_steps=3 --checkpoint.dir=ck --checkpoint.resume=auto"

found=0 ranks=1 regex="" setup="" args=()
# c NAME RANKS 'REGEX' 'SETUP' ARGS...: one case (only the one named on the command line is kept).
c() {
  [ "$1" = "$case_name" ] || return 0
  found=1 ranks=$2 regex=$3 setup=$4
  shift 4
  args=("$@")
}
T() { "$tool" "$@" >/dev/null || { echo "FAIL: setup step failed: robust_tool $*"; exit 1; }; }
source "$src/tests/robust/cases.sh"
[ "$found" = 1 ] || { echo "FAIL: no case '$case_name' in cases.sh"; exit 1; }

eval "$setup" || { echo "FAIL: the case's setup failed"; exit 1; }
# Every file but the run-directory lock files (.mgrl.lock: one line naming the last run that held the directory,
# rewritten by each run that takes the lock, a failed one too; app::lock_run_dirs).
snapshot() { find . -type f ! -path './.robust/*' ! -name .mgrl.lock -print0 | xargs -0 -r sha256sum | LC_ALL=C sort; }
mkdir .robust
snapshot > .robust/before
if [ "${args[0]}" = bash ]; then  # a case that sets limits first (ulimit -f: a full disk)
  timeout 60 "${args[@]}" > .robust/out 2> .robust/err
elif [ "$ranks" = 1 ]; then
  timeout 60 "$mgrl" "${args[@]}" > .robust/out 2> .robust/err
else
  timeout 60 "$mpiexec" -n "$ranks" $mpiflags "$mgrl" "${args[@]}" > .robust/out 2> .robust/err
fi
rc=$?
snapshot > .robust/after

fail=0
report() { echo "FAIL: $*"; fail=1; }
[ "$rc" = 2 ] || report "exit code $rc, expected 2"
lines=$(grep -c '^mgrl:' .robust/err)
[ "$lines" = 1 ] || report "$lines lines from mgrl on stderr, expected exactly 1"
line=$(grep -m1 '^mgrl:' .robust/err)
case "$line" in "mgrl: error: "*) ;; *) report "the line is not 'mgrl: error: ...'";; esac
echo "$line" | grep -Pq -- "$regex" || report "the error line does not name the culprit /$regex/"
changed=$(LC_ALL=C comm -23 .robust/before .robust/after)
[ -z "$changed" ] || report "files changed or removed by the failed run: $(echo "$changed" | awk '{print $2}' | tr '\n' ' ')"
left=$(find . -name '*.tmp*' ! -path './.robust/*')
[ -z "$left" ] || report "temporary files left behind: $left"
echo "case $case_name: mgrl ${args[*]} (ranks $ranks, exit $rc)"
echo "--- stderr"; cat .robust/err
[ "$fail" = 0 ] && echo "PASS"
exit $fail
