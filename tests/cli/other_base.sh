#!/usr/bin/env bash
# other_base.sh DIR TOOL TENSOR FIRST LAST -- MGRL_COMMAND...: the base weights changing under a training run's
# checkpoints. MGRL_COMMAND (a training mode, its model.path a directory we may copy) runs FIRST steps with checkpoints
# over a copy of its model (DIR/m); TENSOR of the copy then changes sign (tests/robust/robust_tool negate), and the
# resume to step LAST over the changed copy must end with exit 2 and one line naming the checkpoint and TENSOR,
# leaving the checkpoint directory as it was. With checkpoint.allow_other_base = true the same resume goes on, with one
# warning, to step LAST.
# The same resume over the unchanged weights (a copy in another directory) is not refused. Prints "other base: ok".
set -u
dir=$1 tool=$2 tensor=$3 first=$4 last=$5
shift 6  # DIR TOOL TENSOR FIRST LAST --
ck1=$(printf 'step_%08d.h5' "$first") ck2=$(printf 'step_%08d.h5' "$last")
cmd=("$@")
model=""
for a in "${cmd[@]}"; do case $a in --model.path=*) model=${a#--model.path=} ;; esac; done
[ -n "$model" ] || { echo "FAIL: the command names no --model.path"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$dir" && mkdir -p "$dir" && cp -r "$model" "$dir/m" && cp -r "$model" "$dir/same" || exit 1
run() { "${cmd[@]}" --log.dir= "$@"; }
run --model.path="$dir/m" --checkpoint.dir="$dir/ck" --train.max_steps=$first > "$dir/1.out" 2>&1 || { cat "$dir/1.out"; fail "the first step"; }
[ -e "$dir/ck/$ck1" ] || fail "no checkpoint of step $first"
"$tool" negate "$dir/m/model.safetensors" "$tensor" || fail "robust_tool negate"
before=$(sha256sum "$dir"/ck/*)
run --model.path="$dir/m" --checkpoint.dir="$dir/ck" --checkpoint.resume=auto --train.max_steps=$last > "$dir/2.out" 2> "$dir/2.err"
rc=$?
[ $rc -eq 2 ] || { cat "$dir/2.out" "$dir/2.err"; fail "resume over changed weights: exit $rc, expected 2"; }
grep -q "^mgrl: error: $dir/ck/${ck1//./\\.}: trained over other base weights than this run's (tensor '$tensor' differs" "$dir/2.err" ||
  { cat "$dir/2.err"; fail "no line naming the checkpoint and the tensor"; }
[ "$(grep -c . "$dir/2.err")" -eq 1 ] || { cat "$dir/2.err"; fail "more than one line on stderr"; }
[ "$(sha256sum "$dir"/ck/*)" = "$before" ] || fail "the checkpoint directory changed"
run --model.path="$dir/same" --train.max_steps=$last --checkpoint.resume="$dir/ck/$ck1" \
  --checkpoint.dir="$dir/ck_same" > "$dir/same.out" 2>&1 || { cat "$dir/same.out"; fail "resume over the same weights (a copy)"; }
grep -q "other base weights" "$dir/same.out" && fail "the same weights in another directory were said to differ"
run --model.path="$dir/m" --checkpoint.dir="$dir/ck" --checkpoint.resume=auto --train.max_steps=$last --checkpoint.allow_other_base=true > "$dir/3.out" 2>&1 ||
  { cat "$dir/3.out"; fail "checkpoint.allow_other_base = true did not go on"; }
grep -q "trained over other base weights than this run's (tensor '$tensor' differs.*going on over this run's (checkpoint.allow_other_base)" "$dir/3.out" ||
  { cat "$dir/3.out"; fail "no warning with checkpoint.allow_other_base"; }
[ -e "$dir/ck/$ck2" ] || fail "no checkpoint of step $last after checkpoint.allow_other_base"
echo "other base: ok"
