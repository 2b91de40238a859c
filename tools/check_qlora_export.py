"""check_qlora_export.py: checks by hand that a LoRA adapter mgrl trained over a bitsandbytes 4-bit (NF4) base and
exported (`mgrl export`) loads in PEFT over that base as transformers + bitsandbytes load it, and gives the log-probs
`mgrl score` computed with it.

  /tmp/venv-nf4/bin/python tools/check_qlora_export.py BNB_MODEL_DIR ADAPTER_DIR INPUT.jsonl SCORE.h5

BNB_MODEL_DIR: a model directory transformers saved in bitsandbytes 4-bit form (config.json quantization_config), e.g.
tests/data/nf4/llama_nf4; INPUT.jsonl holds {"tokens": [...]} lines (the input of `mgrl score`), SCORE.h5 its output.
Runs on the CPU (bitsandbytes' CPU backend, compute dtype float32). Prints the largest absolute difference of the
log-probs and exits 1 above 1e-4. Packages: tools/requirements-nf4.txt (plus h5py).

bitsandbytes 0.50 has a CPU inference fast path: on a CPU with AVX512-BF16, a Linear4bit in eval mode whose input
needs no gradient repacks its weight and multiplies in bf16 (log-probs then differ by ~1e-2). The check feeds input
embeddings that require a gradient, so every Linear4bit takes the float32 "dequantize, then matmul" path that
training uses; it also prints the fast path's difference, for information.
"""
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import bitsandbytes  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def main():
    base_dir, adapter_dir, inp, score = sys.argv[1:5]
    tmp = tempfile.mkdtemp()  # the base alone (transformers would attach an adapter found beside it)
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        if os.path.exists(os.path.join(base_dir, f)):
            shutil.copy(os.path.join(base_dir, f), tmp)
    base = AutoModelForCausalLM.from_pretrained(tmp, device_map="cpu", dtype=torch.float32,
                                                attn_implementation="eager")
    shutil.rmtree(tmp)
    n4 = sum(isinstance(m, bitsandbytes.nn.Linear4bit) for m in base.modules())
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    seqs = [json.loads(line)["tokens"] for line in open(inp) if line.strip()]
    with h5py.File(score) as f:
        ours = f["logprobs"][...]
    def logprobs(s, fast):
        ids = torch.tensor([s])
        if fast:
            with torch.no_grad():
                logits = model(ids).logits[0]
        else:
            emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            logits = model(inputs_embeds=emb).logits[0].detach()
        lp = torch.log_softmax(logits.double(), -1)
        return np.array([float(lp[t - 1, s[t]]) for t in range(1, len(s))])

    worst = max(float(np.max(np.abs(logprobs(s, False) - ours[i, 1:len(s)]))) for i, s in enumerate(seqs))
    fast = max(float(np.max(np.abs(logprobs(s, True) - ours[i, 1:len(s)]))) for i, s in enumerate(seqs))
    print(f"{n4} bitsandbytes Linear4bit modules, adapter {adapter_dir}: {len(seqs)} sequences, "
          f"max |log-prob difference| PEFT + bitsandbytes (float32 path) vs mgrl score: {worst:.3e} "
          f"(bitsandbytes' CPU inference fast path: {fast:.3e})")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
