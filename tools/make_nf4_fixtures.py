"""make_nf4_fixtures.py: generates tests/data/nf4 (NF4 4-bit blocks as the real bitsandbytes writes them, and a
tiny Llama saved by transformers in bitsandbytes 4-bit form) for mgrl's C++ NF4 code.

Usage (from the repository root, in a virtualenv with tools/requirements-nf4.txt installed):

    python3 tools/make_nf4_fixtures.py --out tests/data/nf4

Files written (tests/data/nf4/README.md describes every tensor):
  blocks.safetensors     weight matrices, bitsandbytes' packed codes, absmax (plain and double-quantized: 8-bit
                         absmax, offset, nested absmax, nested code) and the dequantized weights
  llama_dense/           a tiny random Llama (hidden 64, 2 layers) as save_pretrained writes it in bf16
  llama_nf4/             the same model loaded with BitsAndBytesConfig(load_in_4bit, nf4, double quant,
                         compute dtype float32) and saved by save_pretrained: transformers' bnb-4bit layout

bitsandbytes runs on the CPU here. Quantization on the CPU is bitsandbytes' "default" (torch) kernel for the 4-bit
codes and its native CPU library for the 8-bit (double-quantized) absmax. The reference dequantization is the
"default" kernel (flat blocks of 64 over the row-major tensor, as the CUDA kernel does): bitsandbytes 0.50.2's
native CPU 4-bit dequantizer gives other values when a row is not a whole number of blocks (e.g. 8 x 96); the
script records that disagreement in the README instead of using it.
"""

import argparse
import json
import os
import shutil
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # bitsandbytes wraps its default kernels in torch.compile
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import bitsandbytes  # noqa: E402
import bitsandbytes.functional as BF  # noqa: E402

BLOCK = 64


def default_dequant_4bit(packed, absmax, shape):
    """bitsandbytes' default-backend 4-bit dequantizer (flat blocks), fp32."""
    # the "default" registration's compute function: the CPU registration is the native kernel
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    code = _get_4bit_code("nf4", packed.device)
    return _dequantize_4bit_compute(packed.reshape(-1), absmax, code, BLOCK, shape, torch.float32)


def block_cases():
    """(name, fp32 matrix) pairs. Shapes: rows split by blocks, a tail block, an odd element count, exact ties at
    the code midpoints, zero blocks, bf16-exact values, and enough blocks for two nested (256-block) groups."""
    g = torch.Generator().manual_seed(2311)
    cases = []
    cases.append(("split_rows", torch.randn(8, 96, generator=g)))  # 768 = 12 blocks, rows of 1.5 blocks
    cases.append(("tail", torch.randn(5, 100, generator=g) * 0.02))  # 500 = 7 blocks + 52
    cases.append(("odd", torch.randn(3, 7, generator=g)))  # 21 values: one block of 21, a padding nibble
    # ties: blocks whose absmax is exactly 1 (or 2) and whose other values are the fp32 midpoints between codes
    code = BF.get_4bit_type("nf4", device="cpu")
    mids = (code[:-1] + code[1:]) / 2
    t = torch.zeros(4, 64)
    t[0, 0] = 1.0
    t[0, 1:16] = mids
    t[0, 16:31] = -mids
    t[0, 31:47] = code
    t[1, :] = 0.0  # an all-zero block
    t[2, 0] = -2.0
    t[2, 1:16] = mids * 2
    t[2, 16:31] = torch.nextafter(mids * 2, torch.tensor(10.0))
    t[2, 31:46] = torch.nextafter(mids * 2, torch.tensor(-10.0))
    t[3, :] = torch.randn(64, generator=g).to(torch.bfloat16).float() * 1e-3
    cases.append(("ties", t))
    # 20 x 832 = 16640 values = 260 blocks: nested groups of 256 + 4
    big = torch.randn(20, 832, generator=g).to(torch.bfloat16).float()
    big[3, :] *= 8.0  # uneven absmax
    cases.append(("nested", big))
    return cases


def make_blocks(out_dir):
    tensors = {}
    meta = {}
    for name, w in block_cases():
        w = w.contiguous()
        tensors[f"{name}.input"] = w
        q, st = BF.quantize_4bit(w, blocksize=BLOCK, quant_type="nf4", compress_statistics=False)
        tensors[f"{name}.codes"] = q.reshape(-1).contiguous()
        tensors[f"{name}.absmax"] = st.absmax.contiguous()
        tensors[f"{name}.dequant"] = default_dequant_4bit(q, st.absmax, tuple(w.shape)).contiguous()
        native = BF.dequantize_4bit(q, st)
        meta[f"{name}.native_cpu_dequant_max_abs_diff"] = float((native - tensors[f"{name}.dequant"]).abs().max())
        q2, st2 = BF.quantize_4bit(w, blocksize=BLOCK, quant_type="nf4", compress_statistics=True)
        assert torch.equal(q2, q), "double quantization changed the codes"
        tensors[f"{name}.dq.absmax"] = st2.absmax.contiguous()  # uint8 codes of (absmax - offset)
        tensors[f"{name}.dq.offset"] = st2.offset.reshape(1).float().contiguous()
        tensors[f"{name}.dq.nested_absmax"] = st2.state2.absmax.contiguous()
        absmax_dq = BF.dequantize_blockwise(st2.absmax, st2.state2) + st2.offset
        tensors[f"{name}.dq.absmax_f32"] = absmax_dq.float().contiguous()
        tensors[f"{name}.dq.dequant"] = default_dequant_4bit(q, absmax_dq.float(), tuple(w.shape)).contiguous()
        full = BF.dequantize_4bit(q2, st2)
        meta[f"{name}.dq.native_cpu_dequant_max_abs_diff"] = float((full - tensors[f"{name}.dq.dequant"]).abs().max())
    tensors["nf4_code"] = BF.get_4bit_type("nf4", device="cpu").float().contiguous()
    tensors["dynamic_code"] = BF.create_dynamic_map().float().contiguous()
    save_file(dict(sorted(tensors.items())), os.path.join(out_dir, "blocks.safetensors"))
    return meta


def make_model(out_dir):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2312)
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # weights of a trained model's scale, not init's 0.02 everywhere
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
            else:
                p.uniform_(0.8, 1.2)
    dense = os.path.join(out_dir, "llama_dense")
    shutil.rmtree(dense, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(dense)
    bnb = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32,
    )
    q = AutoModelForCausalLM.from_pretrained(dense, quantization_config=bnb, device_map="cpu", dtype=torch.float32)
    nf4 = os.path.join(out_dir, "llama_nf4")
    shutil.rmtree(nf4, ignore_errors=True)
    q.save_pretrained(nf4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/nf4")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    meta = make_blocks(args.out)
    make_model(args.out)
    import transformers

    info = dict(
        torch=torch.__version__,
        transformers=transformers.__version__,
        bitsandbytes=bitsandbytes.__version__,
        native_cpu_dequant_disagreement=meta,
    )
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(info, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
