#!/usr/bin/env bash
# token_metrics.sh WORK EXPECTED MPIRUN... -- MGRL ARGS...: trl's SFT token metrics (entropy, mean_token_accuracy)
# of the first step against trl's own (EXPECTED: tests/data/sft_trl/metrics.json, tools/make_sft_metrics_fixtures.py),
# with the LM head's fused pass, without it (MGRL_FUSED_LM_HEAD=0) and on 2 ranks; the loss as well; and the held-out
# eval_loss, eval_entropy and eval_mean_token_accuracy at the end (ARGS give train.lr = 0: the model of trl's evaluate).
set -uo pipefail
source "$(dirname "$0")/metrics_harness.sh"
set -- "${cmd[@]}"
check() {  # NAME METRICS
  python3 - "$2" "$expected" "$1" <<'PY' || fail "$1"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
got = recs[0]
got.update([r for r in recs if "eval_loss" in r][-1])  # the held-out figures at the end (train.lr = 0: of the same model)
want = json.load(open(sys.argv[2]))
for k, tol in (("loss", 2e-6), ("entropy", 2e-6), ("mean_token_accuracy", 0.0), ("eval_loss", 2e-6),
               ("eval_entropy", 2e-6), ("eval_mean_token_accuracy", 1e-7)):
    assert k in got, "no %s in the metrics" % k
    assert abs(got[k] - want[k]) <= tol * max(1.0, abs(want[k])), "%s: %r, trl %r" % (k, got[k], want[k])
print("%s: entropy %.6f (trl %.6f), mean_token_accuracy %.4f (trl %.4f), eval_entropy %.6f (trl %.6f), "
      "eval_mean_token_accuracy %.4f (trl %.4f)" % (
    sys.argv[3], got["entropy"], want["entropy"], got["mean_token_accuracy"], want["mean_token_accuracy"],
    got["eval_entropy"], want["eval_entropy"], got["eval_mean_token_accuracy"], want["eval_mean_token_accuracy"]))
PY
}
"$@" --log.dir="$work/fused" > /dev/null 2>&1 || fail "fused: exit $?"
check fused "$work/fused/metrics.jsonl"
MGRL_FUSED_LM_HEAD=0 "$@" --log.dir="$work/plain" > /dev/null 2>&1 || fail "plain: exit $?"
check "unfused" "$work/plain/metrics.jsonl"
"${mpirun[@]}" "$@" --log.dir="$work/np2" > /dev/null 2>&1 || fail "2 ranks: exit $?"
check "2 ranks" "$work/np2/metrics.jsonl"
echo "PASS: the token metrics are trl's"
