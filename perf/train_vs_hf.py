"""train_vs_hf.py: LoRA training speed of `mgrl sft` against transformers + PEFT on the same GPU, same model, same data.

One command on a GPU machine (torch, transformers and peft installed; an mgrl build with CUDA):

    python3 perf/train_vs_hf.py --mgrl build-gpu/mgrl [--batch 8 --seq 1024 --steps 20] [--shape qwen2.5-0.5b]

It writes a randomly initialised model of the chosen shape (bf16 safetensors, transformers' own save_pretrained) and
a JSONL of fixed-length examples (prompt "1+1=", a completion of random digits, tokenised by the quickstart's
character tokenizer, so every sequence has exactly --seq tokens), then trains LoRA (r 16, alpha 32, all 7 projections,
bf16 base, AdamW) for --steps steps with each stack and prints, from the steps after the warm-up: step time, tokens/s
over all tokens of the batch, peak GPU memory, and the ratio mgrl / transformers. The Hugging Face loop is the plain
one a user writes (sdpa attention, no gradient checkpointing, no torch.compile).
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {
    # Qwen2.5-0.5B: 24 layers, hidden 896, 14 query heads, 2 KV heads, head_dim 64, tied embeddings.
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                         rms_norm_eps=1e-6, max_position_embeddings=32768),
    # Qwen2.5-1.5B: 28 layers, hidden 1536, 12 query heads, 2 KV heads, head_dim 128, tied embeddings.
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                         rms_norm_eps=1e-6, max_position_embeddings=32768),
    # Qwen2.5-7B: 28 layers, hidden 3584, 28 query heads, 4 KV heads, head_dim 128, separate lm_head.
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, rope_theta=1000000.0,
                       rms_norm_eps=1e-6, max_position_embeddings=32768),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True, rope_theta=10000.0,
                 rms_norm_eps=1e-6, max_position_embeddings=4096),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_model(path, shape, device="cpu", overrides=None, edit=None, after_save=None):
    """A randomly initialised Qwen2 model of the shape, bf16, saved by transformers; initialised on `device`
    (on a GPU a 7B model takes seconds instead of minutes). overrides: extra config fields; edit(model): changes the
    weights before the save (under no_grad); after_save(model): e.g. writes an adapter of it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(**{**SHAPES[shape], **(overrides or {})}, torch_dtype="bfloat16")
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    if edit:
        with torch.no_grad():
            edit(model)
    model.save_pretrained(path, safe_serialization=True)
    if after_save:
        after_save(model)
    del model
    if device != "cpu":
        torch.cuda.empty_cache()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ROOT, "inputs", "quickstart", f), path)


def make_data(path, n, seq):
    # "<bos>1+1=" is 5 tokens; the completion's digits plus EOS fill the rest.
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"prompt": "1+1=", "completion": "".join(rng.choice("0123456789") for _ in range(seq - 6))}) + "\n")


def run_mgrl(args, model_dir, data, work):
    log = os.path.join(work, "mgrl_log")
    cmd = [args.mgrl, "sft", f"--runtime.backend={args.backend}", f"--model.path={model_dir}", f"--data.input={data}",
           f"--train.batch_size={args.batch}", f"--train.max_seq_len={args.seq}", "--lora.r=16", "--lora.alpha=32",
           f"--train.max_steps={args.steps}", "--train.lr=1e-4", f"--log.every_steps={args.warmup}",
           f"--log.dir={log}"]
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    sys.stdout.write(out.stdout[-3000:])
    if out.returncode != 0:
        sys.stdout.write(out.stderr[-3000:])
        raise SystemExit(f"mgrl failed with exit code {out.returncode}")
    rows = [json.loads(l) for l in open(os.path.join(log, "metrics.jsonl")) if '"tokens_per_second"' in l]
    # tokens_per_second counts every token of the batch over each logging interval; after the first (warm-up)
    # interval.
    tps = [r["tokens_per_second"] for r in rows if r["step"] > args.warmup]
    batch_tokens = args.batch * args.seq
    step_s = sum(batch_tokens / t for t in tps) / len(tps)
    # mgrl's own count of device memory in use, sampled at each logged step (metrics.jsonl's peak_gpu_gib; absent
    # on the CPU backend).
    peaks = [r["peak_gpu_gib"] for r in rows if "peak_gpu_gib" in r]
    peak = f"{max(peaks):.2f} GiB" if peaks else None
    return step_s, peak, wall


def run_hf(args, model_dir, data):
    import torch
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    rows = [json.loads(l) for l in open(data)][: args.batch]
    ids, labels = [], []
    for r in rows:
        p = tok.encode(r["prompt"]).ids
        c = tok.encode(r["completion"], add_special_tokens=False).ids + [2]
        ids.append(p + c)
        labels.append([-100] * len(p) + c)
    assert all(len(x) == args.seq for x in ids), "examples must have exactly --seq tokens"
    dev = "cpu" if args.backend == "cpu" else "cuda"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    x = torch.tensor(ids, device=dev)
    y = torch.tensor(labels, device=dev)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16, attn_implementation="sdpa").to(dev)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, lora_dropout=0.0))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.steps):
        sync()
        t0 = time.time()
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.time() - t0)
    step_s = sum(times[args.warmup:]) / len(times[args.warmup:])
    return step_s, (torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else float("nan"))


def step_flops(shape, batch, seq, r=16):
    """Model FLOPs of one LoRA step (frozen base): forward 2 x every matmul weight per token, backward 2 x again for
    the input gradients (no weight gradients of frozen weights), LoRA's own A/B products 3 x 2 x r (in + out) per
    adapted projection, causal attention 4 x L^2 / 2 x heads x head_dim per sequence and layer forward, 2.5x that
    backward. The lm_head counts like any matmul."""
    c = SHAPES[shape]
    h, f, n, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], seq, c["vocab_size"]
    hd = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    proj = [(h, h), (h, kv), (h, kv), (h, h), (h, f), (h, f), (f, h)]  # (in, out) of q k v o gate up down
    dense = n * sum(i * o for i, o in proj) + h * V
    lora = n * sum(r * (i + o) for i, o in proj)
    tokens = batch * seq
    attn_fwd = n * batch * 4 * (L * L / 2) * c["num_attention_heads"] * hd
    return tokens * (4 * dense + 6 * lora) + 3.5 * attn_fwd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mgrl", default=os.path.join(ROOT, "build", "mgrl"))
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the timing (and mgrl's logging interval)")
    ap.add_argument("--skip-hf", action="store_true", help="time mgrl only")
    ap.add_argument("--backend", default="cuda", help="mgrl's runtime.backend (cpu: a check of this script without a GPU)")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="the GPU's dense bf16 peak for MFU (H100 SXM: 989; H200: 989; A100: 312; V100 fp16: 125)")
    ap.add_argument("--out", help="also append the table to this file")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="mgrl_perf_")
    model_dir, data = os.path.join(work, "model"), os.path.join(work, "train.jsonl")
    make_model(model_dir, args.shape, "cpu" if args.backend == "cpu" else "cuda")
    make_data(data, max(64, args.batch * args.steps), args.seq)
    tokens = args.batch * args.seq
    m_step, m_peak, m_wall = run_mgrl(args, model_dir, data, work)
    flops = step_flops(args.shape, args.batch, args.seq)
    mfu = lambda s: 100.0 * flops / s / (args.peak_tflops * 1e12)
    lines = [f"\n{args.shape}, LoRA r 16 on {len(TARGETS)} projections, bf16, batch {args.batch} x {args.seq} tokens, "
             f"{args.steps} steps ({args.warmup} warm-up left out); {flops / 1e12:.1f} TFLOP a step, MFU against "
             f"{args.peak_tflops:.0f} TFLOP/s",
             "| stack | step | tokens/s (all tokens) | MFU | peak GPU memory |", "|---|---|---|---|---|",
             f"| mgrl sft | {m_step:.3f} s | {tokens / m_step:,.0f} | {mfu(m_step):.1f}% | {m_peak or 'n/a'} |"]
    if not args.skip_hf:
        h_step, h_peak = run_hf(args, model_dir, data)
        lines.append(f"| transformers + PEFT (sdpa) | {h_step:.3f} s | {tokens / h_step:,.0f} | {mfu(h_step):.1f}% | "
                     f"{h_peak:.1f} GiB |")
        lines.append(f"\nmgrl / transformers+PEFT speed: {h_step / m_step:.2f}x")
    lines.append(f"(mgrl's whole process, start-up and model load included: {m_wall:.1f} s)")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
