#!/usr/bin/env bash
# log_disk_full.sh: log.dir lies on a disk that fills up mid-run (a tmpfs of 12 KiB in a mount namespace of the
# test's own), the checkpoints on another. The run's work is not the log's: it must go on to its last step and its
# final checkpoint (the weights of an uninterrupted run, bit for bit), exit 0, with one warning for each log file
# that could not be written (metrics.jsonl, the TensorBoard events) and no error. Until 2026-11-28 the events
# writer's error ended the run (exit 2, the steps since the last checkpoint lost). Then, with room again, a run that
# appends to the same log.dir finds metrics.jsonl's last line cut short: it says so and starts its lines on a line of
# their own, so that every line but the cut one is valid JSON (they were glued onto the cut line before). Last, a
# resume with log.dir full from its start (below).
#   log_disk_full.sh WORK CHECK_TRAIN -- LAUNCH...     (LAUNCH: [mpirun ...] mgrl sft ..., as disk_full.sh's)
set -uo pipefail
# shellcheck source=mount_ns.sh
source "$(dirname "$0")/mount_ns.sh"
in_mount_namespace "$0" "$@"
work=$1 check=$2
shift 2
[ "$1" = -- ] && shift

rm -rf "$work" && mkdir -p "$work/disk" || exit 1
fail() { echo "FAIL: $*"; echo "--- stderr"; cat "$work/err" 2>/dev/null; exit 1; }
trap 'umount "$work/disk" 2>/dev/null' EXIT
steps=(--train.max_steps=40 --checkpoint.every_steps=0)

"$@" "${steps[@]}" --checkpoint.dir="$work/straight" --log.dir="$work/straight" > "$work/straight.log" 2>&1 ||
  fail "the uninterrupted run failed: $(cat "$work/straight.log")"
if ! mount -t tmpfs -o size=12k tmpfs "$work/disk"; then
  echo "SKIP: cannot mount a tmpfs here"
  exit 77
fi

timeout -s KILL 120 "$@" "${steps[@]}" --checkpoint.dir="$work/ck" --log.dir="$work/disk/log" > "$work/out" 2> "$work/err"
rc=$?
echo "log.dir on a tmpfs of 12 KiB: exit $rc"
echo "--- stderr"; cat "$work/err"; echo "---"
[ "$rc" = 0 ] || fail "exit code $rc, expected 0 (the log's disk is full, not the run's work)"
grep -q 'step 40/40' "$work/out" || fail "the run did not reach step 40"
! grep -q '^mgrl: error' "$work/err" || fail "an error line"
[ "$(grep -c 'metrics\.jsonl: cannot be written' "$work/err")" = 1 ] || fail "not one warning for metrics.jsonl"
[ "$(grep -c 'events\.out\.tfevents.*the TensorBoard events of later steps are not written' "$work/err")" = 1 ] ||
  fail "not one warning for the TensorBoard events"
"$check" weights "$work/straight/step_00000040.h5" "$work/ck/step_00000040.h5" --exact ||
  fail "the final checkpoint differs from the uninterrupted run's"
[ -z "$(ls -A "$work/disk/log" | grep '\.tmp\.')" ] || fail "a temporary left in log.dir: $(ls -A "$work/disk/log")"
# job_summary.txt whole or not at all (it was truncated to 0 bytes), said once when not written.
s=$work/disk/log/job_summary.txt
[ ! -e "$s" ] || { [ -s "$s" ] && [ "$(tail -c 1 "$s" | od -An -c | tr -d ' ')" = '\n' ]; } || fail "job_summary.txt written in part"
[ -e "$s" ] || [ "$(grep -c 'job_summary\.txt: cannot write .*: job_summary\.txt not written' "$work/err")" = 1 ] ||
  fail "job_summary.txt missing without its one warning"

# Room again; metrics.jsonl's last line was cut by the full disk (or is made so, if the disk happened to fill up
# between two lines), and the next run appends to it.
mount -o remount,size=4m "$work/disk" || fail "cannot enlarge the tmpfs"
m=$work/disk/log/metrics.jsonl
[ -s "$m" ] || fail "no metrics.jsonl"
[ "$(tail -c 1 "$m" | od -An -c | tr -d ' ')" != '\n' ] || printf '{"cut' >> "$m"
"$@" --train.max_steps=42 --checkpoint.every_steps=0 --checkpoint.dir="$work/ck" --checkpoint.resume=auto \
  --log.dir="$work/disk/log" > "$work/resume.out" 2> "$work/err" || fail "the run after it failed"
cat "$work/err"
grep -q "metrics\.jsonl: its last line was cut short" "$work/err" || fail "the cut line was not said"
bad=$(python3 -c '
import json, sys
bad = 0
for line in open(sys.argv[1]):
    try:
        json.loads(line)
    except ValueError:
        bad += 1
print(bad)' "$m")
[ "$bad" = 1 ] || fail "$bad lines of metrics.jsonl are not JSON, expected 1 (the cut one)"
grep -q '"step":42[,}]' "$m" || fail "the second run's step 42 is not in metrics.jsonl"

# A resume whose log.dir is full from its start: an earlier attempt (4 steps, checkpoints every 2) lost its step-4
# checkpoint, so the records of steps 3 and 4 are to move to metrics.jsonl.dropped, but nothing can be written. The
# run goes on to its end (exit 0; it ended with exit 2 on the events file until 2026-11-29), says so once per file,
# leaves no empty file (an empty .dropped and events file were left) and metrics.jsonl's records where they were.
l=$work/disk/log3
"$@" --train.max_steps=4 --checkpoint.every_steps=2 --checkpoint.dir="$work/ck3" --log.dir="$l" > /dev/null 2>&1 ||
  fail "the run before the full-disk resume failed"
rm "$work/ck3/step_00000004.h5"
cp "$l/metrics.jsonl" "$work/metrics.before"
dd if=/dev/zero of="$work/disk/fill" bs=4k > /dev/null 2>&1
"$@" --train.max_steps=4 --checkpoint.every_steps=2 --checkpoint.dir="$work/ck3" --log.dir="$l" --checkpoint.resume=auto \
  > "$work/out3" 2> "$work/err" || fail "the resume with log.dir full failed (exit $?)"
cat "$work/err"
grep -q 'step 4/4' "$work/out3" || fail "the resume did not reach step 4"
! grep -q '^mgrl: error' "$work/err" || fail "an error line"
[ "$(grep -c 'metrics\.jsonl\.dropped: cannot be written' "$work/err")" = 1 ] || fail "not one warning for metrics.jsonl.dropped"
[ "$(grep -c 'events\.out\.tfevents.*the TensorBoard events of this run are not written' "$work/err")" = 1 ] ||
  fail "not one warning for the TensorBoard events"
[ -f "$work/ck3/step_00000004.h5" ] || fail "no final checkpoint"
[ ! -e "$l/metrics.jsonl.dropped" ] || fail "metrics.jsonl.dropped left behind ($(stat -c %s "$l/metrics.jsonl.dropped") bytes)"
[ -z "$(find "$l" -type f -size 0)" ] || fail "empty files left in log.dir: $(find "$l" -type f -size 0)"
[ "$(head -c "$(stat -c %s "$work/metrics.before")" "$l/metrics.jsonl" | cksum)" = "$(cksum < "$work/metrics.before")" ] ||
  fail "metrics.jsonl's earlier records changed"
echo "PASS: the run ended as an uninterrupted one with its log's disk full; the next run's lines start on their own;" \
     "a resume with log.dir full from its start went on, its log as it was"
