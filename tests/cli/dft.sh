#!/usr/bin/env bash
# dft.sh WORK EXPECTED MPIRUN... -- MGRL ARGS...: trl's SFT loss_type = "dft" (each completion token's loss times its
# detached probability) for one step against trl's own (EXPECTED: tests/data/sft_trl/metrics_dft.json,
# tools/make_sft_metrics_fixtures.py): the loss, the gradient norm (the gradient is p x d(-log p): a wrong weight or a
# gradient through p shows there), entropy and mean_token_accuracy (of the plain distribution, as trl logs them), on
# 1 rank, on 2, and with 2 micro-batches; and the plain loss (train.loss_type = nll) is another number.
set -uo pipefail
source "$(dirname "$0")/metrics_harness.sh"
set -- "${cmd[@]}"
check() {  # NAME METRICS
  python3 - "$2" "$expected" "$1" <<'PY' || fail "$1"
import json, sys
got = json.loads(open(sys.argv[1]).readline())
want = json.load(open(sys.argv[2]))
for k, tol in (("loss", 2e-6), ("grad_norm", 1e-5), ("entropy", 2e-6), ("mean_token_accuracy", 0.0)):
    assert k in got, "no %s in the metrics" % k
    assert abs(got[k] - want[k]) <= tol * max(1.0, abs(want[k])), "%s: %r, trl %r" % (k, got[k], want[k])
print("%s: dft loss %.7f (trl %.7f), grad_norm %.7f (trl %.7f)" % (sys.argv[3], got["loss"], want["loss"],
                                                                   got["grad_norm"], want["grad_norm"]))
PY
}
"$@" --train.loss_type=dft --log.dir="$work/np1" > /dev/null 2>&1 || fail "1 rank: exit $?"
check "1 rank" "$work/np1/metrics.jsonl"
"${mpirun[@]}" "$@" --train.loss_type=dft --log.dir="$work/np2" > /dev/null 2>&1 || fail "2 ranks: exit $?"
check "2 ranks" "$work/np2/metrics.jsonl"
"$@" --train.loss_type=dft --train.grad_accum=2 --log.dir="$work/acc2" > /dev/null 2>&1 || fail "grad_accum 2: exit $?"
check "grad_accum 2" "$work/acc2/metrics.jsonl"
"$@" --log.dir="$work/nll" > /dev/null 2>&1 || fail "nll: exit $?"
python3 - "$work/nll/metrics.jsonl" "$expected" <<'PY' || fail "nll"
import json, sys
got = json.loads(open(sys.argv[1]).readline())
assert abs(got["loss"] - json.load(open(sys.argv[2]))["loss"]) > 0.1, "the nll loss is the dft one"
PY
echo "PASS: the dft step is trl's"
