#!/usr/bin/env bash
# loss_scaling.sh: dynamic loss scaling end to end on the CPU backend (f32, so scaling by a power of two is exact).
#   loss_scaling.sh CASE WORK CHECK_TRAIN [CASE ARGS] -- LAUNCH...   LAUNCH: the mgrl sft/grpo command line (with mpiexec for
#   several ranks), without --train.max_steps, --checkpoint.dir or --log.dir, which this adds (STEPS: run length,
#   default 6).
# Cases:
#   same_as_off       dynamic scaling (growth every step: the scale changes all the time) trains bit for bit the
#                     weights, moments and losses of a run without scaling.
#   overflow R N [P]  MGRL_FAULT_INJECT=P (grad_overflow, default; grad_overflow_local: after the allreduce, on rank R's
#                     copy only, so that only the ranks' agreement makes the others skip) on rank R at step N against
#                     the same run without it. "Identical
#                     otherwise" means: steps 1..N-1 give bitwise the same checkpoints (weights, AdamW moments, data
#                     cursor); step N computes the same loss (same weights, same batch) but changes nothing: the
#                     weights and moments after N are bitwise those after N-1 of the run without the fault; the scale
#                     halves at N (metrics: overflow 1 at N only), the step line and job_summary.txt say so; every
#                     rank skipped, as the checkpoint written after every step compares a hash of every rank's
#                     weights. After N the runs differ by design: the batch of step N is not retried (the data order
#                     is the same, so the injected run trains batch k at step k for every k != N).
#   resume R N S      the overflow run stopped after step S (> N) and resumed: the same final weights, bit for bit,
#                     and the same loss scale, overflow count and clean-step count (so the scale grows at the same
#                     step) as without the stop.
#   min_scale         overflows down to train.loss_scale_min (init 4, min 1: two overflows) do not count toward
#                     train.max_nonfinite_steps (2); the overflows at the minimum do, and stop the run with exit 2.
#   nan_loss          a non-finite loss (train.lr 1e30 wrecks the weights at step 1) is divergence, not an
#                     overflow: the scale stays, and train.max_nonfinite_steps (3) stops the run as without scaling.
set -euo pipefail
case_=$1 work=$2 check=$3
shift 3
args=()
while [ "$1" != -- ]; do args+=("$1"); shift; done
shift
steps=${STEPS:-6}
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
ck() { printf '%s/step_%08d.h5' "$1" "$2"; }
launch=("$@")
train() {  # train NAME [extra mgrl args...]: into $work/NAME (a checkpoint every step), output in $work/NAME.log
  local name=$1
  shift
  "${launch[@]}" --train.max_steps="$steps" --checkpoint.every_steps=1 --checkpoint.dir="$work/$name" \
    --log.dir="$work/$name" "$@" > "$work/$name.log" 2>&1
}
field() { "$check" field "$work/$1/metrics.jsonl" "$2" | sed 's/^check_train: [^:]*: *//'; }
dyn=(--train.loss_scaling=dynamic)

case "$case_" in
  same_as_off)
    train off --train.loss_scaling=off
    train dyn "${dyn[@]}" --train.loss_scale_growth_interval=1
    ! grep -q loss_scale "$work/off/metrics.jsonl" || fail "a run without loss scaling reports a loss scale"
    want=""
    for i in $(seq 1 "$steps"); do want="$want $((65536 << i))"; done
    [ "$(field dyn loss_scale)" = "${want# }" ] || fail "loss scale of the dynamic run: $(field dyn loss_scale), want ${want# }"
    "$check" weights "$(ck "$work/off" "$steps")" "$(ck "$work/dyn" "$steps")" --exact || fail "weights differ"
    "$check" losses "$work/off/metrics.jsonl" "$work/dyn/metrics.jsonl" --after=0 || fail "losses differ"
    "$check" losses "$work/off/metrics.jsonl" "$work/dyn/metrics.jsonl" --after=0 --key=grad_norm || fail "norms differ"
    echo "PASS: dynamic loss scaling (scale ${want# }) trains bit for bit the weights of a run without it"
    ;;
  overflow)
    r=${args[0]} n=${args[1]} point=${args[2]:-grad_overflow}
    train a "${dyn[@]}"
    MGRL_FAULT_INJECT="$point:rank=$r:step=$n" train b "${dyn[@]}" || fail "the run with the fault: $(grep '^mgrl' "$work/b.log")"
    for k in $(seq 1 $((n - 1))); do
      "$check" weights "$(ck "$work/a" "$k")" "$(ck "$work/b" "$k")" --exact > /dev/null || fail "step $k differs"
    done
    "$check" weights "$(ck "$work/a" $((n - 1)))" "$(ck "$work/b" "$n")" --exact --any-step ||
      fail "step $n changed the weights or moments"
    "$check" losses "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" --after=0 --until="$n" || fail "losses up to $n"
    ! "$check" weights "$(ck "$work/a" "$n")" "$(ck "$work/b" "$n")" --exact --any-step > /dev/null ||
      fail "the run without the fault did not change the weights at step $n either"
    want_over="" want_scale=""
    for i in $(seq 1 "$steps"); do
      want_over="$want_over $([ "$i" = "$n" ] && echo 1 || echo 0)"
      want_scale="$want_scale $([ "$i" -ge "$n" ] && echo 32768 || echo 65536)"
    done
    [ "$(field b overflow)" = "${want_over# }" ] || fail "overflow per step: $(field b overflow)"
    [ "$(field b loss_scale)" = "${want_scale# }" ] || fail "loss scale per step: $(field b loss_scale)"
    [ "$(field a overflow_steps | tr -d ' 0')" = "" ] || fail "the run without the fault overflowed"
    "$check" state "$(ck "$work/b" "$steps")" | grep -q "skipped 1, overflowed 1, loss scale 32768," ||
      fail "final state: $("$check" state "$(ck "$work/b" "$steps")")"
    grep -Eq "^step $n/$steps \| .*grad norm inf \| .* \| scale 32768 \| overflows 1 \| skipped 1$" "$work/b.log" ||
      fail "step line of step $n: $(grep "^step $n/" "$work/b.log")"
    grep -q "^loss scaling: dynamic, scale 32768 at the end; 1 step overflowed (skipped, scale halved)$" \
      "$work/b/job_summary.txt" || fail "job_summary.txt: $(cat "$work/b/job_summary.txt")"
    echo "PASS: an overflow injected ($point) on rank $r at step $n skipped exactly that step on every rank and halved the scale;" \
         "steps 1..$((n - 1)) and the loss of step $n are those of the run without it"
    ;;
  resume)
    r=${args[0]} n=${args[1]} s=${args[2]}
    export MGRL_FAULT_INJECT="grad_overflow:rank=$r:step=$n"
    grow=(--train.loss_scale_growth_interval=3)
    train a "${dyn[@]}" "${grow[@]}"
    train b "${dyn[@]}" "${grow[@]}" --train.stop_at_step="$s"
    "$check" state "$(ck "$work/b" "$s")" | grep -q "skipped 1, overflowed 1, loss scale 32768, clean steps $((s - n)), " ||
      fail "the checkpoint of step $s: $("$check" state "$(ck "$work/b" "$s")")"
    train b "${dyn[@]}" "${grow[@]}" --checkpoint.resume=auto
    grep -q "resumed from .*step_$(printf %08d "$s").h5" "$work/b.log" || fail "not resumed: $(cat "$work/b.log")"
    "$check" weights "$(ck "$work/a" "$steps")" "$(ck "$work/b" "$steps")" --exact || fail "final weights differ"
    for key in loss loss_scale overflow overflow_steps skipped_steps; do
      "$check" losses "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" --after="$s" --key=$key > /dev/null ||
        fail "$key after the resume differs"
    done
    sa=$("$check" state "$(ck "$work/a" "$steps")") sb=$("$check" state "$(ck "$work/b" "$steps")")
    [ "$sa" = "$sb" ] || fail "final states differ: $sa / $sb"
    echo "PASS: stopped after step $s (overflow at $n) and resumed: the same weights, bit for bit, and the same" \
         "scaler (${sa#check_train: })"
    ;;
  min_scale)
    rc=0
    MGRL_FAULT_INJECT="grad_overflow:rank=0:step=2:count=100" train m "${dyn[@]}" --train.loss_scale_init=4 \
      --train.loss_scale_min=1 --train.max_nonfinite_steps=2 || rc=$?
    [ "$rc" = 2 ] || fail "exit code $rc, expected 2: $(tail -n 3 "$work/m.log")"
    grep -q "^mgrl: error: steps 4 to 5: 2 steps in a row had a non-finite loss or gradient norm (with loss scaling: a non-finite loss, or gradients that overflow even at train.loss_scale_min) (train.max_nonfinite_steps = 2): the run diverged and stops (lower train.lr?); the last checkpoint before it: .*/step_00000003.h5$" \
      "$work/m.log" || fail "message: $(grep '^mgrl:' "$work/m.log")"
    [ "$(field m loss_scale)" = "4 2 1 1 1" ] || fail "loss scale per step: $(field m loss_scale)"
    [ "$(field m overflow)" = "0 1 1 0 0" ] || fail "overflow per step: $(field m overflow)"
    echo "PASS: overflows down to the minimum scale did not count; at the minimum they did and stopped the run"
    ;;
  nan_loss)
    rc=0
    train n "${dyn[@]}" --train.lr=1e30 --train.max_nonfinite_steps=3 || rc=$?
    [ "$rc" = 2 ] || fail "exit code $rc, expected 2"
    grep -q "^mgrl: error: steps 2 to 4: 3 steps in a row had a non-finite loss or gradient norm (with loss scaling" \
      "$work/n.log" || fail "message: $(grep '^mgrl:' "$work/n.log")"
    [ "$(field n loss_scale)" = "65536 65536 65536 65536" ] || fail "loss scale per step: $(field n loss_scale)"
    [ "$(field n overflow_steps)" = "0 0 0 0" ] || fail "overflows: $(field n overflow_steps)"
    echo "PASS: a non-finite loss is divergence, not an overflow: the scale stayed at 65536"
    ;;
  *) fail "unknown case $case_" ;;
esac
