#!/usr/bin/env bash
# kill_trials.sh: checkpoints under kill -9 (issue 13, docs/reliability.md). A 1-rank SFT run writes a checkpoint
# every step; each trial kills it with SIGKILL at a random moment (seeded), half of the trials at the moment a
# checkpoint's temporary file appears (inside a write), then resumes with checkpoint.resume=auto to the end. Every
# resume must start from a complete checkpoint (or from scratch when none was written yet) and end with weights
# bitwise equal to an uninterrupted run's.
#   kill_trials.sh TRIALS SEED WORK CHECK_TRAIN -- MGRL ARGS...   (the mgrl sft command line, without dirs)
set -uo pipefail
trials=$1 seed=$2 work=$3 check=$4
shift 4
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work"
steps=300
common=(--train.max_steps=$steps --checkpoint.every_steps=1 --checkpoint.keep_last=2)
"$@" "${common[@]}" --log.dir="$work/straight" --checkpoint.dir="$work/straight/ck" > "$work/straight.log" 2>&1 ||
  { echo "FAIL: the uninterrupted run failed"; tail "$work/straight.log"; exit 1; }
final="step_$(printf %08d $steps).h5"
RANDOM=$seed
in_write=0 resumed=0 scratch=0
for t in $(seq "$trials"); do
  d="$work/t$t"
  "$@" "${common[@]}" --log.dir="$d" --checkpoint.dir="$d/ck" > "$d.log" 2>&1 &
  pid=$!
  if (( t % 2 )); then
    # Random moment: 0-400 ms after the start (the run takes about a second).
    sleep "0.$(printf %03d $(( RANDOM % 400 )))"
  else
    # Inside a write: after a random number of temporaries seen, as soon as the next one appears.
    want=$(( RANDOM % 40 + 1 )) seen=0 last=""
    while kill -0 "$pid" 2>/dev/null; do
      tmp=$(compgen -G "$d/ck/*.h5.tmp.*" | head -n 1)
      if [ -n "$tmp" ] && [ "$tmp" != "$last" ]; then
        last=$tmp seen=$(( seen + 1 ))
        [ "$seen" -ge "$want" ] && break
      fi
    done
  fi
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  compgen -G "$d/ck/*.h5.tmp.*" > /dev/null && in_write=$(( in_write + 1 ))
  "$@" "${common[@]}" --log.dir="$d" --checkpoint.dir="$d/ck" --checkpoint.resume=auto > "$d.resume.log" 2>&1 ||
    { echo "FAIL: trial $t: the resume failed"; grep -v '^step ' "$d.resume.log" | tail; exit 1; }
  if grep -q "resumed from" "$d.resume.log"; then resumed=$(( resumed + 1 )); else scratch=$(( scratch + 1 )); fi
  "$check" weights "$work/straight/ck/$final" "$d/ck/$final" --exact > "$d.check.log" 2>&1 ||
    { echo "FAIL: trial $t: weights differ from the uninterrupted run"; cat "$d.check.log"; exit 1; }
  rm -rf "$d"  # keep the disk small over many trials (logs stay)
done
echo "kill -9 trials: $trials, $in_write killed inside a checkpoint write (temporary left), $resumed resumed from a" \
     "checkpoint, $scratch from scratch; every resume ended bitwise at the uninterrupted weights"
