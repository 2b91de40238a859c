"""make_fixtures.py: generates the tiny-model reference fixtures under tests/data/models (Hugging Face
transformers + PEFT ground truth for mgrl's C++ Llama/Qwen2/Qwen3/Gemma2/Gemma3/Mistral + LoRA model), then
checks them.

Usage (from the repository root, in a virtualenv with tools/requirements-fixtures.txt installed):

    python3 tools/make_fixtures.py --out tests/data/models

For each of six tiny random models it writes a directory with config.json + model.safetensors (as
transformers' save_pretrained writes them, float32), adapter_config.json + adapter_model.safetensors (as
PEFT's save_pretrained writes them) and reference.safetensors (logits, log-probs, loss and gradients computed
in float64). tests/data/models/README.md describes every file and tensor. Everything is deterministic: fixed
seeds, one CPU thread, no hub downloads (configs are built in code, weights are random).

Precision note: transformers upcasts/downcasts to float32 inside RMSNorm, the rotary embedding (inv_freq and
cos/sin) and the eager softmax, even when the model is in float64. So that the reference is float64 all the
way, the forward used for reference.safetensors runs with those three pieces patched to keep float64
(`exact_float64()` below; the math is unchanged). The self-check compares the result against (a) unpatched
transformers in float64 and float32 reloaded from disk, and (b) an independent from-scratch float64
implementation that reads only the written files (`manual_forward`), and checks the gradients by central
finite differences.
"""

import argparse
import contextlib
import inspect
import json
import math
import os
import shutil
import sys
import tempfile
import warnings

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import peft
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.llama import modeling_llama
from transformers.models.mistral import modeling_mistral
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PAD_ID = 0
BATCH = 3

# The seven models. Sizes are deliberately not powers of two; head_dim must be even (RoPE rotates halves).
MODELS = [
    dict(
        name="llama_gqa",
        seed=1001,
        cls=LlamaForCausalLM,
        config_cls=LlamaConfig,
        config=dict(
            vocab_size=211,
            hidden_size=60,
            intermediate_size=152,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,  # GQA: 3 query heads per kv head
            head_dim=10,
            max_position_embeddings=128,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            hidden_act="silu",
            # Llama 3.1 style scaling. With head_dim 10 and theta 5e4 the 5 frequencies have wavelengths
            # 6.3, 54.7, 476, 4142, 36047 tokens; with original_max_position_embeddings 64, low 1, high 4:
            # frequency 0 is kept (< 16), 1 is smoothed (between 16 and 64), 2..4 are divided by the factor (> 64).
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=50000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
        lora=dict(r=4, use_rslora=False),
        seq_len=12,
        lengths=[12, 7, 10],
    ),
    dict(
        name="qwen2_bias_tied",
        seed=2002,
        cls=Qwen2ForCausalLM,
        config_cls=Qwen2Config,
        config=dict(
            vocab_size=173,
            hidden_size=48,
            intermediate_size=120,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            hidden_act="silu",
            use_sliding_window=False,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ),
        lora=dict(r=4, use_rslora=True),
        seq_len=9,
        lengths=[5, 9, 8],
    ),
    dict(
        name="qwen3_qknorm",
        seed=3003,
        cls=Qwen3ForCausalLM,
        config_cls=Qwen3Config,
        config=dict(
            vocab_size=257,
            hidden_size=54,
            intermediate_size=136,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=3,
            head_dim=10,  # hidden_size / num_attention_heads would be 9; q width 60 != hidden 54
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            attention_bias=False,
            hidden_act="silu",
            use_sliding_window=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        lora=dict(r=3, use_rslora=False),
        seq_len=13,
        lengths=[13, 10, 6],
    ),
    # Qwen3 with YaRN (rope_type "yarn", factor 4, original context 32 of 128): with head_dim 12 and theta 1e4 the
    # correction range is dimensions [0, 2] (beta_fast 32 -> -1.2 -> 0, beta_slow 1 -> 1.06 -> 2): frequency 0 is
    # the plain one, 1 halfway, 2 to 5 divided by 4; cos and sin are multiplied by 0.1 ln 4 + 1 = 1.1386.
    dict(
        name="qwen3_yarn",
        seed=7007,
        cls=Qwen3ForCausalLM,
        config_cls=Qwen3Config,
        config=dict(
            vocab_size=151,
            hidden_size=48,
            intermediate_size=104,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            attention_bias=False,
            hidden_act="silu",
            use_sliding_window=False,
            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                 original_max_position_embeddings=32),
        ),
        lora=dict(r=4, use_rslora=False),
        seq_len=12,
        lengths=[12, 9, 5],
    ),
    # Gemma 2: (1 + w) norms before and after attention and MLP, GeGLU (tanh GELU), embeddings scaled by
    # sqrt(hidden), query_pre_attn_scalar, attention-logit and final-logit soft-capping (caps small enough to
    # matter at these sizes), layer 0 sliding (window 4 < every sequence) and layer 1 global, tied embeddings.
    dict(
        name="gemma2_softcap",
        seed=4004,
        cls=Gemma2ForCausalLM,
        config_cls=Gemma2Config,
        config=dict(
            vocab_size=199,
            hidden_size=48,
            intermediate_size=112,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,  # not hidden / heads (12)
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            attention_bias=False,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=24,
            sliding_window=4,
            attn_logit_softcapping=1.5,
            final_logit_softcapping=2.5,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        lora=dict(r=4, use_rslora=False),
        seq_len=11,
        lengths=[11, 7, 9],
    ),
    # Gemma 3 text: as Gemma 2 without soft-capping, with q/k norms ((1 + w)), 5 sliding layers per global one
    # (layers 0-4 and 6 sliding, window 3; layer 5 global), local RoPE base 10000 and global base 1e6 with linear
    # scaling (factor 4) on the global layer.
    dict(
        name="gemma3_text",
        seed=5005,
        cls=Gemma3ForCausalLM,
        config_cls=Gemma3TextConfig,
        config=dict(
            vocab_size=181,
            hidden_size=40,
            intermediate_size=96,
            num_hidden_layers=7,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=8,  # not hidden / heads (10)
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            attention_bias=False,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=12,
            sliding_window=3,
            layer_types=["sliding_attention"] * 5 + ["full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
                "full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=4.0),
            },
        ),
        lora=dict(r=2, use_rslora=False),
        seq_len=10,
        lengths=[10, 6, 8],
    ),
    # Mistral: Llama with a sliding window on every layer (5 < the longest sequences) and its own head_dim.
    dict(
        name="mistral_window",
        seed=6006,
        cls=MistralForCausalLM,
        config_cls=MistralConfig,
        config=dict(
            vocab_size=167,
            hidden_size=48,
            intermediate_size=100,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=10,  # not hidden / heads (12)
            max_position_embeddings=128,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            hidden_act="silu",
            sliding_window=5,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ),
        lora=dict(r=4, use_rslora=False),
        seq_len=12,
        lengths=[12, 8, 10],
    ),
]

GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")

LORA_ALPHA = 8
INIT_STD = 0.1  # linear weights and embeddings
BIAS_STD = 0.2
LORA_A_STD = 0.2
LORA_B_STD = 0.05


# ----------------------------------------------------------------------------------------------------------
# RoPE inverse frequencies in float64 (transformers computes them in float32; checked against it below)
# ----------------------------------------------------------------------------------------------------------
def rope_params_from_config_dict(cfg, layer_type="full_attention"):
    """rope parameters from a config.json dict, transformers 5.x (rope_parameters, flat or per layer type as
    Gemma 3 has it) or 4.x (rope_theta, rope_scaling; Gemma 3: rope_local_base_freq for sliding layers, whose
    RoPE is never scaled) layout. Returns a dict with at least rope_type and rope_theta."""
    if cfg.get("rope_parameters"):
        rp = cfg["rope_parameters"]
        rp = dict(rp[layer_type] if layer_type in rp else rp)
    elif layer_type == "sliding_attention" and "rope_local_base_freq" in cfg:
        rp = dict(rope_type="default", rope_theta=cfg["rope_local_base_freq"])
    else:
        rp = dict(cfg.get("rope_scaling") or {})
        rp.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rp["rope_type"] = rp.get("rope_type", rp.get("type", "default"))
    return rp


def rope_inv_freq_f64(rp, head_dim):
    base = float(rp["rope_theta"])
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if rp["rope_type"] == "default":
        return inv
    if rp["rope_type"] == "linear":
        return inv / float(rp["factor"])
    if rp["rope_type"] == "yarn":  # NTK-by-parts: the ramp between extrapolation (inv) and interpolation (inv / f)
        factor, orig = float(rp["factor"]), float(rp["original_max_position_embeddings"])
        beta_fast, beta_slow = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

        def corr(rot):
            return head_dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr(beta_fast), corr(beta_slow)
        if rp.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        return (inv / factor) * ramp + inv * (1 - ramp)
    if rp["rope_type"] != "llama3":
        raise ValueError(f"unsupported rope_type {rp['rope_type']}")
    factor = float(rp["factor"])
    low, high = float(rp["low_freq_factor"]), float(rp["high_freq_factor"])
    old_ctx = float(rp["original_max_position_embeddings"])
    low_wl, high_wl = old_ctx / low, old_ctx / high
    out = torch.empty_like(inv)
    for i, f in enumerate(inv.tolist()):
        wl = 2 * math.pi / f
        if wl < high_wl:
            out[i] = f
        elif wl > low_wl:
            out[i] = f / factor
        else:
            s = (old_ctx / wl - low) / (high - low)
            out[i] = (1 - s) * f / factor + s * f
    return out


def rope_attention_factor(rp):
    """YaRN's factor on cos and sin (1 for the other types): given, or 0.1 ln(factor) + 1."""
    if rp["rope_type"] != "yarn":
        return 1.0
    if rp.get("attention_factor") is not None:
        return float(rp["attention_factor"])
    factor = float(rp["factor"])
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def _config_rope_params(config, layer_type=None):
    rp = config.rope_parameters
    if isinstance(rp, dict) and "rope_type" not in rp:  # nested per layer type (Gemma 3)
        return rp[layer_type]
    return rp


# ----------------------------------------------------------------------------------------------------------
# Keep transformers' forward in float64 (it casts to float32 in RMSNorm, RoPE and the eager softmax)
# ----------------------------------------------------------------------------------------------------------
def _rmsnorm_forward_exact(self, hidden_states):
    input_dtype = hidden_states.dtype
    x = hidden_states.to(torch.promote_types(input_dtype, torch.float32))
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * x.to(input_dtype)


def _gemma_rmsnorm_forward_exact(self, x):
    x64 = x.to(torch.promote_types(x.dtype, torch.float32))
    out = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + self.eps)
    return (out * (1.0 + self.weight.to(out.dtype))).type_as(x)


@torch.no_grad()
def _rotary_forward_exact(self, x, position_ids, layer_type=None):
    head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
    inv = rope_inv_freq_f64(_config_rope_params(self.config, layer_type), head_dim).to(x.device)
    hf = (self.inv_freq if layer_type is None else getattr(self, f"{layer_type}_inv_freq")).to(torch.float64)
    if not torch.allclose(inv, hf, rtol=2e-6, atol=0):
        raise AssertionError(f"float64 inv_freq {inv.tolist()} != transformers' {hf.tolist()}")
    freqs = position_ids[..., None].to(torch.float64) * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    scaling = self.attention_scaling if layer_type is None else getattr(self, f"{layer_type}_attention_scaling")
    return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)


def _make_eager_exact(repeat_kv):
    def eager_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                                **kwargs):
        if scaling is None:
            scaling = module.head_dim**-0.5
        key_states = repeat_kv(key, module.num_key_value_groups)
        value_states = repeat_kv(value, module.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if softcap is not None:
            attn_weights = softcap * torch.tanh(attn_weights / softcap)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        sm_dtype = torch.promote_types(query.dtype, torch.float32)
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=sm_dtype).to(query.dtype)
        attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
        attn_output = torch.matmul(attn_weights, value_states)
        return attn_output.transpose(1, 2).contiguous(), attn_weights

    return eager_attention_forward


@contextlib.contextmanager
def exact_float64():
    saved = []
    for mod, prefix in ((modeling_llama, "Llama"), (modeling_qwen2, "Qwen2"), (modeling_qwen3, "Qwen3"),
                        (modeling_gemma2, "Gemma2"), (modeling_gemma3, "Gemma3"), (modeling_mistral, "Mistral")):
        norm_cls = getattr(mod, prefix + "RMSNorm")
        rot_cls = getattr(mod, prefix + "RotaryEmbedding")
        saved += [(norm_cls, "forward", norm_cls.forward), (rot_cls, "forward", rot_cls.forward),
                  (mod, "eager_attention_forward", mod.eager_attention_forward)]
        norm_cls.forward = _gemma_rmsnorm_forward_exact if prefix.startswith("Gemma") else _rmsnorm_forward_exact
        rot_cls.forward = _rotary_forward_exact
        mod.eager_attention_forward = _make_eager_exact(mod.repeat_kv)
    try:
        yield
    finally:
        for obj, attr, val in reversed(saved):
            setattr(obj, attr, val)


# ----------------------------------------------------------------------------------------------------------
# Building and saving
# ----------------------------------------------------------------------------------------------------------
def build_base_model(spec):
    config = spec["config_cls"](**spec["config"])
    config._attn_implementation = "eager"
    torch.manual_seed(spec["seed"])
    model = spec["cls"](config).to(torch.float32)
    model.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        # named_parameters() lists a tied weight once (Qwen2: lm_head.weight is model.embed_tokens.weight).
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):  # input/post_attention/final/q/k norms: away from 1
                # Gemma scales by (1 + w): w in [-0.5, 0.5)
                p.copy_(torch.rand(p.shape, generator=gen) + (-0.5 if spec["cls"].__name__ in GEMMA else 0.5))
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * BIAS_STD)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)
    model.eval()
    return model


def add_lora(model, spec):
    lcfg = LoraConfig(
        r=spec["lora"]["r"],
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=list(TARGET_MODULES),
        use_rslora=spec["lora"]["use_rslora"],
        bias="none",
        task_type="CAUSAL_LM",
    )
    pm = get_peft_model(model, lcfg)
    gen = torch.Generator().manual_seed(spec["seed"] + 1)
    with torch.no_grad():
        for name, p in sorted(pm.named_parameters(), key=lambda kv: kv[0]):
            if ".lora_A." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * LORA_A_STD)
            elif ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * LORA_B_STD)
    pm.eval()
    return pm


def save_model(model, out_dir):
    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True  # transformers 4.x; 5.x always writes safetensors
    model.save_pretrained(out_dir, **kwargs)


def write_legacy_config(out_dir):
    """config.transformers4.json: config.json rewritten in the transformers 4.x layout (rope_theta and
    rope_scaling at top level, torch_dtype), the layout most published checkpoints still have."""
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    legacy = {}
    for k, v in cfg.items():
        if k == "rope_parameters" and "full_attention" in v:  # Gemma 3: rope_theta, rope_local_base_freq
            rp = dict(v["full_attention"])
            legacy["rope_theta"] = rp.pop("rope_theta")
            legacy["rope_scaling"] = None if rp.get("rope_type", "default") == "default" else rp
            legacy["rope_local_base_freq"] = v["sliding_attention"]["rope_theta"]
        elif k == "rope_parameters":
            rp = dict(v)
            legacy["rope_theta"] = rp.pop("rope_theta")
            legacy["rope_scaling"] = None if rp.get("rope_type", "default") == "default" else rp
        elif k == "dtype":
            legacy["torch_dtype"] = v
        else:
            legacy[k] = v
    with open(os.path.join(out_dir, "config.transformers4.json"), "w") as f:
        json.dump(legacy, f, indent=2, sort_keys=True)
        f.write("\n")


def make_inputs(spec):
    gen = torch.Generator().manual_seed(spec["seed"] + 2)
    L, V = spec["seq_len"], spec["config"]["vocab_size"]
    lengths = torch.tensor(spec["lengths"], dtype=torch.int64)
    assert len(lengths) == BATCH and int(lengths.max()) == L and int(lengths.min()) <= L - 3
    ids = torch.randint(1, V, (BATCH, L), generator=gen)  # valid tokens never use the pad id 0
    mask = (torch.arange(L)[None, :] < lengths[:, None]).to(torch.int64)
    ids = ids * mask + PAD_ID * (1 - mask)
    return ids, mask, lengths


# ----------------------------------------------------------------------------------------------------------
# Reference computation
# ----------------------------------------------------------------------------------------------------------
def token_logprobs(logits, input_ids, mask):
    """[B, L]: logprobs[b, t] = log_softmax(logits[b, t-1])[ids[b, t]] for valid t >= 1, else 0."""
    lp = torch.log_softmax(logits[:, :-1].to(torch.float64), dim=-1)
    tgt = lp.gather(-1, input_ids[:, 1:, None])[..., 0]
    valid = mask[:, 1:].to(torch.float64)
    out = torch.zeros(input_ids.shape, dtype=torch.float64)
    out[:, 1:] = tgt * valid
    return out


def loss_from_logprobs(lp, mask):
    valid = mask.clone()
    valid[:, 0] = 0
    return -(lp * valid).sum() / valid.sum()


def lora_params(pm):
    """{adapter file key: parameter}: PEFT's in-memory names carry the adapter name ('.default')."""
    out = {}
    for name, p in pm.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            out[name.replace(".default.", ".")] = p
    return out


def forward_loss(pm, embeds, ids, mask):
    out = pm(inputs_embeds=embeds, attention_mask=mask, output_hidden_states=True, use_cache=False)
    lp = token_logprobs(out.logits, ids, mask)
    return out, lp, loss_from_logprobs(lp, mask)


def compute_reference(pm, ids, mask):
    """pm in float64, inside exact_float64(). Returns {name: float64/int tensor}."""
    emb_layer = pm.get_input_embeddings()
    embeds = emb_layer(ids).detach().clone().requires_grad_(True)
    for p in pm.parameters():
        p.grad = None
    out, lp, loss = forward_loss(pm, embeds, ids, mask)
    loss.backward()
    ref = {
        "logits": out.logits.detach(),
        "logprobs": lp.detach(),
        "loss": loss.detach().reshape(1),
        "hidden_final": out.hidden_states[-1].detach(),
        "grad.inputs_embeds": embeds.grad.detach().clone(),
    }
    for key, p in sorted(lora_params(pm).items()):
        assert p.grad is not None and p.grad.abs().max() > 0, key
        ref["grad." + key] = p.grad.detach().clone()
    for name, p in pm.named_parameters():
        assert (".lora_" in name) == p.requires_grad, name
        assert p.requires_grad or p.grad is None, name
    with torch.no_grad():
        with pm.disable_adapter():
            ref["logits_base"] = pm(input_ids=ids, attention_mask=mask, use_cache=False).logits.detach()
        # the input_ids path gives the same logits as the inputs_embeds path
        same = pm(input_ids=ids, attention_mask=mask, use_cache=False).logits
        assert torch.equal(same, ref["logits"]) or (same - ref["logits"]).abs().max() < 1e-12
    return ref


def write_reference(path, ref, ids, mask, lengths, spec):
    tensors = {
        "input_ids": ids.to(torch.int32).contiguous(),
        "attention_mask": mask.to(torch.int32).contiguous(),
        "lengths": lengths.to(torch.int32).contiguous(),
    }
    for k, v in ref.items():
        tensors[k] = v.to(torch.float32).contiguous()
    meta = {
        "format": "pt",
        "generator": "tools/make_fixtures.py",
        "model": spec["name"],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "computed_in": "float64",
    }
    save_safetensors_sorted(tensors, path, meta)


def save_safetensors_sorted(tensors, path, metadata):
    """A safetensors file with a byte-for-byte reproducible header: __metadata__ first, then the tensors
    sorted by name, data in the same order (safetensors.torch.save_file orders the metadata by a randomly
    seeded hash map). The header is padded with spaces to a multiple of 8 bytes, as the format allows."""
    dtypes = {torch.float32: "F32", torch.int32: "I32", torch.int64: "I64", torch.float64: "F64"}
    header = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for data in blobs:
            f.write(data)


# ----------------------------------------------------------------------------------------------------------
# Independent float64 forward from the files alone (what the C++ model must compute)
# ----------------------------------------------------------------------------------------------------------
def manual_forward(model_dir, input_ids, lengths, use_adapter=True, inputs_embeds=None, config_name="config.json"):
    with open(os.path.join(model_dir, config_name)) as f:
        cfg = json.load(f)
    with open(os.path.join(model_dir, "adapter_config.json")) as f:
        acfg = json.load(f)
    W = {k: v.to(torch.float64) for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    A = {k: v.to(torch.float64) for k, v in load_file(os.path.join(model_dir, "adapter_model.safetensors")).items()}
    arch = cfg["architectures"][0]
    assert arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM") + GEMMA
    gemma = arch in GEMMA
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    r, alpha = acfg["r"], acfg["lora_alpha"]
    assert not acfg.get("rank_pattern") and not acfg.get("alpha_pattern")
    scaling = alpha / math.sqrt(r) if acfg.get("use_rslora") else alpha / r
    n_layers = cfg["num_hidden_layers"]
    # Which layers slide: Gemma names them (layer_types); Mistral slides on every layer when it has a window.
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types") or ["sliding_attention" if window else "full_attention"] * n_layers
    inv_freqs = {t: rope_inv_freq_f64(rope_params_from_config_dict(cfg, t), hd) for t in set(types)}
    rope_m = {t: rope_attention_factor(rope_params_from_config_dict(cfg, t)) for t in set(types)}
    score_scale = cfg["query_pre_attn_scalar"] ** -0.5 if gemma else 1.0 / math.sqrt(hd)
    attn_cap = cfg.get("attn_logit_softcapping") if gemma else None
    final_cap = cfg.get("final_logit_softcapping") if gemma else None

    def rms(x, w):
        n = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return n * (1 + w) if gemma else n * w

    def linear(x, name):
        y = x @ W[name + ".weight"].T
        if name + ".bias" in W:
            y = y + W[name + ".bias"]
        ka = "base_model.model." + name + ".lora_A.weight"
        if use_adapter and ka in A:
            kb = "base_model.model." + name + ".lora_B.weight"
            y = y + scaling * ((x @ A[ka].T) @ A[kb].T)
        return y

    def rope(x, pos, inv_freq, m):  # x [B, T, heads, hd]; rotate_half convention: pairs (i, i + hd/2); m: YaRN's
        ang = pos[:, None].to(torch.float64) * inv_freq[None, :]
        cos = m * torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
        sin = m * torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def gelu_tanh(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))

    B, T = input_ids.shape
    x = W["model.embed_tokens.weight"][input_ids] if inputs_embeds is None else inputs_embeds
    if gemma and inputs_embeds is None:
        x = x * math.sqrt(H)
    pos = torch.arange(T)
    key_ok = torch.arange(T)[None, :] < lengths[:, None]  # [B, T]
    qi, ki = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (ki <= qi)[None] & key_ok[:, None, :]  # [B, Tq, Tk]
    allowed_win = allowed & (ki > qi - window)[None] if window else allowed  # key j seen by query i: i - w < j <= i
    # a padding row sees itself (it may have no other key inside a window): no NaN to spread through v
    allowed, allowed_win = allowed | (ki == qi)[None], allowed_win | (ki == qi)[None]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = linear(h, p + "self_attn.q_proj").view(B, T, nh, hd)
        k = linear(h, p + "self_attn.k_proj").view(B, T, nkv, hd)
        v = linear(h, p + "self_attn.v_proj").view(B, T, nkv, hd)
        if p + "self_attn.q_norm.weight" in W:  # Qwen3, Gemma 3
            q = rms(q, W[p + "self_attn.q_norm.weight"])
            k = rms(k, W[p + "self_attn.k_norm.weight"])
        q, k = rope(q, pos, inv_freqs[types[i]], rope_m[types[i]]), rope(k, pos, inv_freqs[types[i]], rope_m[types[i]])
        g = nh // nkv
        k = k.repeat_interleave(g, dim=2)  # query head j uses kv head j // g
        v = v.repeat_interleave(g, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * score_scale
        if attn_cap:
            s = attn_cap * torch.tanh(s / attn_cap)
        ok = allowed_win if types[i] == "sliding_attention" else allowed
        s = s.masked_fill(~ok[:, None], float("-inf"))
        a = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v).reshape(B, T, nh * hd)
        o = linear(a, p + "self_attn.o_proj")
        if gemma:
            x = x + rms(o, W[p + "post_attention_layernorm.weight"])
            h = rms(x, W[p + "pre_feedforward_layernorm.weight"])
            m = linear(gelu_tanh(linear(h, p + "mlp.gate_proj")) * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
            x = x + rms(m, W[p + "post_feedforward_layernorm.weight"])
        else:
            x = x + o
            h = rms(x, W[p + "post_attention_layernorm.weight"])
            x = x + linear(F.silu(linear(h, p + "mlp.gate_proj")) * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    hidden = rms(x, W["model.norm.weight"])
    lm = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    logits = hidden @ lm.T
    if final_cap:
        logits = final_cap * torch.tanh(logits / final_cap)
    return logits, hidden


# ----------------------------------------------------------------------------------------------------------
# Self-check
# ----------------------------------------------------------------------------------------------------------
def valid_max_diff(a, b, mask):
    """max |a - b| over valid positions ([B, L, ...] tensors, mask [B, L])."""
    m = mask.bool()
    return (a.to(torch.float64)[m] - b.to(torch.float64)[m]).abs().max().item()


BASE_FILES = ("config.json", "generation_config.json", "model.safetensors")


def reload(model_dir, dtype, trainable=False):
    """Base model + PeftModel.from_pretrained. The base model is loaded from a copy of the base files only:
    AutoModelForCausalLM.from_pretrained(model_dir) on the directory itself would already attach the adapter
    it finds there (transformers' PEFT integration), and PEFT would then inject it a second time."""
    with tempfile.TemporaryDirectory() as td:
        for f in BASE_FILES:
            if os.path.exists(os.path.join(model_dir, f)):
                shutil.copy(os.path.join(model_dir, f), td)
        base = AutoModelForCausalLM.from_pretrained(td, dtype=dtype, attn_implementation="eager")
    assert not any(".lora_" in n for n, _ in base.named_parameters())
    pm = PeftModel.from_pretrained(base, model_dir, is_trainable=trainable)
    pm.eval()
    return pm


def check_dir(model_dir, spec):
    rep = {"name": spec["name"]}
    R = load_file(os.path.join(model_dir, "reference.safetensors"))
    ids, mask, lengths = R["input_ids"].long(), R["attention_mask"].long(), R["lengths"].long()
    assert torch.equal(mask, (torch.arange(ids.shape[1])[None] < lengths[:, None]).long())
    assert torch.all(ids[mask == 0] == PAD_ID)

    # grads present for exactly the adapter's tensors, with the same shapes
    ad = load_file(os.path.join(model_dir, "adapter_model.safetensors"))
    gkeys = {k[5:] for k in R if k.startswith("grad.") and k != "grad.inputs_embeds"}
    assert gkeys == set(ad), (gkeys ^ set(ad))
    for k, v in ad.items():
        assert R["grad." + k].shape == v.shape and v.dtype == torch.float32, k
    n_lora = len(ad)

    # 1. reload with plain transformers + PEFT in float32 (no patches) and compare logits
    pm32 = reload(model_dir, torch.float32)
    with torch.no_grad():
        l32 = pm32(input_ids=ids, attention_mask=mask).logits
        with pm32.disable_adapter():
            l32b = pm32(input_ids=ids, attention_mask=mask).logits
    rep["reload_f32"] = max(valid_max_diff(l32, R["logits"], mask), valid_max_diff(l32b, R["logits_base"], mask))
    # transformers alone, on the directory itself: it attaches the adapter it finds there
    auto = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        la = auto(input_ids=ids, attention_mask=mask).logits
    rep["auto_adapter_f32"] = valid_max_diff(la, R["logits"], mask)

    # 2. reload in float64, unpatched transformers (float32 casts inside) and patched (exact float64)
    pm64 = reload(model_dir, torch.float64, trainable=True)
    with torch.no_grad():
        l64 = pm64(input_ids=ids, attention_mask=mask).logits
        with exact_float64():
            l64x = pm64(input_ids=ids, attention_mask=mask).logits
            with pm64.disable_adapter():
                l64xb = pm64(input_ids=ids, attention_mask=mask).logits
    if spec["config"].get("sliding_window"):
        # Unpatched transformers in float64 adds float64's minimum as the mask and takes the softmax in float32,
        # where it becomes -inf: a padding row with no key inside its window is then NaN, and 0 * NaN spreads it to
        # the valid rows through v at the next layer. So this check runs each sequence alone, without padding.
        diffs = []
        for b in range(ids.shape[0]):
            n = int(lengths[b])
            with torch.no_grad():
                lb = pm64(input_ids=ids[b:b + 1, :n], attention_mask=mask[b:b + 1, :n]).logits
            diffs.append((lb[0].double() - R["logits"][b, :n].double()).abs().max().item())
        rep["reload_f64_hf"] = max(diffs)
    else:
        rep["reload_f64_hf"] = valid_max_diff(l64, R["logits"], mask)
    rep["reload_f64_exact"] = max(valid_max_diff(l64x, R["logits"], mask), valid_max_diff(l64xb, R["logits_base"], mask))

    # 3. independent implementation from the files; also from config.transformers4.json
    with torch.no_grad():
        ml, mh = manual_forward(model_dir, ids, lengths, True)
        mlb, _ = manual_forward(model_dir, ids, lengths, False)
        ml4, _ = manual_forward(model_dir, ids, lengths, True, config_name="config.transformers4.json")
    rep["manual_vs_exact"] = max(valid_max_diff(ml, l64x, mask), valid_max_diff(mlb, l64xb, mask),
                                 valid_max_diff(ml4, l64x, mask))
    rep["manual_vs_file"] = max(valid_max_diff(ml, R["logits"], mask), valid_max_diff(mlb, R["logits_base"], mask),
                                valid_max_diff(mh, R["hidden_final"], mask))
    rep["adapter_effect"] = valid_max_diff(R["logits"], R["logits_base"], mask)

    # the 4.x-layout config loads to the same configuration in transformers
    with tempfile.TemporaryDirectory() as td:
        shutil.copy(os.path.join(model_dir, "config.transformers4.json"), os.path.join(td, "config.json"))
        c4 = AutoConfig.from_pretrained(td)
        c5 = AutoConfig.from_pretrained(model_dir)
        for key in ("rope_parameters", "head_dim", "num_key_value_heads", "tie_word_embeddings", "rms_norm_eps"):
            assert getattr(c4, key, None) == getattr(c5, key, None), (key, getattr(c4, key, None), getattr(c5, key, None))

    # 4. log-probs and loss: recomputed from the manual logits by an explicit loop, and HF's own loss
    lp_loop = torch.zeros(ids.shape, dtype=torch.float64)
    terms = []
    for b in range(ids.shape[0]):
        for t in range(1, int(lengths[b])):
            row = ml[b, t - 1]
            mx = row.max()
            lse = mx + torch.log(torch.exp(row - mx).sum())
            lp_loop[b, t] = row[ids[b, t]] - lse
            terms.append(-lp_loop[b, t].item())
    loss_loop = sum(terms) / len(terms)
    rep["logprobs_diff"] = (lp_loop - R["logprobs"].double()).abs().max().item()
    rep["loss"] = R["loss"].item()
    rep["loss_diff"] = abs(loss_loop - R["loss"].item())
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad(), exact_float64():
        hf_loss = pm64(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
    rep["hf_loss_diff"] = abs(hf_loss - R["loss"].item())
    rep["n_targets"] = len(terms)

    # 5. gradients: recomputed by autograd on the reloaded float64 model (exact) and compared with the file;
    #    then checked by central finite differences, one random direction per tensor
    with exact_float64():
        g64 = compute_reference(pm64, ids, mask)
    rep["grad_vs_file"] = max(
        ((g64[k] - R[k].double()).abs().max() / g64[k].abs().max()).item() for k in g64 if k.startswith("grad."))
    gen = torch.Generator().manual_seed(spec["seed"] + 3)
    params = lora_params(pm64)
    base_embeds = pm64.get_input_embeddings()(ids).detach()
    eps = 1e-4
    worst = 0.0

    def loss_at(embeds):
        with torch.no_grad(), exact_float64():
            return forward_loss(pm64, embeds, ids, mask)[2].item()

    def fd_derivative(f):  # fourth-order central difference of t -> f(t) at 0
        return (8 * (f(eps) - f(-eps)) - (f(2 * eps) - f(-2 * eps))) / (12 * eps)

    for key in sorted(params) + ["inputs_embeds"]:
        g = g64["grad." + key]
        if key == "inputs_embeds":
            d = torch.randn(base_embeds.shape, generator=gen, dtype=torch.float64) * mask[..., None]
            fd = fd_derivative(lambda t: loss_at(base_embeds + t * d))
        else:
            p = params[key]
            d = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p0 = p.detach().clone()

            def f(t):
                with torch.no_grad():
                    p.copy_(p0 + t * d)
                return loss_at(base_embeds)

            fd = fd_derivative(f)
            with torch.no_grad():
                p.copy_(p0)
        an = (g * d).sum().item()
        worst = max(worst, abs(fd - an) / max(abs(an), 1e-8))
    rep["grad_fd_relerr"] = worst
    rep["n_lora"] = n_lora
    # gradients at padded positions of the inputs are exactly zero
    rep["pad_grad_zero"] = bool(torch.all(R["grad.inputs_embeds"][mask == 0] == 0))
    return rep


# ----------------------------------------------------------------------------------------------------------
def generate(spec, out_root):
    d = os.path.join(out_root, spec["name"])
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model = build_base_model(spec)
    save_model(model, d)
    write_legacy_config(d)
    pm = add_lora(model, spec)
    pm.save_pretrained(d)
    # PEFT also writes a model-card template (README.md) with no information in it: not kept
    if os.path.exists(os.path.join(d, "README.md")):
        os.remove(os.path.join(d, "README.md"))
    ids, mask, lengths = make_inputs(spec)
    pm = pm.to(torch.float64)
    with exact_float64():
        ref = compute_reference(pm, ids, mask)
    write_reference(os.path.join(d, "reference.safetensors"), ref, ids, mask, lengths, spec)
    return d


def main():
    # PEFT writes adapter_config.json's target_modules from a Python set: fix the hash seed so that the file
    # is the same on every run.
    # HF_HUB_OFFLINE: nothing here may touch the hub.
    if os.environ.get("PYTHONHASHSEED") != "0" or os.environ.get("HF_HUB_OFFLINE") != "1":
        os.environ["PYTHONHASHSEED"] = "0"
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data/models", help="output root (default: tests/data/models)")
    ap.add_argument("--check-only", action="store_true", help="only run the self-check on existing files")
    ap.add_argument("--models", default="", help="comma-separated model names (default: all)")
    args = ap.parse_args()
    chosen = set(filter(None, args.models.split(",")))
    unknown = chosen - {m["name"] for m in MODELS}
    if unknown:
        ap.error(f"unknown models {sorted(unknown)}")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.makedirs(args.out, exist_ok=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    reports = []
    for spec in MODELS:
        if chosen and spec["name"] not in chosen:
            continue
        d = os.path.join(args.out, spec["name"])
        if not args.check_only:
            generate(spec, args.out)
        reports.append(check_dir(d, spec))
        sizes = {f: os.path.getsize(os.path.join(d, f)) for f in sorted(os.listdir(d))}
        print(f"{spec['name']}: " + ", ".join(f"{f} {s}" for f, s in sizes.items()))

    cols = [("name", "model", "{}"), ("loss", "loss", "{:.6f}"), ("n_targets", "targets", "{}"),
            ("n_lora", "lora", "{}"),
            ("reload_f32", "reload f32", "{:.1e}"), ("auto_adapter_f32", "auto f32", "{:.1e}"),
            ("reload_f64_hf", "f64 hf", "{:.1e}"),
            ("reload_f64_exact", "f64 exact", "{:.1e}"), ("manual_vs_exact", "manual/exact", "{:.1e}"),
            ("manual_vs_file", "manual/file", "{:.1e}"), ("logprobs_diff", "logprobs", "{:.1e}"),
            ("loss_diff", "loss", "{:.1e}"), ("hf_loss_diff", "hf loss", "{:.1e}"),
            ("grad_vs_file", "grad/file rel", "{:.1e}"), ("grad_fd_relerr", "grad fd rel", "{:.1e}"), ("adapter_effect", "adapter eff", "{:.2f}"),
            ("pad_grad_zero", "pad grad 0", "{}")]
    print()
    print("max |diff| of logits at valid positions against reference.safetensors (f32 storage) unless noted")
    print(" | ".join(h for _, h, _ in cols))
    for r in reports:
        print(" | ".join(fmt.format(r[k]) for k, _, fmt in cols))
    limits = dict(reload_f32=1e-4, auto_adapter_f32=1e-4, grad_vs_file=1e-6, reload_f64_hf=1e-4, reload_f64_exact=1e-5, manual_vs_exact=1e-10,
                  manual_vs_file=1e-5, logprobs_diff=1e-5, loss_diff=1e-6, hf_loss_diff=1e-5, grad_fd_relerr=1e-6)
    bad = [(r["name"], k, r[k]) for r in reports for k, lim in limits.items() if not r[k] <= lim]
    bad += [(r["name"], "adapter_effect", r["adapter_effect"]) for r in reports if r["adapter_effect"] < 1e-2]
    bad += [(r["name"], "pad_grad_zero", False) for r in reports if not r["pad_grad_zero"]]
    if bad:
        print("SELF-CHECK FAILED:", bad)
        sys.exit(1)
    print("self-check passed")


if __name__ == "__main__":
    main()
