#!/usr/bin/env bash
# stdout_pipe_closed.sh WORK -- MGRL ARGS...: a training run whose standard output is a pipe that its reader closes
# (`mgrl ... | tee log` and the session gone; here `head -c 20`) goes on to the end: exit 0, every checkpoint written,
# metrics.jsonl whole. Until 2026-11-28 SIGPIPE killed it at its next line (exit 141, no message, no checkpoint).
set -uo pipefail
work=$1
shift 2
rm -rf "$work" && mkdir -p "$work" || exit 1
"$@" --train.max_steps=40 --log.every_steps=1 --checkpoint.dir="$work/ck" --log.dir="$work" 2> "$work/err" |
  head -c 20 > /dev/null
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || { echo "FAIL: exit $rc; stderr: $(tail -n 3 "$work/err")"; exit 1; }
[ -f "$work/ck/step_00000040.h5" ] || { echo "FAIL: no final checkpoint"; exit 1; }
[ "$(grep -c '"loss"' "$work/metrics.jsonl")" -ge 40 ] || { echo "FAIL: metrics.jsonl cut short"; exit 1; }
echo "PASS: the run outlived its closed standard output (exit 0, step 40 checkpointed)"
