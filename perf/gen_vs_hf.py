"""gen_vs_hf.py: decoding speed of `mgrl generate` against transformers' `model.generate` on the same GPU, same model, same prompts.

One command on a GPU machine (torch, transformers and peft installed; an mgrl build with CUDA):

    python3 perf/gen_vs_hf.py --mgrl build-gpu/mgrl --shape qwen2.5-0.5b --batches 1,8,64,256 --prompt-len 128 --new-tokens 256

It writes a randomly initialised Qwen2 model of the chosen shape (the shapes of perf/train_vs_hf.py; bf16 safetensors
by transformers' own save_pretrained; the quickstart's tokenizer) and, for each batch size B, B prompts of exactly
--prompt-len random token ids (no special ids), given to mgrl as {"prompt_tokens": [...]} lines. Both stacks decode
greedily and every completion is exactly --new-tokens long: the model's EOS row of the output matrix is zero, so EOS
has logit 0 and is never the argmax of a random model's logits (and transformers also gets min_new_tokens); the
lengths mgrl wrote are checked and the tokens actually generated are counted.

Timing. mgrl: the seconds its generate prints (the generation loop only: start-up, model load and the output file
are outside). It has no prefill/decode split, so a second run with --new-tokens 1 measures prefill (plus the KV-cache
set-up and one sampling step) and is subtracted: decode tokens/s = (generated - B) / (t_full - t_prefill). All B
prompts run at once (generate.max_sequences = B) and their prefill is one step (generate.max_prefill_tokens = B x
prompt length); the prefill runs are repeated (--repeats, median). transformers: one warm-up generate, then
prefill = a generate with max_new_tokens=1 (median of --repeats) and decode tokens/s = B * (N - 1) / (t_full - t_prefill), with torch.cuda.synchronize around each. The Hugging Face
side is the plain one a user writes: sdpa attention, the default dynamic cache, no torch.compile.

At batch 1 it also prints the fraction of the memory-bandwidth roofline: bytes read per decode step (every weight
once, the output matrix included and the embedding gather left out, plus the K and V of the average context) over
the bandwidth of a large device-to-device copy measured here, against the measured time per token.

Correctness, cheaply: at batch 1 the first 8 greedy tokens of the two stacks are compared, and the log-probs of the
tokens they share (mgrl's output against transformers' logits); a mismatch is reported, not an error. A random
model's greedy output mostly repeats the prompt's last token, so the log-probs are the finer check.

--lora attaches an untrained PEFT LoRA (r 16, alpha 32, all 7 projections; PEFT's initialisation, so B = 0) to
both: transformers + PEFT unmerged, mgrl through --lora.adapter with the same adapter directory. --merge-lora on|off|auto
sets mgrl's generate.merge_lora (sampling from the adapter merged into the weights: no LoRA kernels in the decode
step; B = 0 does not change its cost); perf/merge_mismatch.py measures what merging changes in the tokens.
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' and peft's deprecation notices
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_vs_hf  # noqa: E402  (the shapes, the LoRA targets and the repository root)

ROOT, SHAPES, TARGETS = train_vs_hf.ROOT, train_vs_hf.SHAPES, train_vs_hf.TARGETS
# The quickstart tokenizer's special tokens: <pad> 0, <bos> 1, <eos> 2, <unk> 3. Prompts use ids from 4 on.
PAD, BOS, EOS, FIRST_ORDINARY = 0, 1, 2, 4
MATCH_TOKENS = 8  # tokens compared between the stacks at batch 1


def quiet_transformers():
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def make_model(path, shape, device, adapter_dir=None, b_std=0.0):
    """train_vs_hf's model (random Qwen2 of the shape, bf16, transformers' save_pretrained, quickstart tokenizer) with
    the special ids set and the EOS row of the output matrix zeroed; with adapter_dir, also a PEFT LoRA: untrained
    (B = 0), or with b_std > 0 its B drawn from normal(0, b_std) (an adapter that changes the model, as a trained one)."""
    quiet_transformers()

    def zero_eos(model):
        # EOS gets logit exactly 0: a random model's largest logit over the vocabulary is positive, so greedy decoding
        # never ends early (with tied embeddings this also zeroes EOS's input embedding, which no prompt uses).
        model.get_output_embeddings().weight[EOS].zero_()

    def save_adapter(model):
        import torch
        from peft import LoraConfig, get_peft_model
        peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, lora_dropout=0.0))
        if b_std > 0:
            gen = torch.Generator(device="cpu").manual_seed(1)
            with torch.no_grad():
                for name, w in peft.named_parameters():
                    if "lora_B" in name:
                        w.copy_(torch.randn(w.shape, generator=gen, dtype=torch.float32).to(w.dtype) * b_std)
        peft.save_pretrained(adapter_dir)

    train_vs_hf.make_model(path, shape, device, overrides={"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD},
                           edit=zero_eos, after_save=save_adapter if adapter_dir else None)


def make_prompts(n, length, vocab):
    rng = random.Random(0)
    return [[rng.randrange(FIRST_ORDINARY, vocab) for _ in range(length)] for _ in range(n)]


def safetensors_tensors(model_dir):
    """name -> (dtype, shape) of every tensor of the model directory, from the safetensors headers."""
    out = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            with open(os.path.join(model_dir, f), "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            out.update({k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return out


def decode_bytes_per_step(model_dir, adapter_dir, prompt_len, new_tokens):
    """Bytes a batch-1 decode step must read: each weight once (bf16), the output matrix once (whether tied or not),
    the embedding gather (one row) left out; the LoRA weights (fp32 in both stacks) when attached; the K and V of
    the average context of the decode steps (step j of 1..N-1 attends over prompt_len + j positions)."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    size = {"BF16": 2, "F16": 2, "F32": 4}
    weights = 0
    for name, (dt, shape) in safetensors_tensors(model_dir).items():
        if "embed_tokens" in name:
            continue
        n = 1
        for d in shape:
            n *= d
        weights += n * size[dt]
    if cfg.get("tie_word_embeddings", False):
        weights += cfg["vocab_size"] * cfg["hidden_size"] * 2  # the output matrix is the embedding, read whole
    lora = 0
    if adapter_dir:
        for _, (dt, shape) in safetensors_tensors(adapter_dir).items():
            n = 1
            for d in shape:
                n *= d
            lora += n * 4
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    avg_ctx = prompt_len + new_tokens / 2  # mean of prompt_len + j over j = 1..N-1
    kv = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2 * avg_ctx
    return weights, lora, kv


def copy_bandwidth(device):
    """Bytes/s of a large device-to-device copy (read + write counted), median of 10 after a warm-up."""
    import torch
    n = (2 << 30) if device == "cuda" else (256 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    src.fill_(1)
    times = []
    for i in range(13):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            t = a.elapsed_time(b) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            t = time.perf_counter() - t0
        if i >= 3:
            times.append(t)
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * n / statistics.median(times)


def run_mgrl_once(args, model_dir, adapter_dir, prompts_file, batch, new_tokens, work):
    """One `mgrl generate`; returns (seconds of its generation loop, its completions, its report lines)."""
    out_file = os.path.join(work, f"mgrl_out_b{batch}_n{new_tokens}.jsonl")
    cmd = [args.mgrl, "generate", f"--runtime.backend={args.backend}", f"--model.path={model_dir}",
           f"--data.input={prompts_file}", f"--generate.output={out_file}", f"--generate.max_new_tokens={new_tokens}",
           "--generate.temperature=0", "--generate.num_generations=1", f"--generate.max_sequences={batch}",
           f"--generate.max_prefill_tokens={max(2048, batch * args.prompt_len)}"]
    if args.sync_interval:
        cmd.append(f"--generate.sync_interval={args.sync_interval}")
    if adapter_dir:
        cmd.append(f"--lora.adapter={adapter_dir}")
    if getattr(args, "merge_lora", None):
        cmd.append(f"--generate.merge_lora={args.merge_lora}")
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stdout.write(res.stdout[-3000:] + res.stderr[-3000:])
        raise SystemExit(f"mgrl failed with exit code {res.returncode}: {' '.join(cmd)}")
    report = [l for l in (res.stdout + res.stderr).splitlines()
              if "generate:" in l or "tokens/s" in l or "merged" in l]
    # "generate: P prompts x G, T tokens in S s on R rank(s): X tokens/s in total; wrote FILE". S has 2 decimals and
    # X none, so the seconds are S or T / X, whichever the rounding leaves the finer.
    seconds = None
    for line in report:
        m = re.search(r"generate: .*?, (\d+) tokens in ([\d.]+) s on \d+ ranks?: ([\d.]+) tokens/s", line)
        if m:
            total, secs, rate = int(m.group(1)), float(m.group(2)), float(m.group(3))
            seconds = secs if rate == 0 or 0.005 / max(secs, 1e-9) < 0.5 / rate else total / rate
    if seconds is None:
        raise SystemExit("mgrl printed no 'generate: ... tokens in ... s' line:\n" + res.stdout[-2000:])
    completions = [json.loads(l) for l in open(out_file)]
    return seconds, completions, report


def run_mgrl(args, model_dir, adapter_dir, prompts, batch, work):
    prompts_file = os.path.join(work, f"prompts_b{batch}.jsonl")
    with open(prompts_file, "w") as f:
        for p in prompts[:batch]:
            f.write(json.dumps({"prompt_tokens": p}) + "\n")
    pre = [run_mgrl_once(args, model_dir, adapter_dir, prompts_file, batch, 1, work) for _ in range(args.repeats)]
    t_pre = statistics.median(p[0] for p in pre)
    t_full, comps, report = run_mgrl_once(args, model_dir, adapter_dir, prompts_file, batch, args.new_tokens, work)
    generated = sum(len(c["completion_tokens"]) for c in comps)
    early = sum(1 for c in comps if len(c["completion_tokens"]) < args.new_tokens or c["finish_reason"] != "length")
    return dict(t_prefill=t_pre, t_full=t_full, generated=generated, early=early, report=report,
                first=comps[0]["completion_tokens"] if comps else [],
                first_logprobs=comps[0]["logprobs"] if comps else [])


class HF:
    def __init__(self, args, model_dir, adapter_dir):
        import torch
        from transformers import AutoModelForCausalLM
        quiet_transformers()
        self.torch = torch
        self.dev = "cpu" if args.backend == "cpu" else "cuda"
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
        model = model.to(self.dev)
        if adapter_dir:
            from peft import PeftModel
            model = PeftModel.from_pretrained(model, adapter_dir)
        self.model = model.eval()

    def sync(self):
        if self.dev == "cuda":
            self.torch.cuda.synchronize()

    def generate(self, x, n):
        with self.torch.inference_mode():
            self.sync()
            t0 = time.perf_counter()
            out = self.model.generate(input_ids=x, attention_mask=self.torch.ones_like(x), max_new_tokens=n,
                                      min_new_tokens=n, do_sample=False, eos_token_id=EOS, pad_token_id=PAD)
            self.sync()
            return time.perf_counter() - t0, out

    def run(self, args, prompts, batch):
        x = self.torch.tensor(prompts[:batch], device=self.dev)
        self.generate(x, min(args.new_tokens, 16))  # warm-up
        t_pre = statistics.median(self.generate(x, 1)[0] for _ in range(args.repeats))
        t_full, out = self.generate(x, args.new_tokens)
        gen = out[:, args.prompt_len:]  # min_new_tokens = max_new_tokens: every row has exactly N new tokens
        early = batch if gen.shape[1] < args.new_tokens else 0
        return dict(t_prefill=t_pre, t_full=t_full, generated=batch * gen.shape[1], early=early,
                    first=gen[0].tolist())

    def first_logprobs(self, prompt, n):
        """Greedy tokens of one prompt and log p of each under the model (untimed; for the check against mgrl)."""
        x = self.torch.tensor([prompt], device=self.dev)
        with self.torch.inference_mode():
            out = self.model.generate(input_ids=x, attention_mask=self.torch.ones_like(x), max_new_tokens=n,
                                      min_new_tokens=n, do_sample=False, eos_token_id=EOS, pad_token_id=PAD,
                                      output_logits=True, return_dict_in_generate=True)
        toks = out.sequences[0, len(prompt):].tolist()
        lps = [self.torch.log_softmax(l[0].float(), -1)[t].item() for l, t in zip(out.logits, toks)]
        return toks, lps


def rates(r, batch, prompt_len):
    """(decode tokens/s, prefill tokens/s, decode seconds per step) of one stack's figures at one batch size."""
    decode_tokens = r["generated"] - batch
    dt = r["t_full"] - r["t_prefill"]
    decode = decode_tokens / dt if dt > 0 and decode_tokens > 0 else float("nan")
    steps = decode_tokens / batch
    return decode, batch * prompt_len / r["t_prefill"], (dt / steps if steps > 0 else float("nan"))


def fmt(x):
    return "n/a" if x is None or x != x else f"{x:,.0f}"


def model_dirs(args, work, device):
    """The model (and adapter) folders: written into the run's folder `work`, or kept under --model-cache and reused
    by later runs of the same shape and --lora (written into a temporary folder first, then renamed: a run cut short
    leaves no half model)."""
    base = os.path.join(args.model_cache, args.shape + ("-lora" if args.lora else "")) if args.model_cache else work
    model_dir = os.path.join(base, "model")
    adapter_dir = os.path.join(base, "adapter") if args.lora else None
    t0 = time.time()
    if args.model_cache and os.path.isfile(os.path.join(model_dir, "config.json")):
        print(f"model {args.shape} reused from {base}", flush=True)
        return model_dir, adapter_dir
    if args.model_cache:
        os.makedirs(args.model_cache, exist_ok=True)
        shutil.rmtree(base, ignore_errors=True)  # a folder of this name without a model in it
    tmp = tempfile.mkdtemp(prefix="model_", dir=args.model_cache or work)
    make_model(os.path.join(tmp, "model"), args.shape, device, os.path.join(tmp, "adapter") if args.lora else None)
    if args.model_cache:
        os.rename(tmp, base)
    else:
        for part in ("model", "adapter"):
            if os.path.isdir(os.path.join(tmp, part)):
                os.rename(os.path.join(tmp, part), os.path.join(work, part))
    print(f"model {args.shape} written in {time.time() - t0:.1f} s", flush=True)
    return model_dir, adapter_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mgrl", default=os.path.join(ROOT, "build", "mgrl"))
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--batches", default="1,8,64,256", help="comma-separated batch sizes (prompts decoded at once)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="prefill runs per batch size (the median is taken)")
    ap.add_argument("--lora", action="store_true", help="attach an untrained LoRA r 16 on all 7 projections to both")
    ap.add_argument("--skip-hf", action="store_true", help="time mgrl only")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"],
                    help="mgrl's runtime.backend and transformers' device (cpu: a check of this script without a GPU)")
    ap.add_argument("--sync-interval", type=int, default=0,
                    help="mgrl's generate.sync_interval (decode steps between host round trips); 0: its default")
    ap.add_argument("--merge-lora", choices=["auto", "on", "off"],
                    help="mgrl's generate.merge_lora (with --lora: the adapter merged into the weights for sampling)")
    ap.add_argument("--model-cache", help="keep the random model (and adapter) in this folder, one per shape and "
                    "--lora, and reuse it in later runs instead of writing it again")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    if args.new_tokens < 2:
        raise SystemExit("--new-tokens must be at least 2 (the first token comes from the prefill)")
    batches = [int(b) for b in args.batches.split(",")]
    shape = SHAPES[args.shape]
    if args.prompt_len + args.new_tokens > shape["max_position_embeddings"]:
        raise SystemExit("--prompt-len + --new-tokens exceeds the shape's max_position_embeddings")
    device = "cpu" if args.backend == "cpu" else "cuda"

    work = tempfile.mkdtemp(prefix="mgrl_gen_perf_")
    model_dir, adapter_dir = model_dirs(args, work, device)
    prompts = make_prompts(max(batches), args.prompt_len, shape["vocab_size"])
    bandwidth = copy_bandwidth(device) if device == "cuda" else None

    mg = {}
    for b in batches:
        mg[b] = run_mgrl(args, model_dir, adapter_dir, prompts, b, work)
        d, p, _ = rates(mg[b], b, args.prompt_len)
        print(f"mgrl B={b}: prefill run {mg[b]['t_prefill']:.4f} s, full run {mg[b]['t_full']:.4f} s, "
              f"{mg[b]['generated']} tokens generated; decode {fmt(d)} tok/s", flush=True)
        for line in mg[b]["report"]:
            print("    " + line.strip())
    hf = {}
    if not args.skip_hf:
        stack = HF(args, model_dir, adapter_dir)
        for b in batches:
            hf[b] = stack.run(args, prompts, b)
            d, p, _ = rates(hf[b], b, args.prompt_len)
            print(f"transformers B={b}: prefill {hf[b]['t_prefill']:.4f} s, full {hf[b]['t_full']:.4f} s; "
                  f"decode {fmt(d)} tok/s", flush=True)
        if 1 in batches:
            hf_check = stack.first_logprobs(prompts[0], min(MATCH_TOKENS, args.new_tokens))
        del stack

    lines = [f"{args.shape}{' + LoRA r 16 (7 projections, untrained)' if args.lora else ''}, bf16 "
             f"{'' if not args.sync_interval else f'(mgrl generate.sync_interval={args.sync_interval}) '}"
             f"{'' if not args.merge_lora else f'(mgrl generate.merge_lora={args.merge_lora}) '}"
             f"(mgrl on {args.backend}{': fp32' if args.backend == 'cpu' else ''}), greedy, prompt {args.prompt_len} "
             f"tokens, {args.new_tokens} new tokens per prompt, all B prompts at once", "",
             "| batch | mgrl decode tok/s | HF decode tok/s | ratio | mgrl prefill tok/s | HF prefill tok/s |",
             "|---|---|---|---|---|---|"]
    for b in batches:
        md, mp, _ = rates(mg[b], b, args.prompt_len)
        hd, hp, _ = rates(hf[b], b, args.prompt_len) if b in hf else (None, None, None)
        ratio = f"{md / hd:.2f}x" if hd and hd == hd and md == md else "n/a"
        lines.append(f"| {b} | {fmt(md)} | {fmt(hd)} | {ratio} | {fmt(mp)} | {fmt(hp)} |")
    lines.append("")
    lines.append("mgrl has no prefill/decode split in its report: its prefill figure is a run with --new-tokens 1 "
                 "(prefill + KV-cache set-up + one sampling step), subtracted from the full run for decode; "
                 "start-up and model load are outside mgrl's own timing.")
    short = [f"mgrl B={b}: {mg[b]['early']}" for b in batches if mg[b]["early"]]
    short += [f"transformers B={b}: {hf[b]['early']}" for b in hf if hf[b]["early"]]
    lines.append("completions shorter than --new-tokens: " + (", ".join(short) if short else "none") +
                 " (the decode rates count the tokens actually generated)")
    if 1 in batches:
        if not args.skip_hf:
            a, h = mg[1]["first"][:MATCH_TOKENS], hf[1]["first"][:MATCH_TOKENS]
            same = sum(1 for x, y in zip(a, h) if x == y)
            prefix = next((i for i, (x, y) in enumerate(zip(a, h)) if x != y), min(len(a), len(h)))
            # log p of the tokens both chose, over the common prefix (after it the contexts differ)
            diff = [abs(x - y) for x, y in zip(mg[1]["first_logprobs"][:prefix], hf_check[1][:prefix])]
            lines.append(f"batch 1 greedy tokens, mgrl vs transformers: {same} of {min(len(a), len(h))} first tokens "
                         f"equal (common prefix {prefix}); mgrl {a}, transformers {h}" +
                         (f"; their log-probs differ by at most {max(diff):.3g}" if diff else ""))
        if bandwidth:
            w, lora, kv = decode_bytes_per_step(model_dir, adapter_dir, args.prompt_len, args.new_tokens)
            total = w + lora + kv
            t_roof = total / bandwidth
            parts = [f"roofline at batch 1: {total / 1e6:,.1f} MB per decode step (weights {w / 1e6:,.1f} MB"
                     f"{f', LoRA fp32 {lora / 1e6:,.1f} MB' if lora else ''}, KV {kv / 1e6:,.2f} MB at the average "
                     f"context {args.prompt_len + args.new_tokens / 2:.0f}) / copy bandwidth {bandwidth / 1e9:,.0f} "
                     f"GB/s = {t_roof * 1e6:,.1f} us per token"]
            for name, r in (("mgrl", mg[1]), ("transformers", hf.get(1))):
                if r:
                    _, _, step = rates(r, 1, args.prompt_len)
                    parts.append(f"{name} {step * 1e6:,.1f} us per token = {t_roof / step:.0%} of the roofline")
            lines.append("; ".join(parts))
        else:
            lines.append("roofline: measured on a GPU only (--backend cuda)")
    text = "\n".join(lines) + "\n"
    print("\n" + text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
