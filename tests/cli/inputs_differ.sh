#!/usr/bin/env bash
# inputs_differ.sh WORK MPIEXEC NP_FLAG "MPI_FLAGS" MODEL DATA -- MGRL ARGS...: the ranks of a job read files of the
# same path that are not the same (an MPMD launch, each rank in a working directory of its own with its own copy:
# the node-local copies of a multi-node job). Rank 1's copy of the training data differs, then its copy of the base
# weights (one byte of the last tensor), then, in `mgrl generate`, its copy of the prompts: each time one line naming
# rank 1 and the file or tensor, exit 2. Identical copies train (exit 0). Until 2026-11-29 the ranks trained apart in
# silence. ARGS: the mgrl sft command line (its --model.path and --data.input are replaced by the copies').
set -uo pipefail
work=$1 mpiexec=$2 np=$3 flags=$4 model=$5 data=$6
shift 7
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
for r in a b; do
  mkdir -p "$work/$r" && cp -r "$model" "$work/$r/model" && cp "$data" "$work/$r/train.jsonl" || exit 1
done
args=("$@" --model.path=model --data.input=train.jsonl --train.max_steps=1 --checkpoint.dir= --log.dir=)
launch() {  # ARGS...: rank 0 in a, rank 1 in b; sets rc and line (the mgrl: lines of stderr)
  rc=0
  # shellcheck disable=SC2086
  "$mpiexec" $np 1 $flags --wdir "$work/a" "$@" : $np 1 --wdir "$work/b" "$@" > "$work/out.log" 2> "$work/err.log" || rc=$?
  line=$(grep '^mgrl:' "$work/err.log")
}
expect_error() {  # WHAT PATTERN
  [ "$rc" = 2 ] || fail "$1: exit $rc, expected 2 ($(tail -n 3 "$work/err.log"))"
  [ "$(grep -c '^mgrl:' "$work/err.log")" = 1 ] || fail "$1: not one line: $line"
  echo "$line" | grep -Eq "$2" || fail "$1: the line does not say it: $line"
  echo "$1: $line"
}
launch "${args[@]}"
[ "$rc" = 0 ] || fail "identical copies: exit $rc ($line)"
sed -i '$ s/[0-9]/7/' "$work/b/train.jsonl"
launch "${args[@]}"
expect_error "data" "^mgrl: error: \[rank 1\] data\.input \(train\.jsonl\) is not rank 0's copy: [0-9]+ bytes, sample checksum [0-9a-f]{16} here, [0-9]+ bytes, sample checksum [0-9a-f]{16} on rank 0 \(this rank's host: [^)]+\); every rank must read the same files"
cp "$data" "$work/b/train.jsonl"
st=$work/b/model/model.safetensors
printf '\x01' | dd of="$st" bs=1 seek=$(($(stat -c %s "$st") - 1)) conv=notrunc 2> /dev/null
launch "${args[@]}"
expect_error "weights" "^mgrl: error: \[rank 1\] the base weights are not rank 0's: tensor '[^']+' differs \(this rank's host: [^)]+\); every rank must load the same model"
cp "$model/model.safetensors" "$st"
printf '{"prompt": "1+2="}\n' > "$work/b/prompts.jsonl"
printf '{"prompt": "3+4="}\n' > "$work/a/prompts.jsonl"
gen=(generate "$(grep -o -- '--runtime.backend=[a-z]*' <<< "$*")" --model.path=model --data.input=prompts.jsonl
     "$(printf '%s\n' "$@" | grep -- '--model.tokenizer=')" --generate.max_new_tokens=2 --generate.output=gen.jsonl)
launch "$1" "${gen[@]}"
expect_error "generate" "^mgrl: error: \[rank 1\] data\.input \(prompts\.jsonl\) is not rank 0's copy"
echo "PASS: identical copies train; rank 1's other data, weights and prompts: one line each, exit 2"
