#!/usr/bin/env bash
# grpo_entropy.sh WORK CHECK MPIEXEC NUMPROC_FLAG [MPI FLAGS...] -- MGRL ARGS...: trl's entropy bonus end to end (the
# objective itself: unit.grpo_loss against trl's fixtures *_entropy_*):
# - grpo.entropy_coef 0.05 trains other weights than 0, logs entropy_coef, the same on 1 rank and on 2, and with
#   grad_accum 2 on 1 rank and on 2 (the mean is each global micro-batch's, so grad_accum changes it, as in trl);
# - adaptive control (grpo.use_adaptive_entropy) with a target every step's entropy is under: the coefficient climbs
#   by delta to entropy_coef_max (0.015, 0.02, 0.02, 0.02), the first step applies none (its weights are those of no
#   bonus), the second does; with a target never reached it falls to entropy_coef_min and never applies (the weights of
#   no bonus throughout);
# - a checkpoint at step 2 resumes the control's state: 4 steps straight equal 2 + 2, bit for bit.
set -uo pipefail
work=$1 check=$2
shift 2
rm -rf "$work" && mkdir -p "$work" || exit 1
source "$(dirname "$0")/on_ranks.sh"
take_launcher "$@"
set -- "${rest[@]}"
run plain 1 "$@"
run bonus 1 "$@" --grpo.entropy_coef=0.05
run bonus2 2 "$@" --grpo.entropy_coef=0.05
run acc 1 "$@" --grpo.entropy_coef=0.05 --train.grad_accum=2
run acc2 2 "$@" --grpo.entropy_coef=0.05 --train.grad_accum=2
"$check" weights "$(ck plain 4)" "$(ck bonus 4)" --rtol=1e-5 > /dev/null && fail "entropy_coef 0.05 trained the weights of 0"
"$check" weights "$(ck bonus 4)" "$(ck bonus2 4)" --rtol=1e-5 || fail "2 ranks differ"
"$check" weights "$(ck acc 4)" "$(ck acc2 4)" --rtol=1e-5 || fail "2 ranks with grad_accum 2 differ"
[ "$("$check" field "$work/bonus/metrics.jsonl" entropy_coef)" = "check_train: entropy_coef: 0.050000000000000003 0.050000000000000003 0.050000000000000003 0.050000000000000003" ] ||
  fail "entropy_coef metric: $("$check" field "$work/bonus/metrics.jsonl" entropy_coef)"
echo "static: acts, logged, the same on 2 ranks"
adaptive=(--grpo.use_adaptive_entropy=true --grpo.entropy_coef=0.01 --grpo.entropy_coef_delta=0.005 --grpo.entropy_coef_max=0.02)
run up 1 "$@" "${adaptive[@]}" --grpo.entropy_target=100
coefs=$("$check" field "$work/up/metrics.jsonl" entropy_coef)
[ "$coefs" = "check_train: entropy_coef: 0.014999999999999999 0.02 0.02 0.02" ] || fail "adaptive, climbing: $coefs"
"$check" weights "$(ck plain 1)" "$(ck up 1)" --rtol=1e-6 > /dev/null || fail "adaptive: the first step applied a bonus"
"$check" weights "$(ck plain 2)" "$(ck up 2)" --rtol=1e-5 > /dev/null && fail "adaptive: the second step applied none"
run down 1 "$@" "${adaptive[@]}" --grpo.entropy_target=0
coefs=$("$check" field "$work/down/metrics.jsonl" entropy_coef)
[ "$coefs" = "check_train: entropy_coef: 0.0050000000000000001 0 0 0" ] || fail "adaptive, falling: $coefs"
"$check" weights "$(ck plain 4)" "$(ck down 4)" --rtol=1e-6 > /dev/null || fail "adaptive above the target applied a bonus"
echo "adaptive: the coefficient moves by delta within its bounds, applied only after a step under the target"
run res 1 "$@" "${adaptive[@]}" --grpo.entropy_target=100 --train.stop_at_step=2
run res 1 "$@" "${adaptive[@]}" --grpo.entropy_target=100 --checkpoint.resume=auto
grep -q "resumed from .*step_00000002.h5" "$work/res.log" || fail "not resumed: $(tail -n 3 "$work/res.log")"
"$check" weights "$(ck up 4)" "$(ck res 4)" --exact || fail "resume: other weights"
"$check" losses "$work/up/metrics.jsonl" "$work/res/metrics.jsonl" --after=2 --key=entropy_coef > /dev/null ||
  fail "resume: other coefficients"
echo "PASS: entropy bonus"
