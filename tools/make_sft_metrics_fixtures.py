#!/usr/bin/env python3
"""make_sft_metrics_fixtures.py: the metrics trl's SFTTrainer logs for its first step, for cli.sft.token_metrics_as_trl:
the Qwen2 test model (tests/data/models/qwen2_bias_tied) with a LoRA adapter that trl first trains for 12 steps on
the data (so that the model predicts some of the tokens: a random model's accuracy is 0), the quickstart tokenizer,
tests/data/sft_trl/metrics_input.jsonl (8 prompt-completion lines: one batch of all of them, so the order trl
shuffles them in does not matter), float32 on the CPU. Then a fresh trainer from that adapter: its first step's
metrics are of the model before its update: loss, entropy (the mean entropy of the predicted distribution over the
completion tokens) and mean_token_accuracy (the share of completion tokens the model predicts as its most likely
one). Then, with that adapter, trl's evaluate() on tests/data/sft_trl/metrics_heldout.jsonl (8 lines: one eval batch):
eval_loss, eval_entropy, eval_mean_token_accuracy. Writes tests/data/sft_trl/metrics.json and the adapter to
tests/data/sft_trl/metrics_adapter/.
And trl's loss_type = "dft" for one step from that adapter: metrics_dft.json (loss, grad_norm, entropy,
mean_token_accuracy; --dft-only writes it alone, from the committed adapter).
    /work/venv-fixtures/bin/python tools/make_sft_metrics_fixtures.py     (trl 1.16.0, transformers 5.24.0, peft)"""
import json
import os
import tempfile

import peft
import torch
import transformers
import trl
from datasets import Dataset
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
model_dir = os.path.join(root, "tests", "data", "models", "qwen2_bias_tied")
data = os.path.join(root, "tests", "data", "sft_trl")
torch.manual_seed(0)
tok = AutoTokenizer.from_pretrained(os.path.join(root, "inputs", "quickstart"))
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
model = PeftModel.from_pretrained(model, model_dir, is_trainable=True)
rows = [json.loads(line) for line in open(os.path.join(data, "metrics_input.jsonl"), encoding="utf-8")]
adapter = os.path.join(data, "metrics_adapter")


def run(model, steps, lr):
    with tempfile.TemporaryDirectory() as tmp:
        args = trl.SFTConfig(output_dir=tmp, report_to=[], max_length=128, use_cpu=True, bf16=False,
                             per_device_train_batch_size=len(rows), max_steps=steps, logging_steps=1,
                             learning_rate=lr, save_strategy="no", seed=0, lr_scheduler_type="constant")
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
        trainer.train()
    return trainer


def dft_step():
    """trl's loss_type = "dft" (each token's loss times its detached probability) for one step from the saved adapter:
    its loss, grad_norm, entropy and mean_token_accuracy -> tests/data/sft_trl/metrics_dft.json (cli.sft.dft_as_trl)."""
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    m = PeftModel.from_pretrained(m, adapter, is_trainable=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = trl.SFTConfig(output_dir=tmp, report_to=[], max_length=128, use_cpu=True, bf16=False,
                             per_device_train_batch_size=len(rows), max_steps=1, logging_steps=1, learning_rate=1e-3,
                             save_strategy="no", seed=0, lr_scheduler_type="constant", loss_type="dft")
        trainer = trl.SFTTrainer(model=m, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
        trainer.train()
    log = trainer.state.log_history[0]
    res = {k: log[k] for k in ("loss", "grad_norm", "entropy", "mean_token_accuracy")}
    res["versions"] = {"trl": trl.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    with open(os.path.join(data, "metrics_dft.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    print(res)


if "--dft-only" in os.sys.argv:  # from the committed adapter, leaving metrics.json and the adapter as they are
    dft_step()
    raise SystemExit(0)
run(model, 12, 2e-2)
model.save_pretrained(adapter)
readme = os.path.join(adapter, "README.md")
if os.path.exists(readme):
    os.remove(readme)
cfg_path = os.path.join(adapter, "adapter_config.json")  # no machine-specific path in the fixture
cfg = json.load(open(cfg_path))
cfg["base_model_name_or_path"] = None
cfg["target_modules"] = sorted(cfg["target_modules"])  # a set: its order varies from run to run
json.dump(cfg, open(cfg_path, "w"), indent=2, sort_keys=True)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
log = run(model, 1, 1e-3).state.log_history[0]
out = {k: log[k] for k in ("loss", "entropy", "mean_token_accuracy")}
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
heldout = [json.loads(line) for line in open(os.path.join(data, "metrics_heldout.jsonl"), encoding="utf-8")]
with tempfile.TemporaryDirectory() as tmp:
    args = trl.SFTConfig(output_dir=tmp, report_to=[], max_length=128, use_cpu=True, bf16=False,
                         per_device_eval_batch_size=len(heldout), save_strategy="no", seed=0)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             eval_dataset=Dataset.from_list(heldout), processing_class=tok)
    ev = trainer.evaluate()
out.update({k: ev[k] for k in ("eval_loss", "eval_entropy", "eval_mean_token_accuracy")})
out["versions"] = {"trl": trl.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
with open(os.path.join(data, "metrics.json"), "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print(out)
dft_step()
