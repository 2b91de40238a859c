"""grpo_vs_trl.py: seconds per GRPO step of `mgrl grpo` against TRL's GRPOTrainer (transformers generate, no vLLM)
on the same GPU, same model, same prompts, same reward, same hyperparameters.

One command on a GPU machine (torch, transformers, peft, accelerate installed; trl and datasets from the wheels in
.whl, see below; an mgrl build with CUDA):

    python3 perf/grpo_vs_trl.py --mgrl build-gpu/mgrl --shape qwen2.5-0.5b --prompts 16 --G 8 \
        --prompt-len 128 --completion-len 256 --steps 5 [--out grpo.md] [--skip-trl]

and a check of the script itself on the CPU (mgrl's CPU backend, TRL on the CPU, fp32):

    python3 perf/grpo_vs_trl.py --mgrl build-gpu/mgrl --backend cpu --shape tiny --prompts 4 --G 4 \
        --prompt-len 16 --completion-len 16 --steps 2

What both stacks get:
- the model: a randomly initialised Qwen2 of the chosen shape, written by perf/train_vs_hf.py's make_model (bf16
  safetensors and the quickstart's character tokenizer); on the GPU both run bf16 base weights with fp32 LoRA
  weights (TRL: bf16=True, PEFT's default fp32 adapter), on the CPU both run fp32;
- the prompts: a JSONL of {"prompt": "<digits>+<digits>=", "answer": "<their sum>"} lines, each exactly
  --prompt-len tokens with the BOS that the tokenizer adds; --prompts x --steps distinct prompts, so no prompt
  comes back;
- per optimizer step: --prompts prompts x --G completions sampled at temperature 1 (top_p 1, top_k 0) of at most
  --completion-len tokens, generated in one batch (mgrl: generate.max_sequences = prompts x G; TRL: one generation
  batch per step); a random model over a large vocabulary almost never samples EOS, so completions run the whole
  length on both sides (the table shows the mean length each side produced and the tokens generated per second);
- the reward: 1 if the completion's text (special tokens left out) contains a digit, else 0: mgrl's built-in
  `regex` reward with pattern [0-9], and the same regular expression in Python for TRL;
- LoRA r 16, alpha 32, dropout 0 on q, k, v, o, gate, up, down; AdamW lr --lr (constant, no warm-up, no weight
  decay, betas 0.9/0.999, eps 1e-8), gradient norm clipped at 1; loss --loss-type (default grpo), beta --beta
  (default 0.04: both run a reference pass, the base model with the adapter switched off), epsilon 0.2,
  num_iterations 1 (no old-policy pass on either side), rewards scaled by the group's std, no masking of truncated
  completions, no gradient checkpointing; --micro-batch completions per forward/backward (default all of them:
  mgrl train.grad_accum, TRL per_device_train_batch_size with gradient_accumulation_steps). Measured on an H100
  (80 GB) at the 0.5B shape, 16 x 8 completions of 128 + 256 tokens in one micro-batch: TRL peaks at 74 GiB
  allocated, mgrl at 55 GiB; larger shapes need --micro-batch (32 there: 20 and 17 GiB).

The time of a step, from the steps after --warmup (default 1):
- s/step: mgrl's time/step (metrics.jsonl); TRL: from on_step_begin to on_step_end of a TrainerCallback (the
  device synchronised at both ends);
- generation: mgrl's time/generation; TRL: its `_generate` (tokenising the prompts, transformers' generate,
  decoding the completions), or transformers' generate alone where a TRL version has no `_generate`;
- scoring: the rewards plus the no-grad log-prob passes (reference; old policy where one runs): mgrl's
  time/rewards + time/reference; TRL: its `_calculate_rewards` plus every `_get_per_token_logps_and_entropies`
  call made without grad;
- training: the rest of the step (the policy forward, backward and optimizer step, and each stack's bookkeeping).
The TRL timers synchronise the GPU before and after each timed call.

Without trl and datasets the script says so in one line and exits 2. The GPU machine has no network; the wheels
travel in .whl (git-ignored) and are installed there with
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site
"""
import argparse
import dataclasses
import functools
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_vs_hf import ROOT, SHAPES, TARGETS, make_model  # noqa: E402

LORA_R, LORA_ALPHA = 16, 32
REWARD_PATTERN = "[0-9]"  # mgrl's regex reward: PCRE2, DOTALL and MULTILINE; the same flags below
REWARD_RE = re.compile(REWARD_PATTERN, re.DOTALL | re.MULTILINE)
WHEELS_LINE = ("trl (and datasets) not importable: carry the wheels in .whl to this machine and install them first: "
               "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
               "--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site (or run with --skip-trl)")


def digit_reward(completions, **kwargs):
    """TRL reward function: the same as mgrl's `regex` reward with pattern [0-9] (a match anywhere)."""
    return [1.0 if REWARD_RE.search(c) else 0.0 for c in completions]


def make_prompts(path, n, prompt_len, tokenizer_json):
    """n lines {"prompt": "a+b=", "answer": "a+b"} whose prompts tokenize (BOS included) to exactly prompt_len."""
    if prompt_len < 5:
        raise SystemExit("--prompt-len must be at least 5 (BOS + 'a+b=')")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_json)
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # the answers of long prompts are long numbers
    rng = random.Random(0)
    digits = prompt_len - 3  # BOS, '+' and '=' are the other three tokens

    def number(k):
        return rng.choice("123456789") + "".join(rng.choice("0123456789") for _ in range(k - 1))

    with open(path, "w") as f:
        for _ in range(n):
            k = rng.randint(1, digits - 1)
            a, b = number(k), number(digits - k)
            text = f"{a}+{b}="
            got = len(tok.encode(text).ids)
            if got != prompt_len:
                raise SystemExit(f"prompt {text!r} is {got} tokens, not {prompt_len}: "
                                 "is the tokenizer the quickstart's?")
            f.write(json.dumps({"prompt": text, "answer": str(int(a) + int(b))}) + "\n")


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def poll_gpu_memory(pid):
    """Starts polling nvidia-smi for the GPU memory of process pid; the returned function stops it and gives the
    peak in MiB (None when nvidia-smi is missing or never lists the process)."""
    peak, stop = [None], threading.Event()

    def poll():
        while not stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                     timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                return
            for line in out.splitlines():
                f = [x.strip() for x in line.split(",")]
                if len(f) == 2 and f[0] == str(pid) and f[1].isdigit():
                    peak[0] = max(peak[0] or 0, int(f[1]))
            stop.wait(0.25)

    th = threading.Thread(target=poll, daemon=True)
    th.start()

    def finish():
        stop.set()
        th.join()
        return peak[0]
    return finish


def run_mgrl(args, model_dir, data, work):
    toml = os.path.join(work, "grpo.toml")
    with open(toml, "w") as f:
        f.write('# written by perf/grpo_vs_trl.py\nmode = "grpo"\n\n[[reward]]\nkind = "regex"\nname = "digit"\n'
                f'pattern = "{REWARD_PATTERN}"\n')
    log = os.path.join(work, "mgrl_log")
    n = args.prompts * args.G
    cmd = [args.mgrl, "grpo", toml, f"--runtime.backend={args.backend}", f"--model.path={model_dir}",
           f"--data.input={data}", f"--train.batch_size={args.prompts}", f"--train.grad_accum={n // args.micro_batch}",
           f"--train.max_steps={args.steps}", f"--train.lr={args.lr}", "--train.schedule=constant",
           "--train.warmup_steps=0", "--train.weight_decay=0", "--train.max_grad_norm=1.0", "--train.seed=0",
           f"--lora.r={LORA_R}", f"--lora.alpha={LORA_ALPHA}", "--lora.dropout=0",
           f"--grpo.num_generations={args.G}", f"--grpo.max_prompt_length={args.prompt_len}",
           f"--grpo.max_completion_length={args.completion_len}", "--grpo.temperature=1.0", "--grpo.top_p=1.0",
           "--grpo.top_k=0", f"--grpo.beta={args.beta}", f"--grpo.loss_type={args.loss_type}", "--grpo.epsilon=0.2",
           "--grpo.scale_rewards=group", "--grpo.num_iterations=1", "--grpo.mask_truncated_completions=false",
           f"--generate.max_sequences={n}", "--rollouts.every_steps=0", "--checkpoint.dir=", "--log.every_steps=1",
           f"--log.dir={log}"]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = poll_gpu_memory(proc.pid) if args.backend != "cpu" else (lambda: None)
    stdout, stderr = proc.communicate()
    wall = time.time() - t0
    peak_mib = peak()
    sys.stdout.write(stdout[-4000:])
    if proc.returncode != 0:
        sys.stdout.write(stderr[-4000:])
        raise SystemExit(f"mgrl failed with exit code {proc.returncode}")
    rows = [json.loads(l) for l in open(os.path.join(log, "metrics.jsonl"))]
    rows = [r for r in rows if "time/step" in r and r["step"] > args.warmup]
    if not rows:
        raise SystemExit("mgrl: no step after the warm-up in metrics.jsonl")
    res = {
        "step": mean(r["time/step"] for r in rows),
        "generation": mean(r["time/generation"] for r in rows),
        "scoring": mean(r["time/rewards"] + r["time/reference"] for r in rows),
        "own_training": mean(r["time/training"] for r in rows),  # its forward, backward, optimizer, communication
        "mean_length": mean(r["completions/mean_length"] for r in rows),
        "reward": mean(r["reward"] for r in rows),
        "wall": wall,
        "peak": f"{peak_mib / 1024:.1f} GiB (nvidia-smi, the whole process)" if peak_mib else None,
    }
    res["training"] = res["step"] - res["generation"] - res["scoring"]
    return res


def run_trl(args, model_dir, data, work):
    import torch
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    import trl
    from trl import GRPOConfig, GRPOTrainer

    transformers.logging.set_verbosity_warning()
    t_start = time.time()
    cuda = args.backend != "cpu"
    dev = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    n = args.prompts * args.G
    accum = n // args.micro_batch

    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"), bos_token="<bos>",
                                  eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    dtype = torch.bfloat16 if cuda else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    except TypeError:  # transformers 4.x
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation="sdpa")
    model = model.to(dev)
    rows = [json.loads(l) for l in open(data)]
    dataset = Dataset.from_list(rows)

    want = dict(
        output_dir=os.path.join(work, "trl"), per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=accum, steps_per_generation=accum, num_generations=args.G,
        max_prompt_length=args.prompt_len, max_completion_length=args.completion_len, temperature=1.0, top_p=1.0,
        top_k=0, beta=args.beta, num_iterations=1, epsilon=0.2, loss_type=args.loss_type, scale_rewards="group",
        mask_truncated_completions=False, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        max_steps=args.steps, bf16=cuda, use_cpu=not cuda, gradient_checkpointing=False, use_vllm=False,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0, seed=0,
    )
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    dropped = sorted(k for k in want if k not in fields)
    if dropped:
        print(f"trl {trl.__version__}: GRPOConfig has no {', '.join(dropped)} (left out)")
    cfg = GRPOConfig(**{k: v for k, v in want.items() if k in fields})

    steps = []  # per optimizer step: (seconds, generation, scoring)
    acc = {"generation": 0.0, "scoring": 0.0}
    logged = {}  # global step -> TRL's logged metrics of that step (completions/mean_length, reward)
    t_begin = [0.0]

    class StepTimer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            sync()
            acc["generation"] = acc["scoring"] = 0.0
            t_begin[0] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            sync()
            s = time.perf_counter() - t_begin[0]
            steps.append((s, acc["generation"], acc["scoring"]))
            print(f"trl step {state.global_step}/{args.steps}: {s:.3f} s (generation {acc['generation']:.3f} s, "
                  f"scoring {acc['scoring']:.3f} s)", flush=True)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                logged[state.global_step] = dict(logs)

    trainer = GRPOTrainer(model=model, reward_funcs=[digit_reward], args=cfg, train_dataset=dataset,
                          processing_class=tok, peft_config=LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA,
                                                                       target_modules=TARGETS, lora_dropout=0.0,
                                                                       task_type="CAUSAL_LM"),
                          callbacks=[StepTimer()])
    try:  # our own one line per step instead of the log dictionaries
        from transformers.trainer_callback import PrinterCallback, ProgressCallback
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    except ImportError:
        pass

    def timed(fn, key, no_grad_only=False):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            if no_grad_only and torch.is_grad_enabled():
                return fn(*a, **k)
            sync()
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                sync()
                acc[key] += time.perf_counter() - t0
        return wrapper

    missing = []
    restore = None
    if hasattr(trainer, "_generate"):
        trainer._generate = timed(trainer._generate, "generation")
    else:  # older TRL: transformers' generate alone
        from transformers.generation.utils import GenerationMixin
        restore = GenerationMixin.generate
        GenerationMixin.generate = timed(GenerationMixin.generate, "generation")
    for name, no_grad in (("_calculate_rewards", False), ("_get_per_token_logps_and_entropies", True)):
        if hasattr(trainer, name):
            setattr(trainer, name, timed(getattr(trainer, name), "scoring", no_grad))
        else:
            missing.append(name)
    if missing:
        print(f"trl {trl.__version__}: no {', '.join(missing)}: scoring time incomplete")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    wall = time.time() - t_start
    if restore is not None:
        from transformers.generation.utils import GenerationMixin
        GenerationMixin.generate = restore
    kept = steps[args.warmup:]
    if not kept:
        raise SystemExit("trl: no step after the warm-up")
    logs = [logged[s] for s in range(args.warmup + 1, len(steps) + 1) if s in logged]
    res = {
        "step": mean(s for s, _, _ in kept),
        "generation": mean(g for _, g, _ in kept),
        "scoring": mean(c for _, _, c in kept),
        "mean_length": mean(l["completions/mean_length"] for l in logs),
        "reward": mean(l.get("reward", float("nan")) for l in logs),
        "wall": wall,
        "peak": (f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB allocated, "
                 f"{torch.cuda.max_memory_reserved() / 2**30:.1f} GiB reserved (torch's peaks)") if cuda else None,
        "versions": f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}",
    }
    res["training"] = res["step"] - res["generation"] - res["scoring"]
    del trainer, model
    if cuda:
        torch.cuda.empty_cache()
    return res


def table(args, m, t, trl_error=None):
    n = args.prompts * args.G

    def ratio(a, b):
        return f"{a / b:.2f}x" if b > 0 and a == a and b == b else "n/a"

    def row(name, r, ratio):
        tokens = n * r["mean_length"]
        return (f"| {name} | {r['step']:.3f} s | {r['generation']:.3f} s | {r['scoring']:.3f} s | "
                f"{r['training']:.3f} s | {tokens:,.0f} ({r['mean_length']:.1f} per completion) | "
                f"{tokens / r['generation']:,.0f} | {ratio} |")

    lines = [f"{args.shape}, {args.backend}: {args.prompts} prompts x G {args.G} per step, prompt {args.prompt_len} "
             f"tokens, completions up to {args.completion_len} tokens, LoRA r {LORA_R} alpha {LORA_ALPHA} on "
             f"{len(TARGETS)} projections, beta {args.beta}, loss {args.loss_type}, {n // args.micro_batch} "
             f"micro-batch(es) of {args.micro_batch}, {'bf16' if args.backend != 'cpu' else 'fp32'}; "
             f"{args.steps} steps, the first {args.warmup} left out", "",
             "| stack | s/step | generation | scoring | training | generated tokens/step | generated tokens/s "
             "| TRL/mgrl |", "|---|---|---|---|---|---|---|---|"]
    lines.append(row("mgrl grpo", m, "1.00" if t else "n/a"))
    if t:
        lines.append(row("TRL GRPOTrainer (transformers generate)", t, ratio(t["step"], m["step"])))
        per_token = ratio(t["generation"] / t["mean_length"], m["generation"] / m["mean_length"])
        lines.append(f"| TRL / mgrl | {ratio(t['step'], m['step'])} | {ratio(t['generation'], m['generation'])} | "
                     f"{ratio(t['scoring'], m['scoring'])} | {ratio(t['training'], m['training'])} | | "
                     f"{per_token} (time per generated token) | |")
    passes = "the reference's" if args.beta > 0 else "none with beta 0"
    lines += ["", f"scoring = rewards + no-grad log-prob passes ({passes}); training = the rest of the step. "
              f"mgrl's own time/training (forward, backward, optimizer, communication): {m['own_training']:.3f} s. "
              f"Mean reward: mgrl {m['reward']:.3f}" + (f", TRL {t['reward']:.3f}." if t else ".")]
    if trl_error:
        lines.append(f"TRL failed: {trl_error}")
    if m["peak"] or (t and t["peak"]):
        lines.append(f"peak GPU memory: mgrl {m['peak'] or 'n/a'}; TRL {t['peak'] if t else 'n/a'}")
    wall = f"whole runs, start-up and model load included: mgrl {m['wall']:.1f} s"
    if t:
        wall += f", TRL {t['wall']:.1f} s ({t['versions']})"
    lines.append(wall)
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mgrl", default=os.path.join(ROOT, "build", "mgrl"))
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--G", type=int, default=8, help="completions per prompt (num_generations)")
    ap.add_argument("--prompt-len", type=int, default=128, help="tokens of every prompt (BOS included)")
    ap.add_argument("--completion-len", type=int, default=256, help="max_completion_length")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="first steps left out of the timing")
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="completions per forward/backward (default: all prompts x G in one)")
    ap.add_argument("--beta", type=float, default=0.04, help="KL weight (> 0: a reference pass on both sides)")
    ap.add_argument("--loss-type", default="grpo", choices=["grpo", "bnpo", "dr_grpo", "dapo"])
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--backend", default="cuda", help="cuda, or cpu: a check of this script without a GPU")
    ap.add_argument("--skip-trl", action="store_true", help="time mgrl only")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    n = args.prompts * args.G
    args.micro_batch = args.micro_batch or n
    if n % args.micro_batch:
        raise SystemExit(f"--micro-batch {args.micro_batch} must divide prompts x G = {n}")
    if args.steps <= args.warmup:
        raise SystemExit("--steps must exceed --warmup")
    # No hub: set before anything imports huggingface_hub, which reads these once.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not args.skip_trl:
        try:
            import datasets  # noqa: F401
            import trl  # noqa: F401
        except ImportError:
            print(WHEELS_LINE)
            sys.exit(2)
    with tempfile.TemporaryDirectory(prefix="mgrl_grpo_perf_") as work:
        model_dir, data = os.path.join(work, "model"), os.path.join(work, "prompts.jsonl")
        make_model(model_dir, args.shape, "cpu" if args.backend == "cpu" else "cuda")
        make_prompts(data, args.prompts * args.steps, args.prompt_len, os.path.join(model_dir, "tokenizer.json"))
        m = run_mgrl(args, model_dir, data, work)
        t, trl_error = None, None
        if not args.skip_trl:
            try:
                t = run_trl(args, model_dir, data, work)
            except Exception as e:  # e.g. out of memory: mgrl's numbers still come out
                traceback.print_exc()
                trl_error = f"{type(e).__name__}: {str(e)[:300]}"
    text = table(args, m, t, trl_error)
    print("\n" + text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
