#!/usr/bin/env python3
"""sft_trl_forms.py EXPECTED.jsonl DEFAULT.jsonl ALL.jsonl INPUT.jsonl: `mgrl render` of tests/data/sft_trl/input.jsonl (with the
default train.completion_only_loss, and with it false) against trl's SFTTrainer (expected.jsonl,
tools/make_sft_trl_fixtures.py): every line's tokens equal; the loss positions equal trl's defaults for the
prompt-completion and text lines at the default, and for the {"messages"} line (trl trains the whole conversation by
default) with completion_only_loss = false. Prints one line per input line and "all as trl" at the end, or exits 1."""
import json
import sys

exp = [json.loads(line) for line in open(sys.argv[1])]
default = [json.loads(line) for line in open(sys.argv[2])]
whole = [json.loads(line) for line in open(sys.argv[3])]
ok = len(exp) == len(default) == len(whole)
for i, e in enumerate(exp):
    use = whole[i] if "messages" in open(sys.argv[4]).readlines()[i] else default[i]
    same_tokens = default[i]["tokens"] == e["tokens"] and whole[i]["tokens"] == e["tokens"]
    same_loss = use["assistant_mask"][1:] == e["loss"][1:]
    print(f"line {i + 1}: tokens {'equal' if same_tokens else 'DIFFER'}, loss positions {'equal' if same_loss else 'DIFFER'}")
    ok = ok and same_tokens and same_loss
print("all as trl" if ok else "not as trl")
sys.exit(0 if ok else 1)
