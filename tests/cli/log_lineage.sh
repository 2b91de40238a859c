#!/usr/bin/env bash
# log_lineage.sh WORK -- SFT...: the records a resume moves out of metrics.jsonl are the lost steps of the run it
# continues, found by where that run's checkpoint saw the file end (not by step numbers alone):
# 1. run A (10 steps) and then run B (another checkpoint.dir, the same log.dir, logging at its end only) share
#    L/metrics.jsonl; B killed after its step-2 checkpoint (its step-4 one removed) and resumed: only B's records
#    after step 2 move, A's ten loss records stay (until 2026-11-28 A's records of steps 3 to 10 moved too);
# 2. a run killed before its first checkpoint (its only checkpoint removed) and started again: the first attempt's
#    records move, so that each step has one loss record (they were there twice until then);
# 3. a finished run (2 steps) extended to 4: its final evaluation, written after its final checkpoint, is of the step
#    it resumes from and stays (it was moved to metrics.jsonl.dropped as lost work until 2026-11-29).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$1
shift
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$@" --train.max_steps=10 --checkpoint.dir=ckA --log.dir=L > /dev/null
"$@" --train.max_steps=4 --checkpoint.dir=ckB --checkpoint.every_steps=2 --log.every_steps=100 --log.dir=L > /dev/null
rm ckB/step_00000004.h5
"$@" --train.max_steps=4 --checkpoint.dir=ckB --checkpoint.every_steps=2 --log.every_steps=100 --log.dir=L \
  --checkpoint.resume=auto > /dev/null
echo "shared log: $(grep -c '"loss"' L/metrics.jsonl) loss records kept, $(grep -c . L/metrics.jsonl.dropped) moved"
"$@" --train.max_steps=6 --checkpoint.dir=ckC --checkpoint.every_steps=100 --log.dir=L2 > /dev/null
rm ckC/step_*.h5
"$@" --train.max_steps=6 --checkpoint.dir=ckC --checkpoint.every_steps=100 --log.dir=L2 --checkpoint.resume=auto > /dev/null
python3 "$here/metrics_per_step.py" L2/metrics.jsonl 6
"$@" --train.max_steps=2 --checkpoint.dir=ckD --log.dir=L3 > /dev/null
"$@" --train.max_steps=4 --checkpoint.dir=ckD --log.dir=L3 --checkpoint.resume=auto > /dev/null
echo "extended: $(grep -c '"eval_loss":.*"step":2}' L3/metrics.jsonl) step-2 evaluation(s) kept," \
     "$(cat L3/metrics.jsonl.dropped 2>/dev/null | grep -c . || true) record(s) moved"
