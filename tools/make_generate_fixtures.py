"""make_generate_fixtures.py: greedy generations of transformers + PEFT on the fixture models.

For each model directory of tests/data/models (written by make_fixtures.py), runs `generate` (greedy,
adapter active, float64) on a few prompts cut from the reference inputs and writes generate.json:
{"prompts": [[ids]], "max_new_tokens": N, "completions": [[ids]], "logprobs": [[...]], "min_margin": m,
 "penalty": {"repetition_penalty": 1.5, "completions", "logprobs", "min_margin"}} (the same greedy with
repetition_penalty; its log-probs are the raw model's, before the penalty)
where logprobs are log_softmax(logits)[token] of each generated token and min_margin is the smallest
gap between the best and second-best logit over all steps (a large margin means the greedy choice is
robust to fp32 rounding). Run by hand:  /work/venv-fixtures/bin/python tools/make_generate_fixtures.py
"""
import argparse
import json
import os
import shutil
import tempfile

import torch
from peft import PeftModel
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM

MODELS = ["llama_gqa", "qwen2_bias_tied", "qwen3_qknorm", "gemma2_softcap", "gemma3_text", "mistral_window", "qwen3_yarn"]
MAX_NEW = 10
PENALTY = 1.5


def load(model_dir):
    # Load the base from a copy without the adapter files (transformers would attach them itself).
    tmp = tempfile.mkdtemp()
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(os.path.join(model_dir, f), tmp)
    base = AutoModelForCausalLM.from_pretrained(tmp, attn_implementation="eager", torch_dtype=torch.float64)
    model = PeftModel.from_pretrained(base, model_dir).eval()
    shutil.rmtree(tmp)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="tests/data/models")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated model names (default: all)")
    args = ap.parse_args()
    torch.manual_seed(0)
    for name in args.models.split(","):
        d = os.path.join(args.dir, name)
        model = load(d)
        ref = load_file(os.path.join(d, "reference.safetensors"))
        ids, lens = ref["input_ids"], ref["lengths"]
        prompts = [[int(x) for x in ids[b, : max(2, int(lens[b]) // 2 - b)]] for b in range(ids.shape[0])]
        completions, logprobs, margin = [], [], float("inf")
        for p in prompts:
            inp = torch.tensor([p])
            out = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), max_new_tokens=MAX_NEW,
                                 do_sample=False, eos_token_id=None, pad_token_id=0, output_scores=True,
                                 return_dict_in_generate=True)
            toks = [int(t) for t in out.sequences[0, len(p):]]
            lps = []
            for step, scores in enumerate(out.scores):
                s = scores[0].double()
                top2 = torch.topk(s, 2).values
                margin = min(margin, float(top2[0] - top2[1]))
                lps.append(float(torch.log_softmax(s, -1)[toks[step]]))
            completions.append(toks)
            logprobs.append(lps)
        # Greedy with a repetition penalty (RepetitionPenaltyLogitsProcessor over prompt + completion so far): the
        # completions, the raw model's log-probs of their tokens (output_logits: before the penalty) and the margin
        # of the penalised scores.
        pen = {"repetition_penalty": PENALTY, "completions": [], "logprobs": [], "min_margin": float("inf")}
        for p in prompts:
            inp = torch.tensor([p])
            out = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), max_new_tokens=MAX_NEW,
                                 do_sample=False, eos_token_id=None, pad_token_id=0, output_scores=True,
                                 output_logits=True, return_dict_in_generate=True, repetition_penalty=PENALTY)
            toks = [int(t) for t in out.sequences[0, len(p):]]
            for scores in out.scores:
                top2 = torch.topk(scores[0].double(), 2).values
                pen["min_margin"] = min(pen["min_margin"], float(top2[0] - top2[1]))
            pen["completions"].append(toks)
            pen["logprobs"].append([float(torch.log_softmax(raw[0].double(), -1)[toks[step]])
                                    for step, raw in enumerate(out.logits)])
        changed = sum(a != b for a, b in zip(pen["completions"], completions))
        with open(os.path.join(d, "generate.json"), "w") as f:
            json.dump({"prompts": prompts, "max_new_tokens": MAX_NEW, "completions": completions,
                       "logprobs": logprobs, "min_margin": margin, "penalty": pen}, f)
            f.write("\n")
        print(f"{name}: {len(prompts)} prompts, min logit margin {margin:.4f}; repetition penalty {PENALTY}: "
              f"{changed} completions changed, min margin {pen['min_margin']:.4f}")


if __name__ == "__main__":
    main()
