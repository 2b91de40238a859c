#!/usr/bin/env python3
"""make_sft_trl_fixtures.py: what trl's SFTTrainer trains on, line by line, for tests/data/sft_trl/input.jsonl (each
form trl reads: prompt-completion strings with a token merging across the boundary and a completion ending in EOS,
language modeling text, conversational prompt-completion with and without per-line chat_template_kwargs, messages
with tool calls and a tools column), through tests/data/sft_trl/tools.jinja and the qwen2_bytelevel fixture tokenizer.
Writes tests/data/sft_trl/expected.jsonl: per line {"tokens": input_ids, "loss": [0/1 per position: trl's label is
not -100, position 0 left out as the shift drops it]} under trl's defaults (completion_only_loss None = on for
prompt-completion, assistant_only_loss off). cli.sft.trl_forms_as_trl compares `mgrl render` with it. And with
SFTConfig.eos_token = "<|endoftext|>": eos_expected.jsonl (cli.sft.eos_token_as_trl).
    /work/venv-fixtures/bin/python tools/make_sft_trl_fixtures.py     (trl 1.16.0, transformers 5.24.0)"""
import copy
import json
import os
import tempfile

import torch
import transformers
import trl
from datasets import Dataset
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
data = os.path.join(root, "tests", "data", "sft_trl")
tok = AutoTokenizer.from_pretrained(os.path.join(root, "tests", "data", "tokenizers", "qwen2_bytelevel"))
tok.chat_template = open(os.path.join(data, "tools.jinja"), encoding="utf-8").read()
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256))
rows = [json.loads(line) for line in open(os.path.join(data, "input.jsonl"), encoding="utf-8")]
out = []
with tempfile.TemporaryDirectory() as tmp:
    for row in rows:  # one dataset a line: trl reads one format per dataset
        args = trl.SFTConfig(output_dir=tmp, report_to=[], max_length=256, use_cpu=True, bf16=False)
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list([row]), processing_class=tok)
        ex = trainer.train_dataset[0]
        ids = list(ex["input_ids"])
        batch = trainer.data_collator([ex])
        labels = batch["labels"][0].tolist()
        loss = [0] + [int(x != -100) for x in labels[1:]]
        out.append({"tokens": ids, "loss": loss})
with open(os.path.join(data, "expected.jsonl"), "w", encoding="utf-8") as f:
    for o in out:
        f.write(json.dumps(o) + "\n")
# DPO: dpo_input.jsonl (a tool-call chosen with a tools column, an implicit prompt of messages, per-line
# chat_template_kwargs, an implicit prompt of texts) as trl's DPOTrainer tokenizes it: dpo_expected.jsonl holds each
# line's prompt_ids, chosen_ids, rejected_ids (unit.dpo DpoPairs.TrlFormsAsTrl)
dpo_rows = [json.loads(line) for line in open(os.path.join(data, "dpo_input.jsonl"), encoding="utf-8")]
with tempfile.TemporaryDirectory() as tmp, open(os.path.join(data, "dpo_expected.jsonl"), "w", encoding="utf-8") as f:
    for row in dpo_rows:
        args = trl.DPOConfig(output_dir=tmp, report_to=[], use_cpu=True, bf16=False, max_length=256)
        trainer = trl.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args,
                                 train_dataset=Dataset.from_list([row]), processing_class=tok)
        ex = trainer.train_dataset[0]
        f.write(json.dumps({k: list(ex[k]) for k in ("prompt_ids", "chosen_ids", "rejected_ids")}) + "\n")
# SFTConfig.eos_token = "<|endoftext|>" (the tokenizer's EOS is <|im_end|>): eos_expected.jsonl, as expected.jsonl.
# Last: trl sets the tokenizer's eos_token to it.
# (cli.sft.eos_token_as_trl compares `mgrl render --train.eos_token=<|endoftext|>` with it).
with tempfile.TemporaryDirectory() as tmp, open(os.path.join(data, "eos_expected.jsonl"), "w", encoding="utf-8") as f:
    for row in rows:
        args = trl.SFTConfig(output_dir=tmp, report_to=[], max_length=256, use_cpu=True, bf16=False,
                             eos_token="<|endoftext|>")
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list([row]), processing_class=tok)
        ex = trainer.train_dataset[0]
        labels = trainer.data_collator([ex])["labels"][0].tolist()
        f.write(json.dumps({"tokens": list(ex["input_ids"]), "loss": [0] + [int(x != -100) for x in labels[1:]]}) + "\n")
with open(os.path.join(data, "VERSIONS"), "w") as f:
    f.write(f"trl {trl.__version__}\ntransformers {transformers.__version__}\ntorch {torch.__version__}\n")
print(f"{len(out)} lines written to {data}/expected.jsonl")
