#!/usr/bin/env bash
# export_cases.sh WORK MGRL SRC: `mgrl export` cases an export hunt found (2026-11-28), each failing before:
#  stale    a full model exported into a directory that holds an earlier adapter export: the adapter's files go
#           (transformers loaded the old adapter over the base instead of the exported model)
#  config   an adapter trained from lora.adapter, exported after that directory's adapter_config.json changed: the
#           exported lora_alpha is the one trained with (the checkpoint keeps it)
#  base     a merge into a base replaced since training: refused (exit 2); checkpoint.allow_other_base merges with a
#           warning; an adapter over model.init = "random" weights: refused
#  dtype    merged_dtype = float32 over a bf16 base, and a full fine-tuning of it: config.json's dtype and
#           torch_dtype are float32 (transformers 5 reads dtype: it loaded them in bf16)
#  paths    a full fine-tuning exported from another working directory than its run's relative paths: exit 2
#           naming config.json (only model.safetensors was written)
#  chat     a run with chat.template: its template is exported as chat_template.jinja
#  builtin  a LoRA run with train.chat_format = chatml: the adapter's directory gets the tokenizer's files and the
#           format as chat_template.jinja, which renders prompts exactly as the run formatted them (an adapter went
#           without a tokenizer, and a built-in format's run exported no template or the tokenizer's other one)
set -uo pipefail
work=$1 mgrl=$2 src=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
m=$src/tests/data/models/qwen2_bias_tied
sft=("$mgrl" sft --runtime.backend=cpu --runtime.threads=1 --model.tokenizer="$src/inputs/quickstart"
     --data.input="$src/tests/data/sft/train.jsonl" --train.batch_size=8 --train.max_steps=2 --lora.r=4 --lora.alpha=8
     --log.dir=)
q() { "$@" > /dev/null 2> err.txt; }
# stale
q "${sft[@]}" --model.path="$m" --checkpoint.dir=lora || fail "lora run"
q "${sft[@]}" --model.path="$m" --train.full_finetune=true --checkpoint.dir=full || fail "full run"
q "$mgrl" export --checkpoint.dir=lora --export.output=out || fail "lora export"
q "$mgrl" export --checkpoint.dir=full --export.output=out || fail "full export"
[ ! -e out/adapter_config.json ] && [ ! -e out/adapter_model.safetensors ] && [ -e out/model.safetensors ] ||
  fail "stale: $(ls out | tr '\n' ' ')"
echo "stale: ok"
# config
q "$mgrl" export --checkpoint.dir=lora --export.output=start || fail "start adapter"
q "${sft[@]}" --model.path="$m" --lora.adapter="$work/start" --checkpoint.dir=chain || fail "chain run"
sed -i 's/"lora_alpha": *[0-9.]*/"lora_alpha": 32.0/' start/adapter_config.json
q "$mgrl" export --checkpoint.dir=chain --export.output=chain_out || fail "chain export"
grep -Eq '"lora_alpha": *8(\.0)?[,}]' chain_out/adapter_config.json || fail "config: $(grep lora_alpha chain_out/adapter_config.json)"
echo "config: ok"
# base
cp -r "$m" base && rm -f base/adapter_config.json base/adapter_model.safetensors
q "${sft[@]}" --model.path="$work/base" --checkpoint.dir=swap || fail "swap run"
cp out/model.safetensors base/model.safetensors
q "$mgrl" export --checkpoint.dir=swap --export.output=swap_out --export.merged=true && fail "base: a merge into another base passed"
grep -q "trained over other base weights than .*base holds now (tensor '" err.txt || fail "base: $(cat err.txt)"
[ ! -e swap_out/merged ] || fail "base: merged/ written"
q "$mgrl" export --checkpoint.dir=swap --export.output=swap_out --export.merged=true --checkpoint.allow_other_base=true ||
  fail "base: allow_other_base"
grep -q "merging into these (checkpoint.allow_other_base)" err.txt || fail "base: no warning"
q "${sft[@]}" --model.path="$m" --model.init=random --checkpoint.dir=rand || fail "random run"
q "$mgrl" export --checkpoint.dir=rand --export.output=rand_out && fail "base: random-init adapter exported"
grep -q 'trained the adapter over random weights' err.txt || fail "base: $(cat err.txt)"
echo "base: ok"
# dtype
d=$src/tests/data/nf4/llama_dense
q "$mgrl" sft --runtime.backend=cpu --runtime.threads=1 --model.path="$d" --data.input="$src/tests/data/sft/train.jsonl" \
  --model.tokenizer="$src/inputs/quickstart" --train.batch_size=8 --train.max_steps=1 --lora.r=4 --log.dir= --checkpoint.dir=bf ||
  fail "bf16 run: $(cat err.txt)"
q "$mgrl" export --checkpoint.dir=bf --export.output=bf_out --export.merged=true --export.merged_dtype=float32 || fail "bf16 export"
python3 -c "import json,sys; c=json.load(open('bf_out/merged/config.json')); sys.exit(0 if c.get('dtype')=='float32' and c.get('torch_dtype')=='float32' else 1)" ||
  fail "dtype: $(grep dtype bf_out/merged/config.json)"
q "$mgrl" sft --runtime.backend=cpu --runtime.threads=1 --model.path="$d" --data.input="$src/tests/data/sft/train.jsonl" \
  --model.tokenizer="$src/inputs/quickstart" --train.batch_size=8 --train.max_steps=1 --train.full_finetune=true --log.dir= --checkpoint.dir=bff ||
  fail "bf16 full run: $(cat err.txt)"
q "$mgrl" export --checkpoint.dir=bff --export.output=bff_out || fail "bf16 full export"
python3 -c "import json,sys; c=json.load(open('bff_out/config.json')); sys.exit(0 if c.get('dtype')=='float32' and c.get('torch_dtype')=='float32' else 1)" ||
  fail "dtype (full): $(grep dtype bff_out/config.json)"
echo "dtype: ok"
# paths
mkdir -p rel && cp -r "$m" rel/relbase && cp -r "$src/inputs/quickstart" rel/reltok
(cd rel && q "$mgrl" sft --runtime.backend=cpu --runtime.threads=1 --model.path=relbase --model.tokenizer=reltok \
  --data.input="$src/tests/data/sft/train.jsonl" --train.batch_size=8 --train.max_steps=1 --train.full_finetune=true \
  --log.dir= --checkpoint.dir=ck) || fail "rel run"
rc=0; "$mgrl" export --checkpoint.dir=rel/ck --export.output=rel_out > /dev/null 2> err.txt || rc=$?
[ "$rc" = 2 ] && grep -q "relbase/config.json: not found (model.path of the run" err.txt || fail "paths: exit $rc: $(cat err.txt)"
[ ! -e rel_out/model.safetensors ] || fail "paths: weights written alone"
echo "paths: ok"
# chat
q "${sft[@]}" --model.path="$m" --train.full_finetune=true --data.input="$src/tests/data/sft/chat.jsonl" \
  --chat.template="$src/tests/data/sft/chat_template.jinja" --checkpoint.dir=chat || fail "chat run: $(cat err.txt)"
q "$mgrl" export --checkpoint.dir=chat --export.output=chat_out || fail "chat export"
cmp -s chat_out/chat_template.jinja "$src/tests/data/sft/chat_template.jinja" || fail "chat: no chat_template.jinja"
echo "chat: ok"
# builtin
for i in 1 2 3 4 5 6 7 8; do
  echo "{\"messages\": [{\"role\": \"system\", \"content\": \"Add.\"}, {\"role\": \"user\", \"content\": \"$i+$i=\"}, {\"role\": \"assistant\", \"content\": \"$((i + i))\"}]}"
done > convs.jsonl
sed 's/, {"role": "assistant", "content": "[0-9]*"}]}/]}/' convs.jsonl > prompts.jsonl
q "${sft[@]}" --model.path="$m" --data.input=convs.jsonl --train.chat_format=chatml --checkpoint.dir=builtin ||
  fail "builtin run: $(cat err.txt)"
q "$mgrl" export --checkpoint.dir=builtin --export.output=builtin_out || fail "builtin export: $(cat err.txt)"
[ -e builtin_out/tokenizer.json ] && [ -e builtin_out/adapter_model.safetensors ] || fail "builtin: $(ls builtin_out | tr '\n' ' ')"
render=("$mgrl" render --model.path="$m" --model.tokenizer="$src/inputs/quickstart" --data.input=prompts.jsonl)
"${render[@]}" --train.chat_format=chatml > as_run.jsonl 2> err.txt || fail "builtin: render: $(cat err.txt)"
"${render[@]}" --chat.template=builtin_out/chat_template.jinja > as_export.jsonl 2> err.txt || fail "builtin: render: $(cat err.txt)"
[ "$(wc -l < as_run.jsonl)" = 8 ] && grep -q '"use":"prompt"' as_run.jsonl && cmp -s as_run.jsonl as_export.jsonl ||
  fail "builtin: the exported template renders otherwise: $(diff as_run.jsonl as_export.jsonl | head -c 600)"
echo "builtin: ok"
echo "PASS: export cases"
