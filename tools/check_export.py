"""check_export.py: checks by hand that an adapter exported by `mgrl export` loads in PEFT and gives the
log-probs `mgrl score` computed with it.

  /work/venv-fixtures/bin/python tools/check_export.py BASE_MODEL_DIR ADAPTER_DIR INPUT.jsonl SCORE.h5

INPUT.jsonl holds {"tokens": [...]} lines (the input of `mgrl score`), SCORE.h5 its output. Prints the
largest absolute difference of the log-probs (transformers + PEFT in float64 vs mgrl in fp32).
"""
import json
import os
import shutil
import sys
import tempfile

import h5py
import numpy as np
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def main():
    base_dir, adapter_dir, inp, score = sys.argv[1:5]
    tmp = tempfile.mkdtemp()  # the base alone (transformers would attach an adapter found beside it)
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        if os.path.exists(os.path.join(base_dir, f)):
            shutil.copy(os.path.join(base_dir, f), tmp)
    base = AutoModelForCausalLM.from_pretrained(tmp, attn_implementation="eager", torch_dtype=torch.float64)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    shutil.rmtree(tmp)
    seqs = [json.loads(l)["tokens"] for l in open(inp) if l.strip()]
    with h5py.File(score) as f:
        ours = f["logprobs"][...]
    worst = 0.0
    for i, s in enumerate(seqs):
        with torch.no_grad():
            logits = model(torch.tensor([s])).logits[0]
        lp = torch.log_softmax(logits, -1)
        ref = np.array([float(lp[t - 1, s[t]]) for t in range(1, len(s))])
        worst = max(worst, float(np.max(np.abs(ref - ours[i, 1:len(s)]))))
    print(f"{len(seqs)} sequences: max |log-prob difference| = {worst:.3g}")
    sys.exit(0 if worst < 1e-4 else 1)


if __name__ == "__main__":
    main()
