"""make_kto_fixtures.py: ground truth for mgrl's KTO objective (`mgrl kto`) from the real trl library (KTOTrainer of
trl 1.16): for fixed labelled completions (token ids) on the tiny model fixtures (tests/data/models) with their PEFT
LoRA adapter, the KL completions as trl's add_kl_completion_ids makes them (the completions rotated by one within the
batch), trl's own data collator (truncation to max_length) and _compute_loss give the loss, the logged metrics (kl,
rewards/chosen, rewards/rejected, rewards/margins, logps/*, logits/*, entropy), and the backward the gradient of every
LoRA tensor. Everything in float64 (transformers' float32 casts patched out as in make_fixtures.py). Writes
tests/data/kto/<case>/{case.json, adapter/, grads.safetensors}.

The reference policy, as trl has it (as tools/make_dpo_fixtures.py):
  reference "base":    the adapter switched off (trl's "ref" copy of the starting adapter deleted); the policy is the
                       fixture adapter.
  reference "initial": trl's frozen "ref" copy of the starting (fixture) adapter; the policy is that adapter moved by
                       N(0, move^2) on every LoRA tensor (fixed seed), written to adapter/.

Usage (from the repository root, in a virtualenv with tools/requirements-fixtures.txt):
    python3 tools/make_kto_fixtures.py --out tests/data/kto
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")

import peft
import torch
import transformers
from datasets import Dataset
from safetensors.torch import save_file
from transformers import PreTrainedTokenizerFast

import trl
from trl import KTOConfig, KTOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_dpo_fixtures import base_model, lora_named, peft_key  # noqa: E402
from make_fixtures import exact_float64  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests", "data", "models")
EOS = 2

CASES = [
    dict(name="kto_base", model="llama_gqa", beta=0.1, reference="base", labels=[1, 0, 1, 1, 0, 0, 1, 0]),
    dict(name="kto_initial_weighted_truncated", model="qwen2_bias_tied", beta=0.5, reference="initial", move=0.1,
         desirable_weight=1.33, undesirable_weight=0.8, max_length=7, labels=[0, 1, 0, 0, 1, 0]),
    dict(name="kto_desirable_only_base", model="qwen3_qknorm", beta=0.3, reference="base",
         labels=[1, 1, 1, 1, 1]),
    dict(name="kto_undesirable_only_base", model="qwen2_bias_tied", beta=2.0, reference="base", labels=[0, 0, 0, 0]),
    # loss_type "apo_zero_unpaired": no KL estimate (trl computes no KL log-probs and logs kl 0)
    dict(name="kto_apo_initial_weighted", model="llama_gqa", beta=0.4, reference="initial", move=0.1,
         loss_type="apo_zero_unpaired", desirable_weight=1.2, undesirable_weight=0.9, labels=[1, 0, 0, 1, 1, 0]),
    dict(name="kto_apo_single_base", model="qwen3_qknorm", beta=0.2, reference="base",
         loss_type="apo_zero_unpaired", labels=[1]),
]


def examples_for(seed, vocab, labels):
    """Fixed examples: prompts of 3 to 5 tokens, completions of 1 to 6 tokens ending with EOS; the KL completions as
    trl's add_kl_completion_ids rotates them within the batch."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, label in enumerate(labels):
        lp = 3 + i % 3
        prompt = torch.randint(3, vocab, (lp,), generator=g).tolist()
        n = 1 + (2 * i + 3) % 6
        completion = torch.randint(3, vocab, (n,), generator=g).tolist()
        completion[-1] = EOS
        out.append({"prompt_ids": prompt, "completion_ids": completion, "label": bool(label)})
    completions = [e["completion_ids"] for e in out]
    for e, kl in zip(out, [completions[-1]] + completions[:-1]):
        e["KL_completion_ids"] = kl
    return out


def make_case(spec, out_root, tokenizer_file):
    torch.manual_seed(0)
    model = base_model(spec["model"])
    vocab = model.config.vocab_size
    examples = examples_for(len(spec["name"]) * 11 + 3, vocab, spec["labels"])
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, eos_token="<eos>", pad_token="<pad>")
    cfg = KTOConfig(
        output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=len(examples), gradient_accumulation_steps=1, beta=spec["beta"],
        desirable_weight=spec.get("desirable_weight", 1.0), undesirable_weight=spec.get("undesirable_weight", 1.0),
        max_length=spec.get("max_length", 1024), logging_steps=1, seed=0, gradient_checkpointing=False,
        loss_type=spec.get("loss_type", "kto"),
    )
    # The dataset only satisfies the constructor (the quickstart tokenizer's text); the examples below are token ids.
    ds = Dataset.from_dict({"prompt": ["1+1=", "2+2="], "completion": ["2", "5"], "label": [True, False]})
    trainer = KTOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok)
    pm = trainer.model
    assert "ref" in pm.peft_config, "trl 1.16 keeps a 'ref' copy of a starting adapter"
    if spec["reference"] == "base":
        pm.delete_adapter("ref")
        pm.set_adapter("default")
    else:  # the policy moves away from the frozen starting adapter
        gen = torch.Generator().manual_seed(4321)
        with torch.no_grad():
            for n, p in sorted(lora_named(pm).items()):
                p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * spec["move"])
    for n, p in lora_named(pm).items():
        p.requires_grad_(True)
    pm.train()
    inputs = trainer.data_collator([dict(e) for e in examples])
    # The KL sequences' log-probs (the policy's, then the reference's): their mean difference is the KL estimate
    # before trl clamps it at 0.
    kl_logps = []
    inner = trainer._compute_kl_logps

    def recording(*a, **k):
        r = inner(*a, **k)
        kl_logps.append(r)
        return r
    trainer._compute_kl_logps = recording
    with exact_float64():
        for p in pm.parameters():
            p.grad = None
        trainer._metrics["train"].clear()
        loss = trainer._compute_loss(pm, inputs, False)
        loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()
               if k.startswith("rewards/") or k.startswith("logps/") or k.startswith("logits/")
               or k in ("entropy", "kl")}

    d = os.path.join(out_root, spec["name"])
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    adapter = os.path.join(d, "adapter")
    os.makedirs(adapter)
    shutil.copy(os.path.join(MODELS, spec["model"], "adapter_config.json"), adapter)
    save_file({peft_key(n): p.detach().float().contiguous() for n, p in sorted(lora_named(pm).items())},
              os.path.join(adapter, "adapter_model.safetensors"), metadata={"format": "pt"})
    grads = {peft_key(n): p.grad.float().contiguous() for n, p in sorted(lora_named(pm).items())}
    save_file(grads, os.path.join(d, "grads.safetensors"), metadata={"format": "pt"})
    case = {
        "model": spec["model"],
        "versions": {"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__},
        "config": {"loss_type": cfg.loss_type, "beta": spec["beta"], "desirable_weight": cfg.desirable_weight,
                   "undesirable_weight": cfg.undesirable_weight, "max_length": cfg.max_length,
                   "reference": spec["reference"]},
        "examples": examples,
        "loss": float(loss.detach()),
        # None: no KL estimate (apo_zero_unpaired)
        "kl_unclamped": float((kl_logps[0] - kl_logps[1]).mean()) if kl_logps and kl_logps[0] is not None else None,
        "metrics": metrics,
    }
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    print("%-32s %-16s loss %+.10e  kl_unclamped %s %s" % (spec["name"], spec["model"], case["loss"],
                                                          case["kl_unclamped"],
                                           " ".join("%s %.6g" % kv for kv in sorted(metrics.items()))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "kto"))
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    tokfile = os.path.join(ROOT, "inputs", "quickstart", "tokenizer.json")
    for spec in CASES:
        if not a.only or spec["name"] in a.only.split(","):
            make_case(spec, a.out, tokfile)


if __name__ == "__main__":
    main()
