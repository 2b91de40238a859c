"""make_distill_fixtures.py: ground truth for mgrl's knowledge-distillation divergence (Ops::lm_head_divergence, the
loss of `mgrl distill`) from the real trl library: trl 1.16's ChunkedDivergenceFunction (trl/kernels/
chunked_divergence.py, the chunked generalized JSD of its DistillationTrainer, run here on the CPU: its torch tiles)
on random student and teacher hidden states and LM heads of another width, for beta 0 (forward KL), 1 (reverse KL)
and in between (the generalized JSD), with temperatures and Gemma-style final-logit soft-capping. For each case the
per-token divergence and student entropy of its forward, and from its backward with grad_divergence = the rows'
weights (some 0) the gradients of the student's hidden states and LM head. Writes tests/data/distill/ops/<case>.safetensors
and cases.json.

Usage (from the repository root, in a virtualenv with tools/requirements-fixtures.txt):
    python3 tools/make_distill_fixtures.py --out tests/data/distill
"""

import argparse
import json
import os

import torch
from safetensors.torch import save_file

import trl
from trl.kernels.chunked_divergence import ChunkedDivergenceFunction

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


if __name__ == "__main__":
    main()
