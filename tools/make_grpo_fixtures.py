"""make_grpo_fixtures.py: ground truth for mgrl's GRPO objective from the real trl library (GRPOTrainer of trl
1.16): for fixed prompts, completions and per-function rewards on the tiny model fixtures (tests/data/models),
trl's own _generate_and_score_completions (generation and reward calls patched to return the fixed values)
computes rewards, advantages, the completion mask, old-policy and reference log-probs; then trl's _compute_loss
gives the loss, and its backward the gradient of every LoRA tensor. Everything in float64 (transformers' float32
casts patched out as in make_fixtures.py). Writes tests/data/grpo/<case>/{case.json, adapter/, grads.safetensors}.

Usage (from the repository root, in a virtualenv with tools/requirements-fixtures.txt):
    python3 tools/make_grpo_fixtures.py --out tests/data/grpo
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch
from datasets import Dataset
from peft import PeftModel
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import trl
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import exact_float64  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests", "data", "models")
EOS = 2
PAD = 0

CASES = [
    dict(name="grpo_token_beta0", model="llama_gqa", loss_type="grpo", beta=0.0, num_iterations=1),
    dict(name="bnpo_beta_mu2", model="qwen2_bias_tied", loss_type="bnpo", beta=0.04, num_iterations=2, epsilon_high=0.28),
    dict(name="drgrpo_sequence_mu2", model="qwen3_qknorm", loss_type="dr_grpo", beta=0.1, num_iterations=2,
         importance_sampling_level="sequence", scale_rewards="none"),
    dict(name="dapo_mask_truncated_mu2", model="llama_gqa", loss_type="dapo", beta=0.0, num_iterations=2,
         epsilon_high=0.28, scale_rewards="batch", mask_truncated_completions=True),
    dict(name="grpo_klcorr_temp_mu2", model="qwen2_bias_tied", loss_type="grpo", beta=0.04, num_iterations=2,
         use_bias_correction_kl=True, temperature=0.7),
    dict(name="grpo_sequence_batch_mu2", model="llama_gqa", loss_type="grpo", beta=0.02, num_iterations=2,
         importance_sampling_level="sequence", scale_rewards="batch", epsilon=0.1),
    dict(name="dapo_beta_sequence_mu1", model="qwen3_qknorm", loss_type="dapo", beta=0.04, num_iterations=1,
         importance_sampling_level="sequence"),
    dict(name="bnpo_none_klcorr_mu2", model="qwen3_qknorm", loss_type="bnpo", beta=0.1, num_iterations=2,
         use_bias_correction_kl=True, scale_rewards="none", mask_truncated_completions=True),
    # trl's newer objectives (added 2026-11-28): CISPO (ratio weight capped at epsilon_high, detached), SAPO (soft
    # gate), LUSPO (per-sequence token sums), two-sided clipping (delta) and GDPO's normalize_then_sum.
    dict(name="cispo_beta_mu2", model="llama_gqa", loss_type="cispo", beta=0.04, num_iterations=2, epsilon_high=1.1),
    dict(name="cispo_sequence_klcorr_mu2", model="qwen2_bias_tied", loss_type="cispo", beta=0.1, num_iterations=2,
         epsilon_high=1.02, importance_sampling_level="sequence", use_bias_correction_kl=True),
    # VESPO: the log-prob weighted by a gamma function of the sequence's importance ratio (trl's defaults; and other
    # k / lambda with the KL's ratio correction)
    dict(name="vespo_beta_mu2", model="qwen3_qknorm", loss_type="vespo", beta=0.04, num_iterations=2),
    dict(name="vespo_params_klcorr_mu2", model="llama_gqa", loss_type="vespo", beta=0.1, num_iterations=2,
         use_bias_correction_kl=True, vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.5, vespo_lambda_neg=1.5),
    dict(name="sapo_beta_temp_mu2", model="qwen2_bias_tied", loss_type="sapo", beta=0.04, num_iterations=2,
         temperature=0.8, sapo_temperature_pos=1.5, sapo_temperature_neg=2.0),
    dict(name="dapo_delta_mu2", model="qwen3_qknorm", loss_type="dapo", beta=0.0, num_iterations=2, epsilon_high=0.28,
         delta=1.3),
    dict(name="luspo_gdpo_sequence_mu1", model="llama_gqa", loss_type="luspo", beta=0.02, num_iterations=1,
         importance_sampling_level="sequence", multi_objective_aggregation="normalize_then_sum"),
    dict(name="dapo_opsm_beta_mu2", model="qwen2_bias_tied", loss_type="dapo", beta=0.04, num_iterations=2,
         off_policy_mask_threshold=0.1),
    # Reward functions that return None (NaN; added 2026-11-29): completion 0 unscorable (both NaN), group 1's first
    # function with one value left, scattered missing values: nan-aware means and stds, advantage 0 where NaN.
    dict(name="grpo_none_rewards_mu2", model="llama_gqa", loss_type="grpo", beta=0.04, num_iterations=2,
         nan=[(0, 0), (0, 1), (4, 0), (5, 0), (6, 0), (9, 1), (11, 0)]),
    dict(name="dapo_none_rewards_batch_mu1", model="qwen2_bias_tied", loss_type="dapo", beta=0.0, num_iterations=1,
         scale_rewards="batch", nan=[(2, 0), (2, 1), (3, 1), (8, 0), (8, 1), (10, 0)]),
    dict(name="gdpo_none_rewards_mu1", model="qwen3_qknorm", loss_type="grpo", beta=0.0, num_iterations=1,
         multi_objective_aggregation="normalize_then_sum", nan=[(0, 0), (0, 1), (4, 0), (5, 0), (6, 0), (9, 1)]),
    # top_entropy_quantile: the policy loss on the highest-entropy tokens only (added 2026-11-29).
    dict(name="dapo_top_entropy_beta_mu2", model="llama_gqa", loss_type="dapo", beta=0.04, num_iterations=2,
         top_entropy_quantile=0.3),
    dict(name="grpo_top_entropy_sequence_mu1", model="qwen2_bias_tied", loss_type="grpo", beta=0.0, num_iterations=1,
         importance_sampling_level="sequence", top_entropy_quantile=0.6, temperature=0.8),
    # steps_per_generation (added 2026-11-29): the generation batch of 12 completions shuffled by trl's
    # shuffle_sequence_dict and cut into steps_per_generation slices; the loss of slice `slice` after the policy
    # moved (the round's later steps): old log-probs of the whole batch, dapo's num_items_in_batch of the whole batch.
    dict(name="dapo_beta_spg2", model="qwen2_bias_tied", loss_type="dapo", beta=0.04, num_iterations=1,
         steps_per_generation=2, slice=1),
    dict(name="bnpo_spg3_mu2", model="llama_gqa", loss_type="bnpo", beta=0.0, num_iterations=2,
         steps_per_generation=3, slice=2, epsilon_high=0.28),
    dict(name="grpo_sequence_spg2", model="qwen3_qknorm", loss_type="grpo", beta=0.02, num_iterations=1,
         steps_per_generation=2, slice=0, importance_sampling_level="sequence"),
    dict(name="cispo_spg2_mu2", model="llama_gqa", loss_type="cispo", beta=0.0, num_iterations=2,
         steps_per_generation=2, slice=1, epsilon_high=1.1),
    # The entropy bonus (entropy_coef; added 2026-11-29): minus coef x the mean entropy over the loss tokens, alone and
    # over the top_entropy_quantile tokens.
    dict(name="dapo_entropy_beta_mu2", model="qwen3_qknorm", loss_type="dapo", beta=0.04, num_iterations=2,
         entropy_coef=0.05),
    dict(name="grpo_entropy_top_quantile_mu1", model="llama_gqa", loss_type="grpo", beta=0.0, num_iterations=1,
         entropy_coef=0.1, top_entropy_quantile=0.5, temperature=0.8),
    # trl's RLOOTrainer (added 2026-11-29; mgrl: grpo.loss_type = "rloo"): leave-one-out advantages of the rewards
    # minus beta x the summed k1 KL, the clipped ratio of the summed log-probs, mean over completions.
    dict(name="rloo_beta_mu2", move=0.02, model="llama_gqa", trainer="rloo", beta=0.05, num_iterations=2, epsilon=0.1),
    dict(name="rloo_normalize_clip_mask_mu2", move=0.02, model="qwen2_bias_tied", trainer="rloo", beta=0.1, num_iterations=2,
         normalize_advantages=True, reward_clip_range=(0.2, 1.1), mask_truncated_completions=True,
         epsilon_high=0.3, temperature=0.8),
    dict(name="rloo_beta0_none_rewards_mu1", model="qwen3_qknorm", trainer="rloo", beta=0.0, num_iterations=1,
         nan=[(0, 0), (0, 1), (4, 0), (5, 0), (5, 1), (6, 0), (6, 1), (7, 0), (7, 1)]),
    dict(name="rloo_spg2_beta", move=0.02, model="qwen3_qknorm", trainer="rloo", beta=0.04, num_iterations=1,
         steps_per_generation=2, slice=1),
]
P, G, LP, LMAX = 3, 4, 5, 6  # prompts, generations, prompt length (equal: no left padding), max completion


def batch_for(seed, vocab):
    """Fixed prompts and completions: lengths 1..LMAX, some ending with EOS, some truncated (LMAX, no EOS)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (LP,), generator=g).tolist() for _ in range(P)]
    completions = []
    for i in range(P * G):
        n = 1 + (i * 5 + seed) % LMAX
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        if i % 3 != 2 or n < LMAX:  # most end with EOS; every third of full length is truncated
            if n == LMAX and i % 3 == 2:
                pass
            else:
                ids[-1] = EOS
        completions.append(ids)
    completions[1] = torch.randint(3, vocab, (LMAX,), generator=g).tolist()  # at least one truncated
    r1 = torch.randint(0, 2, (P * G,), generator=g).double()
    r2 = torch.rand(P * G, generator=g, dtype=torch.float64)
    r1[G:2 * G] = 1.0  # one group: equal rewards (zero std)
    r2[G:2 * G] = 0.5
    return prompts, completions, torch.stack([r1, r2], dim=1)


def base_model(name):
    tmp = tempfile.mkdtemp()
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(os.path.join(MODELS, name, f), tmp)
    m = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float64, attn_implementation="eager")
    shutil.rmtree(tmp)
    return PeftModel.from_pretrained(m, os.path.join(MODELS, name), is_trainable=True)


def lora_named(pm):
    # The trained adapter ("default"); with beta > 0 trl keeps a frozen copy of the starting adapter ("ref") as the
    # reference policy.
    return {n: p for n, p in pm.named_parameters() if "lora_" in n and ".default." in n}


def peft_key(n):  # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight -> PEFT file name
    return n.replace(".default", "")


def make_case(spec, out_root, tokenizer_file):
    torch.manual_seed(0)
    model = base_model(spec["model"])
    vocab = model.config.vocab_size
    prompts, completions, rewards_pf = batch_for(len(spec["name"]), vocab)
    for i, f in spec.get("nan", []):
        rewards_pf[i, f] = float("nan")
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, eos_token="<eos>", pad_token="<pad>")
    tok.eos_token_id  # noqa
    rloo = spec.get("trainer") == "rloo"
    if rloo:
        cfg = RLOOConfig(
            output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=False, fp16=False,
            per_device_train_batch_size=P * G // spec.get("steps_per_generation", 1), num_generations=G,
            gradient_accumulation_steps=1, steps_per_generation=spec.get("steps_per_generation", 1),
            max_completion_length=LMAX, beta=spec["beta"], epsilon=spec.get("epsilon", 0.2),
            epsilon_high=spec.get("epsilon_high"), num_iterations=spec["num_iterations"],
            temperature=spec.get("temperature", 1.0),
            mask_truncated_completions=spec.get("mask_truncated_completions", False), reward_weights=[1.0, 0.5],
            normalize_advantages=spec.get("normalize_advantages", False),
            reward_clip_range=spec.get("reward_clip_range"), logging_steps=1, seed=0, gradient_checkpointing=False,
        )
    else:
        cfg = GRPOConfig(
            output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True, bf16=False, fp16=False,
            per_device_train_batch_size=P * G // spec.get("steps_per_generation", 1), num_generations=G,
            gradient_accumulation_steps=1, steps_per_generation=spec.get("steps_per_generation", 1),
            max_completion_length=LMAX, loss_type=spec["loss_type"], beta=spec["beta"],
            epsilon=spec.get("epsilon", 0.2), epsilon_high=spec.get("epsilon_high"),
            num_iterations=spec["num_iterations"], importance_sampling_level=spec.get("importance_sampling_level", "token"),
            scale_rewards=spec.get("scale_rewards", "group"), temperature=spec.get("temperature", 1.0),
            mask_truncated_completions=spec.get("mask_truncated_completions", False),
            use_bias_correction_kl=spec.get("use_bias_correction_kl", False), reward_weights=[1.0, 0.5],
            delta=spec.get("delta"), sapo_temperature_pos=spec.get("sapo_temperature_pos", 1.0),
            sapo_temperature_neg=spec.get("sapo_temperature_neg", 1.05),
            vespo_k_pos=spec.get("vespo_k_pos", 2.0), vespo_lambda_pos=spec.get("vespo_lambda_pos", 3.0),
            vespo_k_neg=spec.get("vespo_k_neg", 3.0), vespo_lambda_neg=spec.get("vespo_lambda_neg", 2.0),
            multi_objective_aggregation=spec.get("multi_objective_aggregation", "sum_then_normalize"),
            off_policy_mask_threshold=spec.get("off_policy_mask_threshold"),
            top_entropy_quantile=spec.get("top_entropy_quantile", 1.0),
            entropy_coef=spec.get("entropy_coef", 0.0),
            logging_steps=1, seed=0, gradient_checkpointing=False,
        )
    ds = Dataset.from_dict({"prompt": ["p"] * P})
    trainer = (RLOOTrainer if rloo else GRPOTrainer)(model=model, reward_funcs=[lambda **k: [0.0] * len(k["prompts"])] * 2, args=cfg,
                          train_dataset=ds, processing_class=tok)
    trainer.eos_token_ids = [EOS] if hasattr(trainer, "eos_token_ids") else None
    trainer._tokenizer.pad_token_id = PAD
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop in trl; one micro-batch here
    inputs = [{"prompt": "p%d" % (i // G)} for i in range(P * G)]
    prompt_ids_list = [prompts[i // G] for i in range(P * G)]

    def fake_generate(prompts_):
        if rloo:
            return prompt_ids_list, completions, ["c"] * len(completions)
        return prompt_ids_list, completions, None, ["c"] * len(completions), None, {}, None, None

    trainer._generate = fake_generate
    # RLOO's scoring pass keeps only summed log-probs: its per-token ones (old policy, then reference) are recorded.
    scored = []
    if rloo:
        inner = trainer._get_per_token_logps_and_entropies

        def recording(*a, **k):
            r = inner(*a, **k)
            scored.append(r[0])
            return r
        trainer._get_per_token_logps_and_entropies = recording
    trainer._calculate_rewards = lambda *a, **k: rewards_pf.clone()
    pm = trainer.model
    pm.train()
    with exact_float64():
        if spec.get("trainer") == "rloo" and spec["beta"] != 0.0:
            # The policy that sampled the round away from the reference (the starting adapter, trl's "ref" copy), so
            # that the KL penalty in the rewards is not 0.
            g = torch.Generator().manual_seed(99)
            with torch.no_grad():
                for n, p in sorted(lora_named(pm).items()):
                    p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.05)
        with torch.no_grad():
            out = trainer._generate_and_score_completions(inputs)
        if rloo:
            trainer._get_per_token_logps_and_entropies = inner
            out["old_per_token_logps"] = scored[0]
            out["ref_per_token_logps"] = scored[1] if spec["beta"] != 0.0 else None
        # The policy at which the loss is evaluated: the fixture adapter, moved a little when the round serves
        # several steps (num_iterations or steps_per_generation > 1).
        spg = spec.get("steps_per_generation", 1)
        if spec["num_iterations"] > 1 or spg > 1:
            g = torch.Generator().manual_seed(1234)
            with torch.no_grad():
                for n, p in sorted(lora_named(pm).items()):
                    p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64) * spec.get("move", 0.08))
        for p in pm.parameters():
            p.grad = None
        out["num_items_in_batch"] = out["completion_mask"].sum()
        full = out
        in_loss = list(range(P * G))
        if spg > 1:
            # trl's _prepare_inputs: shuffle the generation batch, split it into steps_per_generation slices; an
            # index column follows the shuffle to name the slice's completions.
            from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict
            torch.manual_seed(7)
            shuffled = shuffle_sequence_dict(dict(out, _idx=torch.arange(P * G)))
            part = split_tensor_dict(shuffled, spg)[spec["slice"]]
            in_loss = [int(x) for x in part.pop("_idx")]
            out = part
        loss = trainer._compute_loss(pm, out)
        loss.backward()
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            pm, torch.cat([full["prompt_ids"], full["completion_ids"]], 1),
            torch.cat([full["prompt_mask"], full["completion_mask"]], 1), full["completion_ids"].size(1))
    out = full
    cm = out["completion_mask"]

    def rows(t):
        return None if t is None else [[float(x) for x in t[i, :len(completions[i])]] for i in range(P * G)]

    d = os.path.join(out_root, spec["name"])
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    pm.save_pretrained(os.path.join(d, "adapter"), selected_adapters=["default"])  # not trl's frozen "ref" copy
    for extra in ("README.md",):
        p = os.path.join(d, "adapter", extra)
        if os.path.exists(p):
            os.remove(p)
    # float32 adapter file (as PEFT writes by default for float32 models)
    from safetensors.torch import load_file
    af = os.path.join(d, "adapter", "adapter_model.safetensors")
    save_file({k: v.float().contiguous() for k, v in sorted(load_file(af).items())}, af, metadata={"format": "pt"})
    grads = {peft_key(n): p.grad.float().contiguous() for n, p in sorted(lora_named(pm).items())}
    save_file(grads, os.path.join(d, "grads.safetensors"), metadata={"format": "pt"})
    trunc = [completions[i][-1] != EOS for i in range(P * G)]
    case = {
        "model": spec["model"], "trl_version": trl.__version__,
        "config": {"loss_type": "rloo" if rloo else spec["loss_type"], "beta": spec["beta"], "epsilon": cfg.epsilon,
                   "epsilon_high": trainer.epsilon_high, "num_iterations": spec["num_iterations"],
                   "importance_sampling_level": getattr(cfg, "importance_sampling_level", "token"),
                   "scale_rewards": getattr(cfg, "scale_rewards", "none"),
                   "temperature": cfg.temperature, "mask_truncated_completions": cfg.mask_truncated_completions,
                   "use_bias_correction_kl": getattr(cfg, "use_bias_correction_kl", False),
                   "max_completion_length": LMAX,
                   "num_generations": G, "reward_weights": [1.0, 0.5],
                   "steps_per_generation": cfg.steps_per_generation,
                   **({"normalize_advantages": cfg.normalize_advantages,
                       "reward_clip_range": list(cfg.reward_clip_range) if cfg.reward_clip_range else None} if rloo else
                      {"delta": cfg.delta, "sapo_temperature_pos": cfg.sapo_temperature_pos,
                       "sapo_temperature_neg": cfg.sapo_temperature_neg,
                       "vespo_k_pos": cfg.vespo_k_pos, "vespo_lambda_pos": cfg.vespo_lambda_pos,
                       "vespo_k_neg": cfg.vespo_k_neg, "vespo_lambda_neg": cfg.vespo_lambda_neg,
                       "multi_objective_aggregation": cfg.multi_objective_aggregation,
                       "off_policy_mask_threshold": cfg.off_policy_mask_threshold,
                       "top_entropy_quantile": cfg.top_entropy_quantile,
                       "entropy_coef": cfg.entropy_coef})},
        # the completions of the slice whose loss this is (slice order; all of them with one slice)
        "in_loss": in_loss,
        "eos_token_id": EOS, "prompts": prompts, "completions": completions, "truncated": trunc,
        # None for NaN (a reward function's None); rewards: trl's nansum, None where every function gave None
        "rewards_per_func": [[None if x != x else x for x in row] for row in rewards_pf.tolist()],
        "rewards": [None if all(x != x for x in row) else s for row, s in zip(
            rewards_pf.tolist(), (rewards_pf * torch.tensor([1.0, 0.5], dtype=torch.float64)).nansum(1).tolist())],
        "advantages": [float(x) for x in out["advantages"]],
        "completion_mask": [[int(x) for x in cm[i, :len(completions[i])]] for i in range(P * G)],
        "policy_logps": rows(logps.detach()),
        "old_logps": rows(out.get("old_per_token_logps")),
        "ref_logps": rows(out.get("ref_per_token_logps")),
        "loss": float(loss.detach()),
        # trl's "entropy" metric of this _compute_loss: the masked mean entropy of the tempered distributions
        "entropy": float(trainer._metrics["train"]["entropy"][-1]),
    }
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    ratio = None
    if case["old_logps"]:
        lo = hi = 0
        eps_lo, eps_hi = cfg.epsilon, trainer.epsilon_high
        for i in range(P * G):
            for a, b in zip(case["policy_logps"][i], case["old_logps"][i]):
                r = torch.exp(torch.tensor(a - b)).item()
                lo += r < 1 - eps_lo
                hi += r > 1 + eps_hi
        ratio = (lo, hi)
        if spec.get("off_policy_mask_threshold"):
            masked = 0
            for i in range(P * G):
                kl = [b - a for a, b in zip(case["policy_logps"][i], case["old_logps"][i])]
                masked += case["advantages"][i] < 0 and sum(kl) / len(kl) > spec["off_policy_mask_threshold"]
            ratio += ("off-policy masked %d" % masked,)
        if spec.get("delta"):
            ratio += (sum(torch.exp(torch.tensor(a - b)).item() > spec["delta"] for i in range(P * G)
                          for a, b in zip(case["policy_logps"][i], case["old_logps"][i])),)
    print("%-26s %-16s loss %+.10e  truncated %d  ratios outside [low, high]: %s" %
          (spec["name"], spec["model"], case["loss"], sum(trunc), ratio))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "grpo"))
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
