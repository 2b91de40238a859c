#!/usr/bin/env bash
# outputs_disk_full.sh: HDF5 outputs other than checkpoints on a disk that fills up (a tmpfs of 64 KiB in a mount
# namespace of the test's own): `mgrl score`'s output, larger than the disk: exit 2 and one line naming the file and
# the full disk (until 2026-11-28: exit 1 and "HDF5 error at src/io/hdf5_file.cpp:159 (rank 0): H5Dclose(set.take())
# failed"); GRPO's rollout files in a log.dir there: one warning, the run goes on to its end (it ended with exit 1,
# the steps since its last checkpoint lost). No temporary is left.
#   outputs_disk_full.sh WORK SRC -- MGRL
set -uo pipefail
# shellcheck source=mount_ns.sh
source "$(dirname "$0")/mount_ns.sh"
in_mount_namespace "$0" "$@"
work=$1 src=$2
shift 2
[ "$1" = -- ] && shift
mgrl=$1

rm -rf "$work" && mkdir -p "$work/disk" || exit 1
fail() { echo "FAIL: $*"; echo "--- stderr"; cat "$work/err" 2>/dev/null; exit 1; }
trap 'umount "$work/disk" 2>/dev/null' EXIT
if ! mount -t tmpfs -o size=64k tmpfs "$work/disk"; then
  echo "SKIP: cannot mount a tmpfs here"
  exit 77
fi
models=$src/tests/data/models
check() {  # WHAT FILE-REGEX: exit 2, one line naming the file and the full disk, no temporary
  echo "$1: exit $rc"; cat "$work/err"
  [ "$rc" = 2 ] || fail "$1: exit code $rc, expected 2"
  [ "$(grep -c '^mgrl: error' "$work/err")" = 1 ] || fail "$1: not one error line from mgrl"
  grep -Eq "^mgrl: error: $2: cannot write .* \(disk full or I/O error\?\): .*No space left on device" "$work/err" ||
    fail "$1: the line does not name the file and the full disk"
  [ -z "$(find "$work/disk" -name '*.tmp.*')" ] || fail "$1: a temporary left: $(find "$work/disk" -name '*.tmp.*')"
}

# score: 400 sequences of 100 tokens (logprobs, tokens: ~320 KB of HDF5).
python3 -c '
import json
for i in range(400):
    print(json.dumps({"tokens": [(i * 7 + t) % 90 + 3 for t in range(100)]}))' > "$work/tokens.jsonl"
rc=0
"$mgrl" score --runtime.backend=cpu --model.path="$models/qwen2_bias_tied" --data.input="$work/tokens.jsonl" \
  --score.output="$work/disk/scores.h5" > /dev/null 2> "$work/err" || rc=$?
check "score" "$work/disk/scores\.h5"
[ "$(grep -c '^mgrl:' "$work/err")" = 1 ] || fail "score: not one line from mgrl"

# GRPO: rollout files in log.dir (every step's), the checkpoints elsewhere; the disk already holds a file that
# leaves it a few KiB. The log's disk is not the run's work: the run goes on to its end and its final checkpoint,
# with one warning for the rollout file that could not be written (and one for each other log file).
head -c $((52 * 1024)) /dev/zero > "$work/disk/ballast"
rc=0
"$mgrl" grpo "$src/tests/data/grpo_cli/grpo.toml" --model.path="$models/qwen2_bias_tied" \
  --model.tokenizer="$src/inputs/quickstart" --data.input="$src/tests/data/sft/train.jsonl" --train.max_steps=8 \
  --runtime.threads=1 --checkpoint.dir="$work/ck" --log.dir="$work/disk/log" > "$work/out" 2> "$work/err" || rc=$?
echo "grpo rollouts: exit $rc"; cat "$work/err"
[ "$rc" = 0 ] || fail "grpo: exit code $rc, expected 0"
grep -q "^step 8/8 " "$work/out" || fail "grpo: no step 8/8"
[ -f "$work/ck/step_00000008.h5" ] || fail "grpo: no final checkpoint"
! grep -q '^mgrl: error' "$work/err" || fail "grpo: an error line"
[ "$(grep -c 'rollouts/step_[0-9]*\.h5: cannot write the rollout file (disk full or I/O error?): .*No space left on device.*; the rollout files of later steps are not written (the run goes on)' "$work/err")" = 1 ] ||
  fail "grpo: not one warning for the rollout files"
[ -z "$(find "$work/disk" -name '*.tmp.*')" ] || fail "grpo: a temporary left: $(find "$work/disk" -name '*.tmp.*')"
echo "PASS: score's output on a full disk: exit 2 naming it; GRPO's rollout files: a warning, the run went on"
