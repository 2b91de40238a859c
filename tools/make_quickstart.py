"""make_quickstart.py: writes the quickstart's synthetic, verifiable task into inputs/quickstart/.

The task: multi-digit addition. prompt "347+1208=", completion "1555". Files:
  tokenizer.json   a character-level tokenizer made with the `tokenizers` library (digits, '+', '=',
                   and <pad> <bos> <eos> <unk>; BOS added by the post-processor)
  train.jsonl      {"prompt": ..., "completion": ...} lines
  heldout.jsonl    the same, other pairs (no overlap with train)
Run by hand:  /work/venv-fixtures/bin/python tools/make_quickstart.py
"""
import json
import os
import random

from tokenizers import Tokenizer, decoders, models, processors

OUT = "inputs/quickstart"
SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789+=")


def tokenizer():
    vocab = {t: i for i, t in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(SPECIAL)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok.decoder = decoders.Fuse()
    return tok


def pairs(rng, n, max_digits, seen):
    out = []
    while len(out) < n:
        a = rng.randrange(10 ** rng.randint(1, max_digits))
        b = rng.randrange(10 ** rng.randint(1, max_digits))
        if (a, b) in seen:
            continue
        seen.add((a, b))
        out.append({"prompt": f"{a}+{b}=", "completion": str(a + b)})
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = tokenizer()
    tok.save(os.path.join(OUT, "tokenizer.json"))
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}, f, indent=2)
        f.write("\n")
    rng = random.Random(1234)
    seen = set()
    heldout = pairs(rng, 200, 3, seen)
    train = pairs(rng, 10000, 3, seen)
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        with open(os.path.join(OUT, name), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    enc = tok.encode("347+1208=")
    print("vocab", tok.get_vocab_size(), "example ids", enc.ids, "decoded", tok.decode(enc.ids, skip_special_tokens=True))


if __name__ == "__main__":
    main()
