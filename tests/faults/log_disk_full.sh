#!/usr/bin/env bash
# log_disk_full.sh: log.dir lies on a disk that fills up mid-run (a tmpfs of 12 KiB in a mount namespace of the
# test's own), the checkpoints on another. The run's work is not the log's: it must go on to its last step and its
# final checkpoint (the weights of an uninterrupted run, bit for bit), exit 0, with one warning for each log file
# that could not be written (metrics.jsonl, the TensorBoard events) and no error. Until 2026-11-28 the events
# writer's error ended the run (exit 2, the steps since the last checkpoint lost). Then, with room again, a run that
# appends to the same log.dir finds metrics.jsonl's last line cut short: it says so and starts its lines on a line of
# their own, so that every line but the cut one is valid JSON (they were glued onto the cut line before).
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
echo "PASS: the run ended as an uninterrupted one with its log's disk full; the next run's lines start on their own"
