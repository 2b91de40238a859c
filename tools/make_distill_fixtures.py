"""make_distill_fixtures.py: ground truth for mgrl's knowledge-distillation divergence (Ops::lm_head_divergence, the
loss of `mgrl distill`) from the real trl library: trl 1.16's ChunkedDivergenceFunction (trl/kernels/
chunked_divergence.py, the chunked generalized JSD of its DistillationTrainer, run here on the CPU: its torch tiles)
on random student and teacher hidden states and LM heads of another width, for beta 0 (forward KL), 1 (reverse KL)
and in between (the generalized JSD), with temperatures and Gemma-style final-logit soft-capping. For each case the
per-token divergence and student entropy of its forward, and from its backward with grad_divergence = the rows'
weights (some 0) the gradients of the student's hidden states and LM head. Writes tests/data/distill/ops/<case>.safetensors
and cases.json.

Then whole steps: trl's DistillationTrainer._compute_loss (its student backbone with the PEFT adapter, its teacher's
backbone, the chunked divergence over the completion tokens, the sum over the batch's completion tokens divided by
their count) on fixed prompt and completion ids for a tiny student (tests/data/models, with its PEFT adapter) and a
random teacher of the same vocabulary and another width (written once to tests/data/distill/teachers/<name>): the
loss, the student's mean entropy, and every LoRA gradient. Writes tests/data/distill/<case>/{case.json,
grads.safetensors}.

Usage (from the repository root, in a virtualenv with tools/requirements-fixtures.txt):
    python3 tools/make_distill_fixtures.py --out tests/data/distill
"""

import argparse
import json
import os

import torch
from safetensors.torch import save_file

import shutil
import sys
import tempfile

import transformers
from datasets import Dataset
from transformers import PreTrainedTokenizerFast

import trl
from trl import DistillationConfig, DistillationTrainer
from trl.kernels.chunked_divergence import ChunkedDivergenceFunction

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_dpo_fixtures import base_model, lora_named, peft_key  # noqa: E402
from make_fixtures import exact_float64  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OP_CASES = [
    dict(name="forward_kl", beta=0.0, temperature=1.0, T=37, V=50, D=16, Dt=24),
    dict(name="reverse_kl_temperature", beta=1.0, temperature=0.7, T=21, V=64, D=12, Dt=8),
    dict(name="jsd_softcap", beta=0.5, temperature=1.3, T=33, V=45, D=16, Dt=16, s_softcap=5.0, t_softcap=3.0),
    dict(name="jsd_low_beta_zero_weights", beta=0.1, temperature=1.0, T=40, V=77, D=8, Dt=20, zero_every=3),
]


def make_op_case(spec, out):
    g = torch.Generator().manual_seed(len(spec["name"]) * 7 + 1)
    T, V, D, Dt = spec["T"], spec["V"], spec["D"], spec["Dt"]
    h = torch.randn(T, D, generator=g) * 0.8
    W = torch.randn(V, D, generator=g) * 0.5
    th = torch.randn(T, Dt, generator=g) * 0.8
    tW = torch.randn(V, Dt, generator=g) * 0.5
    weights = torch.rand(T, generator=g) + 0.1
    if spec.get("zero_every"):
        weights[:: spec["zero_every"]] = 0.0
    hs, Ws = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
    div, ent = ChunkedDivergenceFunction.apply(hs, Ws, None, th, tW, None, spec["beta"], spec["temperature"], 1.0,
                                               spec.get("s_softcap"), 1.0, spec.get("t_softcap"))
    (div * weights).sum().backward()
    save_file({"h": h, "W": W, "th": th, "tW": tW, "weights": weights, "div": div.detach().float(),
               "entropy": ent.detach().float(), "grad_h": hs.grad.float(), "grad_W": Ws.grad.float()},
              os.path.join(out, spec["name"] + ".safetensors"), metadata={"format": "pt"})
    print("%-28s beta %.2f T %.1f  mean div %.6f  mean entropy %.4f" % (spec["name"], spec["beta"],
                                                                          spec["temperature"], float(div.detach().mean()),
                                                                          float(ent.detach().mean())))
    return {k: v for k, v in spec.items()}


# Random teachers: the student's vocabulary, another width and depth.
TEACHERS = {
    "qwen2_wide": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                   dict(vocab_size=173, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                        tie_word_embeddings=False, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)),
    "llama_narrow": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                     dict(vocab_size=211, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=4, head_dim=8, max_position_embeddings=64,
                          tie_word_embeddings=True, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)),
    # deeper than two layers: model.shard_base gathers its layers again in every pass (tests/cli/distill_shard_base.sh)
    "qwen2_deep": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                   dict(vocab_size=173, hidden_size=32, intermediate_size=48, num_hidden_layers=5,
                        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                        tie_word_embeddings=True, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)),
    "gemma2_softcap": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
                       dict(vocab_size=199, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                            final_logit_softcapping=4.0, attn_logit_softcapping=None, query_pre_attn_scalar=16,
                            sliding_window=8, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                            pad_token_id=0)),
}

STEP_CASES = [
    dict(name="jsd_qwen2", student="qwen2_bias_tied", teacher="qwen2_wide", beta=0.5, temperature=0.9),
    dict(name="forward_kl_llama", student="llama_gqa", teacher="llama_narrow", beta=0.0, temperature=1.0),
    dict(name="reverse_kl_gemma2_softcap", student="gemma2_softcap", teacher="gemma2_softcap", beta=1.0,
         temperature=1.2),
    # full fine-tuning: the gradient of every weight of the student (tied embeddings: the head's part included)
    dict(name="full_jsd_qwen2", student="qwen2_bias_tied", teacher="qwen2_wide", beta=0.3, temperature=1.0, full=True),
]


def teacher_dir(name, out):
    d = os.path.join(out, "teachers", name)
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        cfg_cls, cls, kw = TEACHERS[name]
        torch.manual_seed(1234 + len(name))
        config = cfg_cls(**kw)
        config._attn_implementation = "eager"
        m = cls(config).to(torch.float32)
        with torch.no_grad():  # larger weights than the init's: distributions that differ from the student's
            for p in m.parameters():
                if p.dim() == 2:
                    p.mul_(3.0)
        m.save_pretrained(d, safe_serialization=True)
        for f in os.listdir(d):
            if f not in ("config.json", "model.safetensors"):
                os.remove(os.path.join(d, f))
    return d


def make_step_case(spec, out, tokenizer_file):
    torch.manual_seed(0)
    if spec.get("full"):
        tmp = tempfile.mkdtemp()
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(ROOT, "tests", "data", "models", spec["student"], f), tmp)
        student = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float64,
                                                                    attn_implementation="eager")
        shutil.rmtree(tmp)
    else:
        student = base_model(spec["student"])
    vocab = student.config.vocab_size
    tdir = teacher_dir(spec["teacher"], out)
    teacher = transformers.AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float64, attn_implementation="eager")
    assert teacher.config.vocab_size == vocab
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, eos_token="<eos>", pad_token="<pad>")
    cfg = DistillationConfig(
        output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=False, fp16=False, beta=spec["beta"],
        temperature=spec["temperature"], per_device_train_batch_size=4, gradient_checkpointing=False, seed=0,
        logging_steps=1)
    ds = Dataset.from_dict({"prompt": ["1+1=", "2+2="]})
    trainer = DistillationTrainer(model=student, teacher_model=teacher, args=cfg, train_dataset=ds,
                                  processing_class=tok)
    pm = trainer.model
    trained = dict(pm.named_parameters()) if spec.get("full") else lora_named(pm)
    for n, p in trained.items():
        p.requires_grad_(True)
    pm.train()
    # Prompts of one length (no left padding, whose positions mgrl's packing has not), completions of 1 to 6 tokens
    # right-padded and masked.
    g = torch.Generator().manual_seed(len(spec["name"]) * 13 + 5)
    P, lens = 4, [3, 6, 1, 5]
    prompts = torch.randint(3, vocab, (len(lens), P), generator=g)
    comps = torch.zeros(len(lens), max(lens), dtype=torch.long)
    mask = torch.zeros(len(lens), max(lens), dtype=torch.long)
    for i, n in enumerate(lens):
        comps[i, :n] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, :n] = 1
    inputs = {"prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts), "completion_ids": comps,
              "completion_mask": mask}
    n_items = mask.sum()
    with exact_float64():
        for p in pm.parameters():
            p.grad = None
        loss, entropy_sum, n_valid = trainer._compute_loss(trainer.accelerator.unwrap_model(pm), inputs, n_items)
        loss.backward()
    d = os.path.join(out, spec["name"])
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    save_file({(n if spec.get("full") else peft_key(n)): p.grad.float().contiguous() for n, p in sorted(trained.items())},
              os.path.join(d, "grads.safetensors"), metadata={"format": "pt"})
    case = {
        "student": spec["student"], "teacher": spec["teacher"], "beta": spec["beta"], "full": bool(spec.get("full")),
        "temperature": spec["temperature"],
        "versions": {"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
        "sequences": [{"prompt_ids": prompts[i].tolist(), "completion_ids": comps[i, :n].tolist()}
                      for i, n in enumerate(lens)],
        "loss": float(loss.detach()),
        "entropy": float(entropy_sum) / float(n_valid),
    }
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    print("%-28s loss %.8f entropy %.6f" % (spec["name"], case["loss"], case["entropy"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "distill"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    ops = os.path.join(a.out, "ops")
    os.makedirs(ops, exist_ok=True)
    cases = [make_op_case(s, ops) for s in OP_CASES]
    with open(os.path.join(ops, "cases.json"), "w") as f:
        json.dump({"trl": trl.__version__, "torch": torch.__version__, "cases": cases}, f, indent=1)
    tokfile = os.path.join(ROOT, "inputs", "quickstart", "tokenizer.json")
    for spec in STEP_CASES:
        make_step_case(spec, a.out, tokfile)
    for name in TEACHERS:  # the teachers no step case uses (the CLI tests')
        teacher_dir(name, a.out)


if __name__ == "__main__":
    main()
