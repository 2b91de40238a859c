"""merge_mismatch.py: what sampling from the LoRA adapter merged into the weights (mgrl's generate.merge_lora = on)
changes against the unmerged adapter: the same prompts through `mgrl generate` twice, merged and unmerged.

One command on a GPU machine (torch, transformers and peft installed; an mgrl build with CUDA):

    python3 perf/merge_mismatch.py --mgrl build-gpu/mgrl --shape qwen2.5-0.5b --prompts 64 --prompt-len 128 \
        --new-tokens 64 --b-std 0.01

It writes gen_vs_hf's random Qwen2 model of the shape with a PEFT LoRA (r 16, alpha 32, all 7 projections) whose B is
drawn from normal(0, --b-std) (an untrained adapter has B = 0, and then merging changes nothing), and --prompts prompts
of --prompt-len random token ids. Greedy (and, with --temperature > 0, sampled with one seed: the same draws) with the
merge on and off, it reports per completion where the tokens first differ, the share of completions equal over their
first --first tokens and over all of them, and over the tokens before the first difference (the same context on both
sides) the largest and the mean |log p(merged) - log p(unmerged)| of the chosen tokens: the mismatch the merge's
rounding of W + scale B A to the storage dtype introduces. mgrl's losses never use these sampling log-probs (GRPO's
and PPO's old log-probs come from a scoring pass), so this is what changes which tokens are drawn, nothing more.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_vs_hf  # noqa: E402  (the model maker, the prompts)


def run(args, model_dir, adapter_dir, prompts_file, merge, temperature, work):
    out = os.path.join(work, f"merge_{merge}_t{temperature}.jsonl")
    cmd = [args.mgrl, "generate", f"--runtime.backend={args.backend}", f"--model.path={model_dir}",
           f"--lora.adapter={adapter_dir}", f"--data.input={prompts_file}", f"--generate.output={out}",
           f"--generate.max_new_tokens={args.new_tokens}", f"--generate.temperature={temperature}",
           "--generate.seed=5", f"--generate.max_sequences={args.prompts}",
           f"--generate.max_prefill_tokens={max(2048, args.prompts * args.prompt_len)}", f"--generate.merge_lora={merge}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stdout.write(res.stdout[-3000:] + res.stderr[-3000:])
        raise SystemExit(f"mgrl failed with exit code {res.returncode}: {' '.join(cmd)}")
    for line in res.stdout.splitlines():
        if "merged" in line or line.startswith("generate:"):
            print("    " + line.strip())
    return [json.loads(l) for l in open(out)]


def compare(merged, plain, first):
    diverge, dlp, same_first, same_all = [], [], 0, 0
    for m, p in zip(merged, plain):
        a, b = m["completion_tokens"], p["completion_tokens"]
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if a == b:
            same_all += 1
        if a[:first] == b[:first]:
            same_first += 1
        diverge.append(k if a != b else None)
        # log-probs of the chosen tokens over the common prefix (same context): token k itself differs
        dlp += [abs(x - y) for x, y in zip(m["logprobs"][:k], p["logprobs"][:k])]
    return diverge, dlp, same_first, same_all


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mgrl", default=os.path.join(gen_vs_hf.ROOT, "build", "mgrl"))
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(gen_vs_hf.SHAPES))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--first", type=int, default=16, help="completions compared over their first this many tokens")
    ap.add_argument("--b-std", type=float, default=0.01, help="std of the adapter's B (0: untrained, merging is exact)")
    ap.add_argument("--temperature", type=float, default=1.0, help="also sample at this temperature (0: greedy only)")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"], help="cpu: a check of this script (fp32)")
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args()
    device = "cpu" if args.backend == "cpu" else "cuda"
    work = tempfile.mkdtemp(prefix="mgrl_merge_mismatch_")
    model_dir, adapter_dir = os.path.join(work, "model"), os.path.join(work, "adapter")
    gen_vs_hf.make_model(model_dir, args.shape, device, adapter_dir, b_std=args.b_std)
    prompts_file = os.path.join(work, "prompts.jsonl")
    with open(prompts_file, "w") as f:
        for p in gen_vs_hf.make_prompts(args.prompts, args.prompt_len, gen_vs_hf.SHAPES[args.shape]["vocab_size"]):
            f.write(json.dumps({"prompt_tokens": p}) + "\n")
    lines = [f"{args.shape} + LoRA r 16 (B ~ normal(0, {args.b_std})), mgrl on {args.backend}, {args.prompts} prompts of "
             f"{args.prompt_len} tokens, {args.new_tokens} new tokens: generate.merge_lora = on against off", "",
             "| sampling | equal completions | equal first tokens | first difference at (median, of those that differ) "
             "| max abs dlogp | mean abs dlogp | tokens compared |", "|---|---|---|---|---|---|---|"]
    for t in ([0.0] + ([args.temperature] if args.temperature > 0 else [])):
        merged = run(args, model_dir, adapter_dir, prompts_file, "on", t, work)
        plain = run(args, model_dir, adapter_dir, prompts_file, "off", t, work)
        diverge, dlp, same_first, same_all = compare(merged, plain, args.first)
        at = [k for k in diverge if k is not None]
        lines.append(f"| {'greedy' if t == 0 else f'temperature {t}'} | {same_all}/{len(merged)} | "
                     f"{same_first}/{len(merged)} (first {args.first}) | {statistics.median(at) if at else '-'} | "
                     f"{max(dlp) if dlp else 0:.3g} | {statistics.fmean(dlp) if dlp else 0:.3g} | {len(dlp)} |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write(report + "\n\n")


if __name__ == "__main__":
    main()
