"""make_dpo_quickstart.py: preference pairs for the DPO quickstart from the quickstart's addition task
(the first 2000 lines of inputs/quickstart/train.jsonl, all of heldout.jsonl): chosen = the correct sum, rejected = a plausible wrong one: the sum
without its carries when the addition has any, else the correct sum with one digit changed. Writes
inputs/quickstart/dpo_train.jsonl and inputs/quickstart/dpo_heldout.jsonl ({"prompt", "chosen", "rejected"}).
Deterministic (fixed seed); standard library only.
Run by hand from the repository root:  python3 tools/make_dpo_quickstart.py

With --generations GEN.jsonl (the output of `mgrl generate` on prompts of train.jsonl, several sampled completions
per prompt), it writes on-policy pairs instead, to --out: for each prompt with a wrong sampled completion, chosen = the
correct sum, rejected = the first wrong completion the model sampled; prompts whose samples are all right are left out
(docs/dpo.md: the quickstart comparison).
"""
import argparse
import json
import os
import random

DIR = "inputs/quickstart"


def no_carry_sum(a, b):
    """Digit-wise sum modulo 10: the classic mistake of forgetting every carry."""
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def wrong_answer(rng, a, b):
    right = a + b
    w = no_carry_sum(a, b)
    if w != right:
        return w
    digits = list(str(right))
    i = rng.randrange(len(digits))
    choices = [d for d in "0123456789" if d != digits[i] and not (i == 0 and d == "0" and len(digits) > 1)]
    digits[i] = rng.choice(choices)
    return int("".join(digits))


def convert(src, dst, rng, limit):
    n = 0
    with open(src) as f, open(dst, "w") as g:
        for line in f:
            if n == limit:
                break
            r = json.loads(line)
            a, b = (int(x) for x in r["prompt"].rstrip("=").split("+"))
            assert str(a + b) == r["completion"]
            g.write(json.dumps({"prompt": r["prompt"], "chosen": r["completion"],
                                "rejected": str(wrong_answer(rng, a, b))}) + "\n")
            n += 1
    return n


def on_policy(generations, out):
    wrong, right = {}, {}
    with open(generations) as f:
        for line in f:
            r = json.loads(line)
            a, b = (int(x) for x in r["prompt"].rstrip("=").split("+"))
            key = (r["index"], r["prompt"])
            right[key] = str(a + b)
            if r["completion"] != str(a + b) and key not in wrong:
                wrong[key] = r["completion"]
    with open(out, "w") as g:
        for key in sorted(wrong):
            g.write(json.dumps({"prompt": key[1], "chosen": right[key], "rejected": wrong[key]}) + "\n")
    print(len(wrong), "pairs from", len(right), "prompts")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generations")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.generations:
        on_policy(a.generations, a.out)
        return
    rng = random.Random(2026)
    for name, limit in (("train", 2000), ("heldout", None)):
        n = convert(os.path.join(DIR, name + ".jsonl"), os.path.join(DIR, "dpo_" + name + ".jsonl"), rng, limit)
        print(name, n, "pairs")


if __name__ == "__main__":
    main()
