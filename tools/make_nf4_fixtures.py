"""make_nf4_fixtures.py: generates tests/data/nf4 (NF4 4-bit blocks as the real bitsandbytes writes them, and a
tiny Llama saved by transformers in bitsandbytes 4-bit form) for mgrl's C++ NF4 code.

Usage (from the repository root, in a virtualenv with tools/requirements-nf4.txt installed):

    python3 tools/make_nf4_fixtures.py --out tests/data/nf4

Files written (tests/data/nf4/README.md describes every tensor):
  blocks.safetensors     weight matrices, bitsandbytes' packed codes, absmax (plain and double-quantized: 8-bit
                         absmax, offset, nested absmax, nested code) and the dequantized weights
  llama_dense/           a tiny random Llama (hidden 64, 2 layers) as save_pretrained writes it in bf16
  llama_nf4/             the same model loaded with BitsAndBytesConfig(load_in_4bit, nf4, double quant,
                         compute dtype float32) and saved by save_pretrained: transformers' bnb-4bit layout;
                         with a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors) and
                         reference.safetensors: log-probs, loss and LoRA gradients of the QLoRA model
                         (transformers + PEFT + bitsandbytes on the CPU, float32) and the same computed in float64
                         with the bitsandbytes-dequantized weights in a dense model (tools/make_fixtures.py's exact
                         float64 forward); the script checks that the two agree.
  llama_nf4_plain/       the same model quantized without double quantization (an fp32 absmax per block), the model
                         directory only

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
os.environ.setdefault("HF_HUB_OFFLINE", "1")

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
    # The same without double quantization (fp32 absmax per block): the model directory only.
    bnb.bnb_4bit_use_double_quant = False
    q = AutoModelForCausalLM.from_pretrained(dense, quantization_config=bnb, device_map="cpu", dtype=torch.float32)
    plain = os.path.join(out_dir, "llama_nf4_plain")
    shutil.rmtree(plain, ignore_errors=True)
    q.save_pretrained(plain)


QLORA_R = 4
QLORA_ALPHA = 8
BATCH_LENGTHS = [10, 6, 8]


def make_qlora_reference(out_dir):
    """A LoRA adapter over llama_nf4 and what transformers + PEFT + bitsandbytes compute with it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_fixtures as mf  # the float64 machinery of the dense-model fixtures
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    dense_dir = os.path.join(out_dir, "llama_dense")
    nf4_dir = os.path.join(out_dir, "llama_nf4")
    # the saved bnb-4bit directory, as a user loads it (its config.json carries the quantization_config)
    q = AutoModelForCausalLM.from_pretrained(nf4_dir, device_map="cpu", dtype=torch.float32,
                                             attn_implementation="eager")
    assert isinstance(q.model.layers[0].mlp.up_proj, bitsandbytes.nn.Linear4bit)
    lcfg = LoraConfig(r=QLORA_R, lora_alpha=QLORA_ALPHA, lora_dropout=0.0, target_modules=list(mf.TARGET_MODULES),
                      bias="none", task_type="CAUSAL_LM")
    pm = get_peft_model(q, lcfg)
    gen = torch.Generator().manual_seed(2313)
    with torch.no_grad():
        for name, p in sorted(pm.named_parameters(), key=lambda kv: kv[0]):
            if ".lora_A." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            elif ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    pm.eval()
    pm.save_pretrained(nf4_dir)
    os.remove(os.path.join(nf4_dir, "README.md"))  # PEFT's model-card template
    # inputs: a padded batch of 3
    L, V = max(BATCH_LENGTHS), q.config.vocab_size
    lengths = torch.tensor(BATCH_LENGTHS, dtype=torch.int64)
    ids = torch.randint(1, V, (len(BATCH_LENGTHS), L), generator=gen)
    mask = (torch.arange(L)[None, :] < lengths[:, None]).to(torch.int64)
    ids = ids * mask
    # transformers + PEFT + bitsandbytes, float32
    emb = pm.get_input_embeddings()(ids).detach().clone().requires_grad_(True)
    out, lp32, loss32 = mf.forward_loss(pm, emb, ids, mask)
    loss32.backward()
    grads32 = {k: p.grad.detach().clone() for k, p in sorted(mf.lora_params(pm).items())}
    # the same model in float64: a dense Llama holding bitsandbytes' dequantized weights, the same adapter
    dense = LlamaForCausalLM.from_pretrained(dense_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        sd = dense.state_dict()
        for name, mod in q.named_modules():
            if isinstance(mod, bitsandbytes.nn.Linear4bit):
                w = mod.weight
                deq = default_dequant_4bit(w.data, BF.dequantize_blockwise(w.quant_state.absmax,
                                                                           w.quant_state.state2) +
                                           w.quant_state.offset, tuple(w.quant_state.shape))
                key = name.replace("base_model.model.", "").replace(".base_layer", "") + ".weight"
                sd[key].copy_(deq)
        dense.load_state_dict(sd)
    dense = dense.to(torch.float64)
    dm = get_peft_model(dense, lcfg)
    with torch.no_grad():
        src = {k: v for k, v in mf.lora_params(pm).items()}
        for k, p in mf.lora_params(dm).items():
            p.copy_(src[k].to(torch.float64))
    dm.eval()
    with mf.exact_float64():
        ref = mf.compute_reference(dm, ids, mask)
    # QLoRA (float32, bitsandbytes) against the float64 dense reference
    valid = mask.clone()
    valid[:, 0] = 0
    lp_diff = float(((lp32.detach() - ref["logprobs"]) * valid).abs().max())
    loss_diff = float((loss32.detach() - ref["loss"][0]).abs())
    grad_rel = max(float((grads32[k].double() - ref["grad." + k]).norm() / ref["grad." + k].norm()) for k in grads32)
    report = dict(logprobs_max_abs_diff=lp_diff, loss_abs_diff=loss_diff, lora_grad_max_rel_diff=grad_rel,
                  loss=float(ref["loss"][0]))
    if not (lp_diff < 1e-4 and loss_diff < 1e-5 and grad_rel < 1e-4):
        raise SystemExit(f"QLoRA (bitsandbytes, float32) disagrees with the float64 dense reference: {report}")
    ref["bnb_f32.logprobs"] = lp32.detach()
    ref["bnb_f32.loss"] = loss32.detach().reshape(1)
    for k, g in grads32.items():
        ref["bnb_f32.grad." + k] = g
    tensors = {"input_ids": ids.to(torch.int32), "attention_mask": mask.to(torch.int32),
               "lengths": lengths.to(torch.int32)}
    for k, v in ref.items():
        if k in ("logits", "logits_base", "hidden_final"):
            continue  # kept small: the log-probs, loss and gradients are what the C++ test compares
        tensors[k] = v.to(torch.float32).contiguous()
    mf.save_safetensors_sorted(tensors, os.path.join(nf4_dir, "reference.safetensors"),
                               {"format": "pt", "generator": "tools/make_nf4_fixtures.py", "computed_in": "float64",
                                "torch": torch.__version__, "bitsandbytes": bitsandbytes.__version__})
    # (that mgrl's exported adapter loads in PEFT over the bnb base is tools/check_qlora_export.py's check)
    return report


def main():
    # PEFT writes adapter_config.json's target_modules from a Python set: a fixed hash seed keeps the file stable.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/nf4")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    meta = make_blocks(args.out)
    make_model(args.out)
    qlora = make_qlora_reference(args.out)
    import transformers

    info = dict(
        torch=torch.__version__,
        transformers=transformers.__version__,
        bitsandbytes=bitsandbytes.__version__,
        native_cpu_dequant_disagreement=meta,
        qlora_bnb_f32_vs_f64_dense=qlora,
    )
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(info, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
