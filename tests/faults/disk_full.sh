#!/usr/bin/env bash
# disk_full.sh: the checkpoint directory lies on a disk that fills up: a tmpfs of a few hundred KiB, mounted in a
# mount namespace of the test's own (it disappears with the test's processes, whatever happens to them). The run
# must end with exit code 2 and one line naming the checkpoint and the disk's reason, every rank must end, no
# temporary file may be left, and the checkpoints written before stay intact: they read back, equal those of an
# uninterrupted run, and once there is room again resume = auto finishes the run with the uninterrupted run's weights.
#   disk_full.sh WHICH WORK CHECK_TRAIN -- LAUNCH...
# WHICH: first (not even the step-2 checkpoint fits) or second (step 2 fits, step 4 does not).
# LAUNCH: [mpirun -n N ...] mgrl sft ... (without --train.max_steps, --checkpoint.every_steps, --checkpoint.dir and
# --log.dir, which this adds). Exit code 77 (skipped) where no tmpfs can be mounted: neither root nor unprivileged
# user namespaces, or a container without the capability to mount.
set -uo pipefail
# shellcheck source=mount_ns.sh
source "$(dirname "$0")/mount_ns.sh"
in_mount_namespace "$0" "$@"
which=$1 work=$2 check=$3
shift 3
[ "$1" = -- ] && shift

rm -rf "$work" && mkdir -p "$work/disk" || exit 1
fail() { echo "FAIL: $*"; echo "--- stderr"; cat "$work/err" 2>/dev/null; exit 1; }
ours() { pgrep -f -- "--log.dir=$work/log" || true; }
cleanup() {
  for p in $(ours); do kill -KILL "$p" 2>/dev/null; done
  umount "$work/disk" 2>/dev/null
}
trap cleanup EXIT
steps=(--train.max_steps=4 --checkpoint.every_steps=2)

# The uninterrupted run, on the ordinary disk: what the interrupted one must keep, and reach after resuming.
"$@" "${steps[@]}" --checkpoint.dir="$work/straight" --log.dir="$work/straight" > "$work/straight.log" 2>&1 ||
  fail "the uninterrupted run failed: $(cat "$work/straight.log")"
size=$(stat -c %s "$work/straight/step_00000002.h5")
case $which in
  first) kib=$((size / 2 / 1024)) bad=2 kept="" ;;
  second) kib=$((size * 3 / 2 / 1024)) bad=4 kept=step_00000002.h5 ;;
  *) fail "unknown case '$which'" ;;
esac
if ! mount -t tmpfs -o size=${kib}k tmpfs "$work/disk"; then
  echo "SKIP: cannot mount a tmpfs here"
  exit 77
fi

start=$(date +%s.%N)
timeout -s KILL 120 "$@" "${steps[@]}" --checkpoint.dir="$work/disk/ck" --log.dir="$work/log" > "$work/out" 2> "$work/err"
rc=$?
secs=$(echo "$(date +%s.%N) - $start" | bc)
echo "disk of ${kib} KiB, checkpoints of $size bytes: exit $rc after ${secs}s"
echo "--- stderr"; cat "$work/err"; echo "---"

[ "$rc" != 137 ] || fail "the job did not end within 120 s (killed)"
[ "$rc" = 2 ] || fail "exit code $rc, expected 2 (was 139, SIGSEGV, before the fix)"
lines=$(grep -c '^mgrl:' "$work/err")
[ "$lines" = 1 ] || fail "$lines lines from mgrl on stderr, expected 1"
line=$(grep '^mgrl:' "$work/err")
want="mgrl: error: $work/disk/ck/step_0000000$bad.h5: cannot write the checkpoint (disk full or I/O error?): "
[[ "$line" == "$want"*"No space left on device"* ]] || fail "the line does not name step $bad's checkpoint and a full disk: $line"
# Every process of the job has ended (mpirun reaps its ranks; allow it a moment).
for _ in $(seq 40); do [ -z "$(ours)" ] && break; sleep 0.1; done
[ -z "$(ours)" ] || fail "processes left behind: $(ours | tr '\n' ' ')"
# No temporary: only the checkpoints that fitted (and the lock file of the run-directory lock, and .mgrl.log_start,
# where the run's metrics began: docs/checkpoint.md).
left=$(ls -A "$work/disk/ck" | grep -Ev '^\.mgrl\.(lock|log_start)$' | tr '\n' ' ' | sed 's/ $//')
[ "$left" = "$kept" ] || fail "the checkpoint directory holds '$left', expected '$kept'"
if [ -n "$kept" ]; then
  "$check" read "$work/disk/ck/$kept" || fail "$kept does not read back"
  "$check" weights "$work/straight/$kept" "$work/disk/ck/$kept" --exact || fail "$kept differs from the uninterrupted run's"
fi

# Room again: resume = auto goes on from what was kept and ends with the uninterrupted run's weights.
mount -o remount,size=$((size * 4 / 1024))k "$work/disk" || fail "cannot enlarge the tmpfs"
"$@" "${steps[@]}" --checkpoint.dir="$work/disk/ck" --log.dir="$work/log" --checkpoint.resume=auto \
  > "$work/resume.log" 2>&1 || fail "resume failed: $(cat "$work/resume.log")"
if [ -n "$kept" ]; then
  grep -q "resumed from $work/disk/ck/$kept at step 2" "$work/resume.log" || fail "not resumed from $kept: $(cat "$work/resume.log")"
fi
"$check" weights "$work/straight/step_00000004.h5" "$work/disk/ck/step_00000004.h5" --exact ||
  fail "after resuming, the weights differ from the uninterrupted run's"
echo "PASS: disk full at step $bad: exit 2 after ${secs}s, one line, nothing left but '$kept', resumed to the same weights"
