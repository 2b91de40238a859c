"""make_ppo_fixtures.py: ground truth for mgrl's PPO objective (src/rl/ppo_loss.h) from the real trl library.

trl removed its PPO trainer after 1.12.0 (trl 1.13 and later, the project's 1.16 included, have none), so this
script runs trl 1.12.0's `trl.experimental.ppo.PPOTrainer.train()` itself: one rollout batch, the whole update
(per-token KL penalty, score at the last position, missing-EOS penalty, optional reward whitening, the GAE loop,
advantage whitening, every PPO epoch over shuffled mini-batches with the clipped policy and value losses, the
metrics it logs). Only what feeds that computation is replaced by fixed float64 tensors, at the module-level
names train() calls: `batch_generation` (the sampled responses and their sampling logits), `forward` (the
reference logits in the rollout; in each training micro-batch the current policy's logits and value predictions,
leaf tensors moved away from the rollout's so that ratios and values clip), `get_reward` (the value model's values
in the rollout and the reward model's scores). The script records, without changing them, trl's own values: the
inputs and outputs of its `masked_whiten` (rewards when whiten_rewards, the GAE advantages), each micro-batch's
loss (accelerator.backward), the gradient of that loss with respect to the new per-token log-probs (the output of
`selective_log_softmax`, retained) and the value predictions, the mini-batch permutations (numpy), and the metrics
passed to `log`. The tiny model fixtures (tests/data/models/llama_gqa) are only there because the trainer's
constructor wants real models; their weights never enter the numbers.

Usage (from the repository root; trl 1.12.0 unpacked in front of the fixture virtualenv, which has the other
packages of tools/requirements-fixtures.txt):
    pip download --no-deps trl==1.12.0 -d /tmp/w && unzip -q /tmp/w/trl-1.12.0-*.whl -d /tmp/trl112
    PYTHONPATH=/tmp/trl112 python3 tools/make_ppo_fixtures.py --out tests/data/ppo
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import numpy as np
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedTokenizerFast

import trl
import trl.experimental.ppo.ppo_trainer as ppo_mod
from trl.experimental.ppo import PPOConfig, PPOTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests", "data", "models")
EOS, PAD = 2, 0
B, CTX, T, V = 8, 3, 6, 11  # sequences, prompt length, response_length (max new tokens), fake vocabulary

CASES = [
    dict(name="k1_two_minibatches", kl_estimator="k1", kl_coef=0.05, gamma=1.0, lam=0.95, cliprange=0.2,
         cliprange_value=0.2, vf_coef=0.1, num_mini_batches=2, num_ppo_epochs=2, whiten_rewards=False,
         missing_eos_penalty=None, temperature=0.7),
    dict(name="k3_whiten_eos_penalty", kl_estimator="k3", kl_coef=0.2, gamma=0.9, lam=0.8, cliprange=0.1,
         cliprange_value=0.05, vf_coef=0.5, num_mini_batches=1, num_ppo_epochs=2, whiten_rewards=True,
         missing_eos_penalty=1.5, temperature=1.0),
    dict(name="k1_four_minibatches_3_epochs", kl_estimator="k1", kl_coef=0.1, gamma=0.99, lam=1.0, cliprange=0.3,
         cliprange_value=0.1, vf_coef=0.2, num_mini_batches=4, num_ppo_epochs=3, whiten_rewards=False,
         missing_eos_penalty=0.5, temperature=0.9),
]


def responses_for(seed):
    """Response token ids [B, T]: most stop with EOS before T (pads after it), at least one reaches T with no EOS
    (so the padded width is T, as when a sequence hits response_length), one ends with EOS exactly at T."""
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 3, T, 4, T, 2, 5, T]  # 0-based index 2 and 7: no EOS; index 6 (length T - 1) and others: EOS
    eos = [True, True, False, True, True, True, True, False]
    rows = []
    for n, e in zip(lengths, eos):
        ids = torch.randint(3, V, (n,), generator=g).tolist()
        if e:
            ids[-1] = EOS
        rows.append(ids + [PAD] * (T - n))
    return torch.tensor(rows), lengths, eos


def make_case(spec, out_root, tokenizer_file):
    torch.manual_seed(0)
    np.random.seed(0)
    seed = sum(map(ord, spec["name"]))
    g = torch.Generator().manual_seed(seed)
    responses, lengths, eos = responses_for(seed)
    temp = spec["temperature"] + 1e-7
    gen_logits = torch.randn(B, T, V, generator=g, dtype=torch.float64)  # sampling logits (already / temperature)
    ref_full = torch.randn(B, CTX + T, V, generator=g, dtype=torch.float64) * 0.5
    ref_full[:, CTX - 1:-1] += gen_logits * temp  # the reference: near the policy
    values_full = torch.randn(B, CTX + T, 1, generator=g, dtype=torch.float64) * 0.5
    scores = torch.randn(B, generator=g, dtype=torch.float64)

    tmp = tempfile.mkdtemp()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(MODELS, "llama_gqa", f), tmp)
    policy = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float64)
    ref = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float64)
    value_model = AutoModelForSequenceClassification.from_pretrained(tmp, num_labels=1, dtype=torch.float64)
    reward_model = AutoModelForSequenceClassification.from_pretrained(tmp, num_labels=1, dtype=torch.float64)
    shutil.rmtree(tmp)
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, eos_token="<eos>", pad_token="<pad>")
    assert tok.eos_token_id == EOS and tok.pad_token_id == PAD, (tok.eos_token_id, tok.pad_token_id)
    queries = [[5 + (i % 4), 7, 9] for i in range(B)]
    ds = Dataset.from_dict({"input_ids": queries})
    cfg = PPOConfig(
        output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=B, gradient_accumulation_steps=1, total_episodes=B,
        local_rollout_forward_batch_size=B, num_sample_generations=0, response_length=T, stop_token="eos",
        temperature=spec["temperature"], kl_coef=spec["kl_coef"], kl_estimator=spec["kl_estimator"],
        cliprange=spec["cliprange"], cliprange_value=spec["cliprange_value"], vf_coef=spec["vf_coef"],
        gamma=spec["gamma"], lam=spec["lam"], num_mini_batches=spec["num_mini_batches"],
        num_ppo_epochs=spec["num_ppo_epochs"], whiten_rewards=spec["whiten_rewards"],
        missing_eos_penalty=spec["missing_eos_penalty"], save_strategy="no", logging_steps=1, seed=0,
        disable_tqdm=True,
    )
    trainer = PPOTrainer(args=cfg, processing_class=tok, model=policy, ref_model=ref, reward_model=reward_model,
                         train_dataset=ds, value_model=value_model, eval_dataset=ds)

    rec = dict(whiten=[], losses=[], logp_out=[], vpred=[], new_logp_in=[], new_values_in=[], perms=[],
               metrics=[])
    orig_sls = ppo_mod.selective_log_softmax
    orig_whiten = ppo_mod.masked_whiten
    orig_perm = np.random.permutation
    saved = {n: getattr(ppo_mod, n) for n in ("batch_generation", "get_reward", "forward", "selective_log_softmax",
                                               "masked_whiten")}
    state = dict(calls=0)
    M = B // spec["num_mini_batches"]
    gt = torch.Generator().manual_seed(seed + 1)

    def fake_batch_generation(model, q, fwd_bs, pad_id, gen_cfg):
        return torch.cat([q, responses], 1), gen_logits.clone()

    def fake_get_reward(model, query_responses, pad_id, context_length):
        if model is value_model:
            return values_full.clone(), None, None
        assert model is reward_model
        return None, scores.clone(), None

    def fake_forward(model, query_responses, pad_id):
        if not isinstance(model, ppo_mod.PolicyAndValueWrapper):
            assert model is ref
            return types.SimpleNamespace(logits=ref_full.clone())
        k = state["calls"]
        state["calls"] += 1
        e, j = divmod(k, spec["num_mini_batches"])
        inds = torch.as_tensor(rec["perms"][e][j * M:(j + 1) * M])
        assert torch.equal(query_responses[:, CTX:], responses[inds])
        logits = torch.randn(len(inds), CTX + T, V, generator=gt, dtype=torch.float64) * 0.3
        logits[:, CTX - 1:-1] += gen_logits[inds] * temp  # near the sampling policy: ratios around 1
        vals = values_full[inds] + torch.randn(len(inds), CTX + T, 1, generator=gt, dtype=torch.float64) * 0.15
        logits.requires_grad_(True)
        vals.requires_grad_(True)
        rec["vpred"].append(vals)
        return types.SimpleNamespace(logits=logits * 1.0), vals

    def recording_sls(logits, index):
        out = orig_sls(logits, index)
        if torch.is_grad_enabled() and logits.requires_grad:
            out.retain_grad()
            rec["logp_out"].append(out)
        return out

    def recording_whiten(values, mask, shift_mean=True):
        out = orig_whiten(values, mask, shift_mean)
        rec["whiten"].append((values.clone(), mask.clone(), shift_mean, out.clone()))
        return out

    def recording_perm(n):
        p = orig_perm(n)
        rec["perms"].append([int(x) for x in p])
        return p

    def recording_backward(loss, **kw):
        rec["losses"].append(float(loss.detach()))
        loss.backward()

    ppo_mod.batch_generation = fake_batch_generation
    ppo_mod.get_reward = fake_get_reward
    ppo_mod.forward = fake_forward
    ppo_mod.selective_log_softmax = recording_sls
    ppo_mod.masked_whiten = recording_whiten
    np.random.permutation = recording_perm
    trainer.accelerator.backward = recording_backward
    trainer.log = lambda logs, *a, **k: rec["metrics"].append(dict(logs))
    try:
        trainer.train()
    finally:
        for n, f in saved.items():
            setattr(ppo_mod, n, f)
        np.random.permutation = orig_perm

    calls = state["calls"]
    assert calls == spec["num_ppo_epochs"] * spec["num_mini_batches"] == len(rec["losses"]) == len(rec["logp_out"])

    def ragged(t, n):  # rows of a [B, width] tensor cut to per-sequence lengths
        return [[float(x) for x in t[i, :n[i]]] for i in range(t.shape[0])]

    # The rollout's per-token arrays as train() formed them (the same selective_log_softmax of the same tensors).
    old_logp = orig_sls(gen_logits, responses)
    ref_logp = orig_sls(ref_full[:, CTX - 1:-1] / temp, responses)
    n_v = [n + 1 if n < T else n for n in lengths]
    values = values_full[:, CTX - 1:-1, 0]
    adv_in, adv_mask, _, adv_out = rec["whiten"][-1]
    mini = []
    for k in range(calls):
        e, j = divmod(k, spec["num_mini_batches"])
        inds = rec["perms"][e][j * M:(j + 1) * M]
        lp = rec["logp_out"][k]
        vp = rec["vpred"][k]
        nl = [lengths[i] for i in inds]
        nv = [n_v[i] for i in inds]
        mini.append({
            "indices": inds,
            "new_logps": ragged(lp.detach(), nl),
            "new_values": ragged(vp.detach()[:, CTX - 1:-1, 0], nv),
            "loss": rec["losses"][k],
            "grad_logps": ragged(lp.grad, nl),
            "grad_values": ragged(vp.grad[:, CTX - 1:-1, 0], nv),
        })
    case = {
        "trl_version": trl.__version__, "trainer": "trl.experimental.ppo.PPOTrainer.train",
        "config": {k: v for k, v in spec.items() if k != "name"},
        "response_length": T, "eos_token_id": EOS,
        "responses": [r[:n] for r, n in zip(responses.tolist(), lengths)], "has_eos": eos,
        "old_logps": ragged(old_logp, lengths), "ref_logps": ragged(ref_logp, lengths),
        "values": ragged(values, n_v), "scores": [float(x) for x in scores],
        "advantages_raw": ragged(adv_in, n_v), "advantages": ragged(adv_out, lengths),
        "returns": ragged(adv_in + values, n_v),
        "minibatches": mini, "metrics": rec["metrics"][0],
    }
    if spec["whiten_rewards"]:
        r_in, _, _, r_out = rec["whiten"][0]
        case["rewards"] = ragged(r_in, n_v)
        case["rewards_whitened"] = ragged(r_out, n_v)
    assert adv_mask.sum() == sum(lengths)
    d = os.path.join(out_root, spec["name"])
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    clipped_v = sum(1 for m in mini for a, b, i in zip(m["new_values"], m["indices"], range(M))
                    for x, y in zip(a, case["values"][b]) if abs(x - y) > spec["cliprange_value"])
    print("%-30s losses %s  value predictions outside the clip range: %d  metrics: %d" %
          (spec["name"], ["%.6f" % x for x in rec["losses"]], clipped_v, len(case["metrics"])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "ppo"))
    a = ap.parse_args()
    assert trl.__version__ == "1.12.0", "needs trl 1.12.0 (the last trl with a PPO trainer), found " + trl.__version__
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    tokfile = os.path.join(ROOT, "inputs", "quickstart", "tokenizer.json")
    for spec in CASES:
        make_case(spec, a.out, tokfile)


if __name__ == "__main__":
    main()
