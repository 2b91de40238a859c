#!/usr/bin/env bash
# vlm.sh WORK MGRL CHECK MODELS DATA TOKENIZER: Gemma 3's vision-language checkpoint (Gemma3ForConditionalGeneration)
# trained text only, end to end, on the Hub's layout (tests/data/models/gemma3_vlm_hub: transformers 4.50's tensor
# names, a minimal text_config):
# - SFT trains the language model (the start-up line says the vision tower is not loaded) and its loss falls;
# - the exported adapter carries the language model's module names (model.language_model.layers..., as PEFT 0.21
#   writes them over transformers 5.24) and the target_modules expression that spares the vision tower;
# - the merged model keeps the base's tensor names and its vision tower byte for byte, and scores as base + adapter;
# - a full fine-tuning's export is the whole checkpoint again: the language model under the base's names, the vision
#   tower copied through, scoring as the checkpoint it came from.
set -uo pipefail
work=$1 mgrl=$2 check=$3 models=$4 data=$5 tok=$6
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
base="$models/gemma3_vlm_hub"
common=(--runtime.backend=cpu --model.path="$base" --model.tokenizer="$tok" --data.input="$data/sft/train.jsonl"
  --train.batch_size=8 --train.lr=1e-2 --lora.r=4 --lora.alpha=8 --checkpoint.resume=none)
score=(score --runtime.backend=cpu --data.input="$data/score/gemma3_text.jsonl")
# The tensor names of a safetensors file (its JSON header), sorted.
header() { head -c 200000 "$1" | tr -c '[:print:]' '\n' | grep -o '"[A-Za-z_.0-9]*":{' | sed 's/":{//;s/"//' |
  grep -v '^__metadata__$' | sort; }

"$mgrl" sft "${common[@]}" --train.max_steps=20 --log.dir="$work/sft" --checkpoint.dir="$work/sft/ck" > "$work/sft.log" 2>&1 ||
  fail "sft: $(tail -n 3 "$work/sft.log")"
grep -q "Gemma3ForConditionalGeneration: its language model, text only (the 34 tensors of the vision tower and projector are not loaded)" "$work/sft.log" ||
  fail "no vision-tower line: $(head -n 5 "$work/sft.log")"
grep -q "^sft: pretrained Gemma3ForConditionalGeneration (its language model), " "$work/sft.log" ||
  fail "start-up line: $(grep '^sft:' "$work/sft.log")"
"$check" falls "$work/sft/metrics.jsonl" --factor=0.9 || fail "the loss did not fall"
"$mgrl" export --checkpoint.dir="$work/sft/ck" --export.output="$work/out" --export.merged=true > "$work/export.log" 2>&1 ||
  fail "export: $(tail -n 3 "$work/export.log")"
names=$(header "$work/out/adapter_model.safetensors")
n=$(echo "$names" | grep -c '^base_model\.model\.model\.language_model\.layers\.[0-9]*\.\(self_attn\|mlp\)\.[a-z_]*\.lora_[AB]\.weight$')
[ "$n" = 98 ] && [ "$(echo "$names" | wc -l)" = 98 ] || fail "adapter tensor names ($n of the language model): $names"
grep -q '"target_modules": "model\\\\.language_model\\\\.layers\\\\.\\\\d+\\\\.(self_attn|mlp)\\\\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"' \
  "$work/out/adapter_config.json" || fail "target_modules: $(grep -A1 target_modules "$work/out/adapter_config.json")"
echo "adapter: 98 tensors with the language model's module names, target_modules sparing the vision tower"
merged=$(header "$work/out/merged/model.safetensors")
want=$(header "$base/model.safetensors")
[ "$merged" = "$want" ] || fail "the merged model's tensor names differ from the base's"
out=$("$check" tensors "$base" "$work/out/merged" vision_tower. multi_modal_projector.) || fail "merged vision tower: $out"
echo "$out" | grep -q "34 tensors the same byte for byte, 0 not" || fail "merged vision tower: $out"
"$mgrl" "${score[@]}" --model.path="$base" --lora.adapter="$work/out" --score.output="$work/a.h5" > /dev/null 2>&1 || fail "score a"
"$mgrl" "${score[@]}" --model.path="$work/out/merged" --score.output="$work/m.h5" > /dev/null 2>&1 || fail "score m"
"$check" scores "$work/a.h5" "$work/m.h5" --rtol=1e-5 || fail "merged and base + adapter score differently"
grep -q '"Gemma3ForConditionalGeneration"' "$work/out/merged/config.json" || fail "merged config.json"
echo "merged: the base's $(echo "$want" | wc -l) tensor names, scoring as base + adapter"

"$mgrl" sft "${common[@]}" --train.full_finetune=true --train.lr=1e-3 --train.max_steps=3 --log.dir="$work/full" \
  --checkpoint.dir="$work/full/ck" > "$work/full.log" 2>&1 || fail "full sft: $(tail -n 3 "$work/full.log")"
"$mgrl" export --checkpoint.dir="$work/full/ck" --export.output="$work/fullout" > "$work/fullexport.log" 2>&1 ||
  fail "full export: $(tail -n 3 "$work/fullexport.log")"
[ "$(header "$work/fullout/model.safetensors")" = "$want" ] || fail "the full export's tensor names differ from the base's"
out=$("$check" tensors "$base" "$work/fullout" vision_tower. multi_modal_projector.) || fail "full export's vision tower: $out"
"$mgrl" "${score[@]}" --model.path="$work/fullout" --score.output="$work/f.h5" > /dev/null 2>&1 || fail "score f"
"$mgrl" "${score[@]}" --model.path="$base" --score.output="$work/b.h5" > /dev/null 2>&1 || fail "score b"
"$check" scores "$work/f.h5" "$work/b.h5" --rtol=1e-5 > /dev/null 2>&1 && fail "the full fine-tuning changed nothing"
echo "full fine-tuning: exported with the base's tensor names"
echo "PASS: vision-language checkpoint"
