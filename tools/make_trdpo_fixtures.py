"""make_trdpo_fixtures.py: ground truth for TR-DPO (trl's sync_ref_model) from the real trl library: DPOTrainer of
trl 1.16 trains the Qwen2 fixture (tests/data/models/qwen2_bias_tied) by full fine-tuning, in float32 on the CPU, for
5 steps over the first 8 pairs of tests/data/dpo_cli/train.jsonl (strings, tokenized by trl with the quickstart
tokenizer), each step the whole 8 (so the sampler's order changes nothing but the summation order); constant
learning rate 1e-3, no weight decay, clipping at norm 1.

Cases (tests/data/trdpo/<case>/): "sync" (sync_ref_model, ref_model_sync_steps 2, ref_model_mixup_alpha 0.6: trl's
SyncRefModelCallback mixes the policy into its reference model after steps 2 and 4) and "plain" (the same run
without it: the reference stays the starting model). Each holds case.json (the settings, every step's logged loss,
rewards/margins and rewards/chosen, the versions), model.safetensors (the policy's weights after the last step) and,
for "sync", ref_model.safetensors (the reference model's weights after the last step).

Usage (from the repository root, in a virtualenv with tools/requirements-fixtures.txt):
    python3 tools/make_trdpo_fixtures.py --out tests/data/trdpo
"""

import argparse
import json
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch
import transformers
from datasets import Dataset
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import trl
from trl import DPOConfig, DPOTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "data", "models", "qwen2_bias_tied")
DATA = os.path.join(ROOT, "tests", "data", "dpo_cli", "train.jsonl")
TOKENIZER = os.path.join(ROOT, "inputs", "quickstart", "tokenizer.json")
NPAIRS = 8
STEPS = 5
CASES = [
    dict(name="sync", sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.6),
    dict(name="plain", sync_ref_model=False),
]


def weights(model):
    """The model's parameters under their Hugging Face names (a tied LM head once, as the embeddings)."""
    return {n: p.detach().float().contiguous().clone() for n, p in model.named_parameters()}


def make_case(spec, out_root):
    torch.manual_seed(0)
    with open(DATA) as f:
        rows = [json.loads(line) for line in f][:NPAIRS]
    ds = Dataset.from_list(rows)
    tok = PreTrainedTokenizerFast(tokenizer_file=TOKENIZER, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    tmp = tempfile.mkdtemp()
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(os.path.join(MODEL, f), tmp)
    # trl 1.16 loads its reference model again from the policy's directory: kept until the case is written
    model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager")
    cfg = DPOConfig(
        output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=NPAIRS, gradient_accumulation_steps=1, max_steps=STEPS, learning_rate=1e-3,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, adam_beta1=0.9,
        adam_beta2=0.999, adam_epsilon=1e-8, beta=0.1, loss_type=["sigmoid"], logging_steps=1, seed=0,
        save_strategy="no", gradient_checkpointing=False, dataloader_drop_last=False,
        sync_ref_model=spec["sync_ref_model"], ref_model_sync_steps=spec.get("ref_model_sync_steps", 512),
        ref_model_mixup_alpha=spec.get("ref_model_mixup_alpha", 0.6),
    )
    trainer = DPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok)
    trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h and "step" in h]
    steps = [{"step": h["step"], "loss": h["loss"], "rewards/margins": h.get("rewards/margins"),
              "rewards/chosen": h.get("rewards/chosen")} for h in history]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1)), steps

    d = os.path.join(out_root, spec["name"])
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    save_file(weights(trainer.model), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    if spec["sync_ref_model"]:
        save_file(weights(trainer.ref_model), os.path.join(d, "ref_model.safetensors"), metadata={"format": "pt"})
    case = {
        "versions": {"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
        "config": {k: v for k, v in spec.items() if k != "name"} | {
            "pairs": NPAIRS, "steps": STEPS, "learning_rate": 1e-3, "beta": 0.1, "loss_type": "sigmoid"},
        "steps": steps,
    }
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    shutil.rmtree(tmp)
    print(spec["name"], " ".join("%d:%.8f" % (s["step"], s["loss"]) for s in steps))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "trdpo"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    for spec in CASES:
        make_case(spec, a.out)


if __name__ == "__main__":
    main()
