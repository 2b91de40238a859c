#!/usr/bin/env bash
# adapter_dropout.sh WORK ADAPTER -- MGRL SFT ARGS...: training on from a PEFT adapter whose lora_dropout is 0.5 uses it
# (as PEFT does) unless lora.dropout is given: the first step's loss differs from the same run with --lora.dropout=0,
# which equals a run from the adapter with lora_dropout 0; the exported adapter says 0.5. Until 2026-11-29 the
# adapter's dropout was ignored (lora.dropout's default 0 held) and its export said 0.0.
set -uo pipefail
work=$1 adapter=$2
shift 2
[ "$1" = -- ] && shift
rm -rf "$work" && mkdir -p "$work/drop" "$work/none" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
for d in drop none; do
  cp "$adapter/adapter_model.safetensors" "$work/$d/"
  p=0.5
  [ "$d" = none ] && p=0.0
  sed "s/\"lora_dropout\": *[0-9.e-]*/\"lora_dropout\": $p/" "$adapter/adapter_config.json" > "$work/$d/adapter_config.json"
done
grep -q '"lora_dropout": 0.5' "$work/drop/adapter_config.json" || fail "could not set the adapter's lora_dropout"
loss() { sed -n 's/.*"loss":\([-0-9.e]*\).*/\1/p' "$1/metrics.jsonl" | head -n 1; }
"$@" --lora.adapter="$work/drop" --log.dir="$work/a" --checkpoint.dir="$work/a/ck" > /dev/null 2>&1 || fail "run a: exit $?"
"$@" --lora.adapter="$work/drop" --lora.dropout=0 --log.dir="$work/b" > /dev/null 2>&1 || fail "run b: exit $?"
"$@" --lora.adapter="$work/none" --log.dir="$work/c" > /dev/null 2>&1 || fail "run c: exit $?"
la=$(loss "$work/a") lb=$(loss "$work/b") lc=$(loss "$work/c")
echo "step-1 loss: adapter dropout 0.5 $la, --lora.dropout=0 $lb, adapter dropout 0 $lc"
[ -n "$la" ] && [ "$la" != "$lb" ] || fail "the adapter's dropout did not act"
[ "$lb" = "$lc" ] || fail "--lora.dropout=0 is not the run without dropout"
"${@:1:1}" export --checkpoint.dir="$work/a/ck" --export.output="$work/exp" > /dev/null 2>&1 || fail "export: exit $?"
grep -q '"lora_dropout": 0.5' "$work/exp/adapter_config.json" || fail "the export does not say lora_dropout 0.5"
echo "PASS: the adapter's lora_dropout trains on and is exported"
