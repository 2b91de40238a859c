#!/bin/bash
# generation_config.sh MGRL MODELS QUICKSTART_TOKENIZER PROMPTS OUT: `mgrl generate` takes generation_config.json's
# sampling settings for the generate.* keys not given, as transformers' generate reads them:
#  - a copy of llama_gqa whose file asks for sampling (temperature 0.6, top_k 5, top_p 0.9, repetition_penalty 1.3)
#    writes the bytes of a run given those keys with generate.use_generation_config = false;
#  - a key given wins (top_k 0: the bytes of the keys without top_k; and not those of the file's top_k 5);
#  - a file without do_sample is greedy (the bytes of temperature 0);
#  - a file that asks for sampling without top_k samples with transformers' 50;
#  - a bad value in the file is one line naming it, exit 2.
set -euo pipefail
mgrl=$1 models=$2 tok=$3 prompts=$4 out=$5
rm -rf "$out" && mkdir -p "$out"
for d in sampling greedy nok bad; do cp -r "$models/llama_gqa" "$out/$d"; done
edit() {  # edit FILE PYTHON-DICT-UPDATE
  python3 - "$1" "$2" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
g.update(json.loads(sys.argv[2]))
json.dump(g, open(sys.argv[1], "w"))
PY
}
edit "$out/sampling/generation_config.json" '{"do_sample": true, "temperature": 0.6, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.3}'
edit "$out/nok/generation_config.json" '{"do_sample": true, "temperature": 0.7}'
edit "$out/bad/generation_config.json" '{"do_sample": true, "temperature": "hot"}'
run() { "$mgrl" generate --runtime.backend=cpu --lora.adapter="$models/llama_gqa" --model.tokenizer="$tok" \
  --data.input="$prompts" --generate.max_new_tokens=8 --generate.num_generations=2 --generate.seed=3 "$@"; }
run --model.path="$out/sampling" --generate.output="$out/file.jsonl"
run --model.path="$out/sampling" --generate.use_generation_config=false --generate.temperature=0.6 --generate.top_k=5 \
  --generate.top_p=0.9 --generate.repetition_penalty=1.3 --generate.output="$out/keys.jsonl" > /dev/null
cmp "$out/file.jsonl" "$out/keys.jsonl" && echo "file = keys"
run --model.path="$out/sampling" --generate.top_k=0 --generate.output="$out/k0.jsonl"
run --model.path="$out/sampling" --generate.use_generation_config=false --generate.temperature=0.6 --generate.top_p=0.9 \
  --generate.repetition_penalty=1.3 --generate.output="$out/k0keys.jsonl" > /dev/null
cmp "$out/k0.jsonl" "$out/k0keys.jsonl" && ! cmp -s "$out/k0.jsonl" "$out/file.jsonl" && echo "given key wins"
run --model.path="$out/greedy" --generate.output="$out/greedy.jsonl"
run --model.path="$out/greedy" --generate.use_generation_config=false --generate.temperature=0 \
  --generate.output="$out/t0.jsonl" > /dev/null
cmp "$out/greedy.jsonl" "$out/t0.jsonl" && echo "no do_sample = greedy"
run --model.path="$out/nok" --generate.output="$out/nok.jsonl"
run --model.path="$out/nok" --generate.use_generation_config=false --generate.temperature=0.7 --generate.top_k=50 \
  --generate.output="$out/k50.jsonl" > /dev/null
cmp "$out/nok.jsonl" "$out/k50.jsonl" && echo "no top_k = 50"
set +e
run --model.path="$out/bad" --generate.output="$out/bad.jsonl" 2> "$out/bad.err"
rc=$?
set -e
cat "$out/bad.err"
test $rc = 2 && test ! -e "$out/bad.jsonl" && echo "bad value refused"
