#!/usr/bin/env bash
# kill9_checkpoints.sh: SIGKILL to a training process (rank 0, the checkpoint writer) at random moments, most of
# them while a checkpoint is being written; after every kill the newest complete checkpoint must read back intact
# (mgrl's reader: checksums, sizes, finite values), and resume = auto must continue to bitwise the final weights of
# an uninterrupted run, leaving no temporary file.
#   kill9_checkpoints.sh TRIALS SEED WORK CHECK_TRAIN -- LAUNCH...
# LAUNCH: the `mgrl sft` command line of one process (this script adds the steps and the directories).
set -uo pipefail
trials=$1 seed=$2 work=$3 check=$4
shift 4
[ "$1" = -- ] && shift
steps=8
rm -rf "$work" && mkdir -p "$work"
RANDOM=$seed
fail=0 during=0 before_first=0
pid=
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null' EXIT
exec {never}<> <(:)  # a descriptor that never has input: `read -t` on it sleeps without a fork
pause() { read -r -t "$1" -u "$never" _ || true; }
common=(--train.max_steps=$steps --checkpoint.every_steps=1 --checkpoint.keep_last=2)

t0=$(date +%s.%N)
"$@" "${common[@]}" --checkpoint.dir="$work/straight" > "$work/straight.log" 2>&1 || { cat "$work/straight.log"; exit 1; }
ref="$work/straight/step_$(printf %08d $steps).h5"
run_s=$(echo "$(date +%s.%N) - $t0" | bc)

for t in $(seq "$trials"); do
  ck="$work/t$t"
  # Mode 0 (half the trials): kill as the temporary of a random step's checkpoint appears, after a random 0-1 ms;
  # mode 1: at a random moment of the run (0 .. its duration), wherever that falls; mode 2: the process kills
  # itself half way through the file (MGRL_FAULT_INJECT ...:action=kill), a kill certain to land in a write.
  mode=$((RANDOM % 4)) target=$((1 + RANDOM % (steps - 1))) delay=$(printf '0.%04d' $((RANDOM % 11)))
  mode=$((mode > 2 ? 0 : mode))
  at=$(echo "scale=4; $run_s * $((RANDOM % 1000)) / 1000" | bc)
  if [ $mode = 2 ]; then export MGRL_FAULT_INJECT="checkpoint_write:rank=0:step=$target:action=kill"; fi
  "$@" "${common[@]}" --checkpoint.dir="$ck" > "$work/t$t.log" 2>&1 &
  pid=$!
  unset MGRL_FAULT_INJECT
  if [ $mode = 0 ]; then
    tmp="$ck/step_$(printf %08d $target).h5.tmp.$pid"
    while [ ! -e "$tmp" ] && kill -0 "$pid" 2>/dev/null; do :; done
    pause "$delay"
  elif [ $mode = 1 ]; then
    pause "$at"
  fi
  [ $mode = 2 ] || kill -KILL "$pid" 2>/dev/null
  rc=0
  wait "$pid" 2>/dev/null || rc=$?
  pid=
  if [ $mode = 2 ] && [ $rc != 137 ]; then
    echo "FAIL trial $t: the injected kill did not happen (exit $rc): $(grep -v '^step' "$work/t$t.log" | tail -n 3)"
    fail=$((fail + 1))
    continue
  fi
  # A temporary left behind: the kill landed in a write.
  left=$(compgen -G "$ck/*.tmp.*" | wc -l)
  [ "$left" -gt 0 ] && during=$((during + 1))
  newest=$(ls "$ck"/step_*.h5 2>/dev/null | sort | tail -n 1)
  case $mode in
    0) how="as step $target's write began + ${delay}s" ;;
    1) how="at ${at}s" ;;
    2) how="by itself half way through step $target's file" ;;
  esac
  what="trial $t: killed $how; $left temporary left, newest ${newest##*/}"
  if [ -z "$newest" ]; then
    before_first=$((before_first + 1))
  elif ! "$check" read "$newest" > "$work/t$t.read" 2>&1; then
    echo "FAIL $what: the newest complete checkpoint does not read back: $(cat "$work/t$t.read")"
    fail=$((fail + 1))
    continue
  fi
  if ! "$@" "${common[@]}" --checkpoint.dir="$ck" --checkpoint.resume=auto > "$work/t$t.resume" 2>&1; then
    echo "FAIL $what: resume failed: $(tail -n 3 "$work/t$t.resume")"
    fail=$((fail + 1))
    continue
  fi
  if ! "$check" weights "$ref" "$ck/step_$(printf %08d $steps).h5" --exact > "$work/t$t.cmp" 2>&1; then
    echo "FAIL $what: resumed weights differ: $(cat "$work/t$t.cmp")"
    fail=$((fail + 1))
    continue
  fi
  if compgen -G "$ck/*.tmp.*" > /dev/null; then
    echo "FAIL $what: a temporary is left after the resumed run"
    fail=$((fail + 1))
    continue
  fi
  echo "ok $what; resumed $(grep -o 'resumed from [^ ]*' "$work/t$t.resume" | sed 's|.*/||' || echo 'from the start')"
  rm -rf "$ck"
done
echo "kill -9 trials: $trials, killed during a checkpoint write: $during, before the first checkpoint: $before_first, failures: $fail (seed $seed, an uninterrupted run ${run_s}s)"
[ "$fail" = 0 ]
