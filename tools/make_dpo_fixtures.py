"""make_dpo_fixtures.py: ground truth for mgrl's DPO objective from the real trl library (DPOTrainer of trl 1.16):
for fixed preference pairs (token ids) on the tiny model fixtures (tests/data/models) with their PEFT LoRA adapter,
trl's own data collator (truncation to max_length) and _compute_loss give the loss, the logged metrics
(rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen, logps/rejected), and the
backward the gradient of every LoRA tensor. Everything in float64 (transformers' float32 casts patched out as in
make_fixtures.py). Writes tests/data/dpo/<case>/{case.json, adapter/, grads.safetensors}.

The reference policy, as trl has it:
  reference "base":    the adapter switched off (trl's path for a new adapter; here the "ref" copy trl makes of a
                       starting adapter is deleted so that trl takes it); the policy is the fixture adapter.
  reference "initial": trl's frozen "ref" copy of the starting (fixture) adapter; the policy is that adapter moved by
                       N(0, 0.05^2) on every LoRA tensor (fixed seed), written to adapter/.

Usage (from the repository root, in a virtualenv with tools/requirements-fixtures.txt):
    python3 tools/make_dpo_fixtures.py --out tests/data/dpo
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
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import trl
from trl import DPOConfig, DPOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import exact_float64  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests", "data", "models")
EOS = 2
PAD = 0

CASES = [
    dict(name="sigmoid_base", model="llama_gqa", loss_type="sigmoid", beta=0.1, reference="base"),
    dict(name="hinge_base", model="qwen2_bias_tied", loss_type="hinge", beta=2.0, reference="base"),
    dict(name="ipo_initial", model="qwen3_qknorm", loss_type="ipo", beta=0.1, reference="initial"),
    dict(name="robust_initial", model="llama_gqa", loss_type="robust", beta=0.2, label_smoothing=0.1,
         reference="initial"),
    dict(name="sigmoid_norm_truncated", model="qwen2_bias_tied", loss_type="sigmoid_norm", beta=0.5,
         reference="base", max_length=8),
    dict(name="sigmoid_ld_alpha", model="qwen3_qknorm", loss_type="sigmoid", beta=0.3, reference="base",
         ld_alpha=0.5),
    dict(name="sigmoid_sft_truncated", model="llama_gqa", loss_type="sigmoid", beta=0.1, reference="base",
         sft_weight=0.5, max_length=8),
    # trl's other pair losses (added 2026-11-28).
    dict(name="exo_pair_initial", model="qwen2_bias_tied", loss_type="exo_pair", beta=0.5, label_smoothing=1e-3,
         reference="initial"),
    dict(name="nca_pair_initial", model="qwen3_qknorm", loss_type="nca_pair", beta=0.3, reference="initial"),
    dict(name="bco_pair_base", model="llama_gqa", loss_type="bco_pair", beta=0.2, reference="base"),
    dict(name="sppo_hard_initial", model="llama_gqa", loss_type="sppo_hard", beta=0.5, reference="initial"),
    dict(name="apo_zero_initial", model="qwen2_bias_tied", loss_type="apo_zero", beta=0.4, reference="initial"),
    dict(name="apo_down_initial", model="qwen3_qknorm", loss_type="apo_down", beta=0.6, reference="initial"),
    dict(name="discopop_initial", model="llama_gqa", loss_type="discopop", beta=0.8, reference="initial",
         discopop_tau=0.2),
    # f-DPO (trl's f_divergence_type; its alpha_divergence indexes a float32/16 table and fails in float64).
    dict(name="sigmoid_forward_kl_initial", model="qwen2_bias_tied", loss_type="sigmoid", beta=0.3,
         reference="initial", f_divergence_type="forward_kl"),
    dict(name="ipo_js_initial", model="qwen3_qknorm", loss_type="ipo", beta=0.2, reference="initial",
         f_divergence_type="js_divergence"),
    dict(name="robust_forward_kl_initial", model="llama_gqa", loss_type="robust", beta=0.5, label_smoothing=0.2,
         reference="initial", f_divergence_type="forward_kl"),
    # AOT over the batch's sorted log-ratios (added 2026-11-29).
    # MPO's mix (trl's loss_type list with loss_weights): sigmoid 0.8 + bco_pair 0.2 + sft 1.0; and a mix with a
    # batch loss (aot) and the shared label smoothing
    dict(name="mpo_initial", model="llama_gqa", loss_type="sigmoid", beta=0.2, reference="initial",
         mix=[("sigmoid", 0.8), ("bco_pair", 0.2), ("sft", 1.0)]),
    dict(name="mix_aot_robust_base", model="qwen2_bias_tied", loss_type="aot", beta=0.3, reference="base",
         label_smoothing=0.1, mix=[("aot", 0.5), ("robust", 1.5)]),
    dict(name="aot_initial", model="qwen2_bias_tied", loss_type="aot", beta=0.4, reference="initial"),
    dict(name="aot_unpaired_smoothed_base", model="qwen3_qknorm", loss_type="aot_unpaired", beta=0.3,
         label_smoothing=0.1, reference="base"),
    # WPO (trl's use_weighting; added 2026-11-29): each pair's loss times exp(mean(log p - log sum p^2)) of both sides.
    dict(name="sigmoid_wpo_initial", model="llama_gqa", loss_type="sigmoid", beta=0.2, reference="initial",
         use_weighting=True),
    dict(name="mix_wpo_truncated_base", model="qwen2_bias_tied", loss_type="sigmoid", beta=0.5, reference="base",
         use_weighting=True, max_length=8, mix=[("sigmoid", 0.6), ("bco_pair", 0.4)]),
]
NPAIRS = 4


def pairs_for(seed, vocab):
    """Fixed pairs: prompts of 3 to 5 tokens, completions of 1 to 6 tokens ending with EOS, chosen and rejected of
    different lengths (so LD-DPO's shared part and max_length truncation matter)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(NPAIRS):
        lp = 3 + i % 3
        prompt = torch.randint(3, vocab, (lp,), generator=g).tolist()
        nc, nr = 1 + (2 * i + 3) % 6, 1 + (3 * i + 1) % 6
        chosen = torch.randint(3, vocab, (nc,), generator=g).tolist()
        rejected = torch.randint(3, vocab, (nr,), generator=g).tolist()
        chosen[-1] = EOS
        rejected[-1] = EOS
        out.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    return out


def base_model(name):
    tmp = tempfile.mkdtemp()
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(os.path.join(MODELS, name, f), tmp)
    m = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float64, attn_implementation="eager")
    shutil.rmtree(tmp)
    return PeftModel.from_pretrained(m, os.path.join(MODELS, name), is_trainable=True)


def lora_named(pm):
    return {n: p for n, p in pm.named_parameters() if "lora_" in n and ".default." in n}


def peft_key(n):  # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight -> PEFT file name
    return n.replace(".default", "")


def make_case(spec, out_root, tokenizer_file):
    torch.manual_seed(0)
    model = base_model(spec["model"])
    vocab = model.config.vocab_size
    pairs = pairs_for(len(spec["name"]) * 7 + 1, vocab)
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, eos_token="<eos>", pad_token="<pad>")
    cfg = DPOConfig(
        output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=NPAIRS, gradient_accumulation_steps=1,
        loss_type=[t for t, _ in spec["mix"]] if spec.get("mix") else
        [spec["loss_type"]] + (["sft"] if spec.get("sft_weight") else []),
        loss_weights=[w for _, w in spec["mix"]] if spec.get("mix") else
        ([1.0, spec["sft_weight"]] if spec.get("sft_weight") else None),
        beta=spec["beta"], label_smoothing=spec.get("label_smoothing", 0.0), ld_alpha=spec.get("ld_alpha"),
        max_length=spec.get("max_length", 1024), logging_steps=1, seed=0, gradient_checkpointing=False,
        discopop_tau=spec.get("discopop_tau", 0.05), f_divergence_type=spec.get("f_divergence_type", "reverse_kl"),
        use_weighting=spec.get("use_weighting", False),
    )
    # The dataset only satisfies the constructor (the quickstart tokenizer's text); the pairs below are token ids.
    ds = Dataset.from_dict({"prompt": ["1+1="], "chosen": ["2"], "rejected": ["3"]})
    trainer = DPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok)
    pm = trainer.model
    assert "ref" in pm.peft_config, "trl 1.16 keeps a 'ref' copy of a starting adapter"
    if spec["reference"] == "base":
        pm.delete_adapter("ref")
        pm.set_adapter("default")
    else:  # the policy moves away from the frozen starting adapter
        gen = torch.Generator().manual_seed(4321)
        with torch.no_grad():
            for n, p in sorted(lora_named(pm).items()):
                p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.05)
    for n, p in lora_named(pm).items():
        p.requires_grad_(True)
    pm.train()
    inputs = trainer.data_collator([dict(p) for p in pairs])
    with exact_float64():
        for p in pm.parameters():
            p.grad = None
        trainer._metrics["train"].clear()
        loss = trainer._compute_loss(pm, inputs, False)
        loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()
               if k.startswith("rewards/") or k.startswith("logps/") or k.startswith("logits/")
               or k in ("entropy", "mean_token_accuracy")}

    d = os.path.join(out_root, spec["name"])
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    # The policy's adapter (float32), under the PEFT names.
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
        "config": {"loss_type": spec["loss_type"], "beta": spec["beta"],
                   "label_smoothing": spec.get("label_smoothing", 0.0), "ld_alpha": spec.get("ld_alpha"),
                   "max_length": cfg.max_length, "reference": spec["reference"],
                   "sft_weight": spec.get("sft_weight", 0.0), "discopop_tau": cfg.discopop_tau,
                   "f_divergence_type": cfg.f_divergence_type,
                   "loss_mix": [[t, w] for t, w in spec.get("mix", [])],
                   "use_weighting": cfg.use_weighting},
        "pairs": pairs,
        "loss": float(loss.detach()),
        "metrics": metrics,
    }
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    print("%-24s %-16s loss %+.10e  %s" % (spec["name"], spec["model"], case["loss"],
                                           " ".join("%s %.6g" % kv for kv in sorted(metrics.items()))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "dpo"))
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
