"""make_rope_fixtures.py: transformers' YaRN RoPE parameters (inverse frequencies and attention factor) for a few
configurations, written to tests/data/rope/yarn.json; mgrl's rope_yarn_inv_freq and config parsing are compared
with them (tests/unit/test_model_fixtures.cpp, test_hf_config.cpp).

Run by hand:  /work/venv-fixtures/bin/python tools/make_rope_fixtures.py
"""
import json
import os

import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

CASES = [
    # Qwen2.5 / Qwen3 long context: head_dim 128, theta 1e6, factor 4 over 32768
    dict(name="qwen_128k", head_dim=128, max_pos=131072,
         rope=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=32768)),
    # explicit betas, no truncation, mscale / mscale_all_dim (DeepSeek style attention factor)
    dict(name="betas_mscale", head_dim=64, max_pos=16384,
         rope=dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, original_max_position_embeddings=2048,
                   beta_fast=16, beta_slow=2, truncate=False, mscale=1.0, mscale_all_dim=0.707)),
    # a given attention factor, a factor below the ramp's singularity guard (low == high)
    dict(name="attention_factor", head_dim=16, max_pos=4096,
         rope=dict(rope_type="yarn", rope_theta=500000.0, factor=2.0, original_max_position_embeddings=64,
                   attention_factor=1.25, beta_fast=4, beta_slow=4)),
    # a null factor: max_position_embeddings / original_max_position_embeddings
    dict(name="implicit_factor", head_dim=32, max_pos=8192,
         rope=dict(rope_type="yarn", rope_theta=10000.0, factor=None, original_max_position_embeddings=1024)),
]


def main():
    out = {"transformers": transformers.__version__, "cases": []}
    for c in CASES:
        cfg = LlamaConfig(hidden_size=c["head_dim"] * 4, num_attention_heads=4, head_dim=c["head_dim"],
                          max_position_embeddings=c["max_pos"], rope_parameters=dict(c["rope"]))
        inv, attn = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
        out["cases"].append(dict(name=c["name"], head_dim=c["head_dim"], max_position_embeddings=c["max_pos"],
                                 rope_parameters=c["rope"], inv_freq=[float(x) for x in inv.tolist()],
                                 attention_factor=float(attn)))
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "rope", "yarn.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for c in out["cases"]:
        print(c["name"], "attention factor", c["attention_factor"], "inv_freq[:3]", c["inv_freq"][:3])


if __name__ == "__main__":
    main()
