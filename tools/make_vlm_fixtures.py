"""make_vlm_fixtures.py: Gemma 3 as its vision-language checkpoint (Gemma3ForConditionalGeneration, the architecture
of google/gemma-3-4b-it, -12b-it, -27b-it) around the text fixture tests/data/models/gemma3_text, for mgrl's
text-only reading of such a directory. Writes two directories:

- tests/data/models/gemma3_vlm: as transformers 5.24 saves it (model.language_model.*, model.vision_tower.*,
  model.multi_modal_projector.* tensors; a full text_config), and a PEFT 0.21 adapter on the language model only
  (target_modules a regular expression, as PEFT needs to keep LoRA off the vision tower's q/k/v projections);
- tests/data/models/gemma3_vlm_hub: the layout of the checkpoints on the Hub (written by transformers 4.50:
  language_model.model.*, vision_tower.*, multi_modal_projector.* tensors; a text_config holding only the keys that
  differ from Gemma3TextConfig's defaults; eos_token_id [1, 106] at the top level), and the same adapter with the
  module names of transformers 4.50 (base_model.model.language_model.model.layers...).

The language model's weights and LoRA tensors are gemma3_text's, so its reference.safetensors is also the ground
truth of both directories: this script checks that transformers' Gemma3ForConditionalGeneration + PEFT, on text
input, gives the logits of Gemma3ForCausalLM + PEFT on gemma3_text to float64 rounding (and that transformers 5.24
reads the Hub layout to the same model), and says how large the differences are.

Usage (from the repository root, in the virtualenv of tools/requirements-fixtures.txt):
    python3 tools/make_vlm_fixtures.py
"""

import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import (Gemma3Config, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma3TextConfig,
                          SiglipVisionConfig)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import exact_float64, save_safetensors_sorted  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests", "data", "models")
SRC = os.path.join(MODELS, "gemma3_text")
OUT = os.path.join(MODELS, "gemma3_vlm")
HUB = os.path.join(MODELS, "gemma3_vlm_hub")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# PEFT matches a string target_modules with re.fullmatch against each module's name.
TARGET_REGEX = r"model\.language_model\.layers\.\d+\.(self_attn|mlp)\.(" + "|".join(TARGETS) + ")"


def build_vlm():
    tc = Gemma3TextConfig.from_pretrained(SRC)
    vc = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                            image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=tc, vision_config=vc, mm_tokens_per_image=4, image_token_index=180,
                       boi_token_index=178, eoi_token_index=179)
    torch.manual_seed(11)
    model = Gemma3ForConditionalGeneration(cfg).to(torch.float32)
    text = {("model.language_model." + k[len("model."):]): v for k, v in load_file(os.path.join(SRC, "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(text, strict=False)
    assert not unexpected, unexpected
    left = [m for m in missing if not m.startswith(("model.vision_tower.", "model.multi_modal_projector.", "lm_head."))]
    assert not left, left
    model.eval()
    return model


def adapter_tensors(prefix):
    """gemma3_text's LoRA tensors with the module prefix of a VLM layout."""
    src = load_file(os.path.join(SRC, "adapter_model.safetensors"))
    out = {}
    for k, v in src.items():
        assert k.startswith("base_model.model.model.layers."), k
        out["base_model.model." + prefix + k[len("base_model.model.model."):]] = v
    return out


def lora_config():
    with open(os.path.join(SRC, "adapter_config.json")) as f:
        a = json.load(f)
    return LoraConfig(r=a["r"], lora_alpha=a["lora_alpha"], lora_dropout=0.0, target_modules=TARGET_REGEX,
                      use_rslora=a["use_rslora"], bias="none", task_type="CAUSAL_LM")


def write_v5(model):
    shutil.rmtree(OUT, ignore_errors=True)
    model.save_pretrained(OUT)
    shutil.copy(os.path.join(SRC, "generation_config.json"), OUT)
    pm = get_peft_model(model, lora_config())
    want = adapter_tensors("model.language_model.")
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if ".lora_" in n:
                key = n.replace(".default", "")
                p.copy_(want.pop(key))
    assert not want, sorted(want)[:3]
    assert not any(".lora_" in n and "vision" in n for n, _ in pm.named_parameters())
    pm.save_pretrained(OUT)
    readme = os.path.join(OUT, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    pm.unload()


def diff_from_default(d, default):
    skip = {"transformers_version", "architectures", "_name_or_path", "id2label", "label2id", "dtype", "torch_dtype"}
    return {k: v for k, v in d.items() if k not in skip and default.get(k, object()) != v}


def write_hub():
    """The Hub's layout (transformers 4.50's names, a minimal config) from the transformers 5.24 directory."""
    shutil.rmtree(HUB, ignore_errors=True)
    os.makedirs(HUB)
    rename = [("model.language_model.", "language_model.model."), ("model.vision_tower.", "vision_tower."),
              ("model.multi_modal_projector.", "multi_modal_projector."), ("lm_head.", "language_model.lm_head.")]
    tensors = {}
    for k, v in load_file(os.path.join(OUT, "model.safetensors")).items():
        for a, b in rename:
            if k.startswith(a):
                k = b + k[len(a):]
                break
        tensors[k] = v.contiguous()
    save_safetensors_sorted(tensors, os.path.join(HUB, "model.safetensors"), {"format": "pt"})
    with open(os.path.join(OUT, "config.json")) as f:
        v5 = json.load(f)
    text = diff_from_default(v5["text_config"], Gemma3TextConfig().to_dict())
    # transformers 4.50 wrote Gemma 3's RoPE as rope_theta / rope_local_base_freq / rope_scaling
    rp = text.pop("rope_parameters", None) or v5["text_config"]["rope_parameters"]
    full = dict(rp["full_attention"])
    text["rope_theta"] = full.pop("rope_theta")
    text["rope_scaling"] = None if full.get("rope_type", "default") == "default" else full
    text["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"]
    text.pop("layer_types", None)  # 4.50 wrote sliding_window_pattern (default 6) instead
    text["model_type"] = "gemma3_text"
    vision = diff_from_default(v5["vision_config"], SiglipVisionConfig().to_dict())
    vision["model_type"] = "siglip_vision_model"
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": v5["boi_token_index"],
           "eoi_token_index": v5["eoi_token_index"], "eos_token_id": [1, 106],
           "image_token_index": v5["image_token_index"], "initializer_range": 0.02,
           "mm_tokens_per_image": v5["mm_tokens_per_image"], "model_type": "gemma3", "text_config": text,
           "torch_dtype": "float32", "transformers_version": "4.50.0.dev0", "vision_config": vision}
    with open(os.path.join(HUB, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copy(os.path.join(SRC, "generation_config.json"), HUB)
    # The adapter as PEFT wrote it over transformers 4.50's module tree.
    save_safetensors_sorted(adapter_tensors("language_model.model."), os.path.join(HUB, "adapter_model.safetensors"),
                            {"format": "pt"})
    with open(os.path.join(OUT, "adapter_config.json")) as f:
        ac = json.load(f)
    ac["target_modules"] = r".*language_model.*\.(" + "|".join(TARGETS) + ")"
    with open(os.path.join(HUB, "adapter_config.json"), "w") as f:
        json.dump(ac, f, indent=2, sort_keys=True)
        f.write("\n")


def logits_of(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def base_copy(d, cls):
    with tempfile.TemporaryDirectory() as td:
        for f in ("config.json", "model.safetensors", "generation_config.json"):
            shutil.copy(os.path.join(d, f), td)
        return cls.from_pretrained(td, dtype=torch.float64, attn_implementation="eager")


def check():
    R = load_file(os.path.join(SRC, "reference.safetensors"))
    ids, mask = R["input_ids"].long(), R["attention_mask"].long()
    valid = mask.bool()
    with exact_float64():
        text = PeftModel.from_pretrained(base_copy(SRC, Gemma3ForCausalLM), SRC).eval()
        want = logits_of(text, ids, mask)
        vlm = PeftModel.from_pretrained(base_copy(OUT, Gemma3ForConditionalGeneration), OUT).eval()
        got = logits_of(vlm, ids, mask)
        d5 = (got - want)[valid].abs().max().item()
        hub_base = base_copy(HUB, Gemma3ForConditionalGeneration)
        hub_plain = logits_of(hub_base, ids, mask)
        # PEFT reads the adapter with transformers 4.50's module names onto transformers 5.24's module tree
        hub_lora = logits_of(PeftModel.from_pretrained(base_copy(HUB, Gemma3ForConditionalGeneration), HUB).eval(), ids, mask)
        da = (hub_lora - got)[valid].abs().max().item()
        v5_plain = logits_of(base_copy(OUT, Gemma3ForConditionalGeneration), ids, mask)
        dh = (hub_plain - v5_plain)[valid].abs().max().item()
        lora_moves = (want - logits_of(base_copy(SRC, Gemma3ForCausalLM), ids, mask))[valid].abs().max().item()
    print("gemma3_vlm (transformers 5.24 layout) + PEFT vs gemma3_text + PEFT: logits max |diff| %.3g "
          "(the adapter moves them by %.3g)" % (d5, lora_moves))
    print("gemma3_vlm_hub (the Hub's layout, read by transformers 5.24) vs gemma3_vlm: logits max |diff| %.3g" % dh)
    print("gemma3_vlm_hub's adapter (transformers 4.50 module names) vs gemma3_vlm's: logits max |diff| %.3g" % da)
    assert d5 < 1e-12 and dh == 0.0 and da == 0.0 and lora_moves > 1e-3


def main():
    torch.set_num_threads(1)
    model = build_vlm()
    write_v5(model)
    write_hub()
    check()
    for d in (OUT, HUB):
        print(d, sorted(os.listdir(d)))


if __name__ == "__main__":
    main()
