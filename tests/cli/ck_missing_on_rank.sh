#!/usr/bin/env bash
# ck_missing_on_rank.sh WORK MPIEXEC NP_FLAG "MPI_FLAGS" -- MGRL ARGS...: a checkpoint that rank 1 cannot open (its
# checkpoint.dir, relative to another working directory, lacks the newest file: a node-local directory) is not
# damage: the resume ends with one line naming rank 1 and the file (exit 2), and nothing is renamed or written. Until
# 2026-11-28 the intact file was set aside as .damaged and the run went back to the older checkpoint (exit 0).
set -uo pipefail
work=$1 mpiexec=$2 np=$3 flags=$4
shift 5
rm -rf "$work" && mkdir -p "$work/a" "$work/b/ck" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
args=("$@" --checkpoint.every_steps=1 --checkpoint.dir=ck --checkpoint.resume=auto --log.dir=)
(cd "$work/a" && "${args[@]}" --train.max_steps=2 > ../first.log 2>&1) || fail "first run: $(tail -n 3 "$work/first.log")"
cp "$work/a/ck/step_00000001.h5" "$work/b/ck/"
before=$(ls "$work/a/ck" "$work/b/ck")
rc=0
# shellcheck disable=SC2086
"$mpiexec" $np 1 $flags --wdir "$work/a" "${args[@]}" --train.max_steps=3 : $np 1 --wdir "$work/b" "${args[@]}" \
  --train.max_steps=3 > "$work/out.log" 2> "$work/err.log" || rc=$?
line=$(grep '^mgrl:' "$work/err.log")
echo "exit $rc: $line"
[ "$rc" = 2 ] || fail "exit $rc, expected 2"
[ "$(grep -c '^mgrl:' "$work/err.log")" = 1 ] || fail "not one line: $(grep '^mgrl:' "$work/err.log")"
echo "$line" | grep -q '^mgrl: error: \[rank 1\] ck/step_00000002.h5: cannot open (No such file or directory)' ||
  fail "the line does not name rank 1 and the file"
[ "$(ls "$work/a/ck" "$work/b/ck")" = "$before" ] || fail "files changed: $(ls "$work/a/ck" "$work/b/ck")"
echo "PASS: a checkpoint rank 1 cannot open is an error, not damage"
