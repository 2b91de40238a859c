#!/usr/bin/env bash
# dir_lock.sh: two training runs in one checkpoint.dir / log.dir at the same time (a job requeued while the first
# still runs, two configurations given one directory). The second waits runtime.dir_lock_wait_s for the first, then
# refuses to start (exit 2, one line naming the directory and the holder: pid, host, mode) without touching a file
# of it; once the first has ended, a run there starts at once (resume = auto). Until 2026-11-28 the second ran
# beside the first, each replacing and pruning the other's checkpoints.   dir_lock.sh WORK -- LAUNCH...
# (LAUNCH: the mgrl sft command line, without --train.max_steps, --checkpoint.* and --log.dir.)
set -uo pipefail
work=$1
shift
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; for f in first second second_np2 stale third; do echo "--- $f"; cat "$work/$f.out" 2>/dev/null; done; exit 1; }
d=$work/run
"$@" --train.max_steps=100000 --checkpoint.dir="$d" --checkpoint.every_steps=0 --log.dir="$d/log" > "$work/first.out" 2>&1 &
pid=$!
trap 'kill -KILL $pid 2>/dev/null' EXIT
for _ in $(seq 600); do
  grep -q '"step":2[,}]' "$d/log/metrics.jsonl" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || fail "the first run ended"
  sleep 0.05
done
before=$(cd "$d" && find . -type f ! -name metrics.jsonl ! -name 'events.*' | sort | xargs sha256sum)
# The second run in the same checkpoint.dir (its own log.dir): waits 2 s, then refuses.
t0=$(date +%s.%N)
rc=0
"$@" --train.max_steps=10 --checkpoint.dir="$d" --checkpoint.resume=auto --log.dir="$work/log2" \
  --runtime.dir_lock_wait_s=2 > "$work/second.out" 2>&1 || rc=$?
secs=$(echo "$(date +%s.%N) - $t0" | bc)
grep '^mgrl\|in use' "$work/second.out"
echo "second run: exit $rc after ${secs} s"
[ "$rc" = 2 ] || fail "exit code $rc, expected 2"
kill -0 "$pid" 2>/dev/null || fail "the first run has ended meanwhile: the check proves nothing"
[ "$(grep -c '^mgrl:' "$work/second.out")" = 1 ] || fail "not one line from mgrl"
grep -Eq "^mgrl: error: $d \(checkpoint\.dir\) is in use by another mgrl run \(pid $pid on host [^ ]+, mgrl sft started [0-9T:-]+\): two runs in one directory replace and prune each other's files" "$work/second.out" ||
  fail "the line does not name the directory and the first run"
grep -q "waiting up to 2 s" "$work/second.out" || fail "it did not say that it waits"
[ "$(echo "$secs >= 2" | bc)" = 1 ] || fail "it did not wait 2 s"
after=$(cd "$d" && find . -type f ! -name metrics.jsonl ! -name 'events.*' | sort | xargs sha256sum)
[ "$before" = "$after" ] || fail "the first run's files changed: $(diff <(echo "$before") <(echo "$after"))"
# The same at 2 ranks with runtime.comm_timeout_s (1 s) below the wait (3 s): rank 1 waits as long as rank 0 does
# (not a watchdog timeout, exit 1), and every rank ends with the one line, exit 2.
if [ -n "${MPIRUN:-}" ]; then
  rc=0
  # shellcheck disable=SC2086
  $MPIRUN 2 $MPIFLAGS "$@" --train.max_steps=10 --checkpoint.dir="$d" --checkpoint.resume=auto --log.dir="$work/log3" \
    --runtime.dir_lock_wait_s=3 --runtime.comm_timeout_s=1 > "$work/second_np2.out" 2>&1 || rc=$?
  grep '^mgrl' "$work/second_np2.out"
  [ "$rc" = 2 ] || fail "2 ranks: exit code $rc, expected 2"
  grep -q "^mgrl: error: $d (checkpoint\.dir) is in use by another mgrl run (pid $pid " "$work/second_np2.out" ||
    fail "2 ranks: the line does not name the directory and the first run"
  ! grep -q "did not complete within" "$work/second_np2.out" || fail "2 ranks: the watchdog ended the wait"
fi
# The first run's heartbeat: its lock, dated 10 minutes back (as a stale one would be), is refreshed within the
# heartbeat's 30 s; without it a run holding a directory for more than 180 s would be taken over by the next.
touch -d '10 minutes ago' "$d/.mgrl.lock"
fresh=
for _ in $(seq 70); do
  age=$(( $(date +%s) - $(stat -c %Y "$d/.mgrl.lock") ))
  [ "$age" -lt 60 ] && { fresh=$age; break; }
  kill -0 "$pid" 2>/dev/null || fail "the first run ended before its lock was refreshed"
  sleep 0.5
done
[ -n "$fresh" ] || fail "the first run did not refresh its lock within 35 s (its age: ${age} s)"
echo "the first run's lock, dated 10 minutes back, was refreshed (age ${fresh} s)"
# A lock whose holder has stopped refreshing it (a node that died holding it on a network file system): a run
# there says so and goes on. Here another directory's lock, held by flock(1) and dated 10 minutes back.
# run_beside_stale_lock DIR WAIT OUT ARGS...: DIR's lock held by flock(1) and dated 10 minutes back while a run
# (ARGS, checkpoint.dir = DIR, runtime.dir_lock_wait_s = WAIT) starts there; its exit code in $rc.
run_beside_stale_lock() {
  local dir=$1 wait=$2 out=$3 holder
  shift 3
  flock -x "$dir/.mgrl.lock" sleep 30 < /dev/null > /dev/null 2>&1 &
  holder=$!
  for _ in $(seq 100); do flock -n "$dir/.mgrl.lock" true 2>/dev/null || break; sleep 0.05; done
  touch -d '10 minutes ago' "$dir/.mgrl.lock"
  rc=0
  "$@" --train.max_steps=2 --checkpoint.dir="$dir" --log.dir= --runtime.dir_lock_wait_s="$wait" > "$out" 2>&1 || rc=$?
  pkill -P "$holder" 2>/dev/null  # its sleep, which holds the lock
  kill "$holder" 2>/dev/null
}
s=$work/stale
mkdir -p "$s"
run_beside_stale_lock "$s" 5 "$work/stale.out" "$@"
grep '^mgrl' "$work/stale.out"
[ "$rc" = 0 ] || fail "the run beside a stale lock: exit code $rc, expected 0"
grep -q "^mgrl: warning: $s (checkpoint\.dir) is locked by .*, but the lock has not been refreshed for [0-9]* s (its node died?): this run takes it over" "$work/stale.out" ||
  fail "no warning about the stale lock"
# The same, but the lock names a process on this host (a run stopped or suspended here longer than the heartbeat's
# limit): this host's kernel says it is alive, so the lock is not taken over (it was until 2026-11-28).
h=$work/here
mkdir -p "$h"
host=$(grep -o 'on host [^,]*,' "$d/.mgrl.lock" | head -n 1)
[ -n "$host" ] || fail "the first run's lock does not name its host: $(cat "$d/.mgrl.lock")"
printf 'pid 1 %s mgrl (a stopped run)\n' "$host" > "$h/.mgrl.lock"
run_beside_stale_lock "$h" 1 "$work/here.out" "$@"
[ "$rc" = 2 ] && grep -q "is in use by another mgrl run (pid 1 $host" "$work/here.out" ||
  fail "a stale-dated lock of this host was taken over (exit $rc): $(grep '^mgrl' "$work/here.out")"
echo "a lock of this host dated 10 minutes back was not taken over"
# The first run stopped (SIGTERM: a checkpoint, exit 3): its lock goes with it; a third run resumes there at once.
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" = 3 ] || fail "the first run: exit code $rc after SIGTERM, expected 3"
newest=$(ls "$d" | grep -E '^step_[0-9]{8}\.h5$' | tail -n 1)
[ -n "$newest" ] || fail "the first run left no checkpoint"
rc=0
"$@" --train.max_steps=100000 --train.stop_at_step=$((10#${newest:5:8} + 1)) --checkpoint.dir="$d" --checkpoint.resume=auto \
  --log.dir="$d/log" --runtime.dir_lock_wait_s=0 > "$work/third.out" 2>&1 || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 3 ] || fail "the run after the first ended failed (exit $rc)"
grep -q "resumed from" "$work/third.out" || fail "the third run did not resume"
echo "PASS: the second run waited, then refused naming the first; after it ended, a run there resumed"
