#!/usr/bin/env python3
"""render_masks.py < RENDER.jsonl: the "tokens" and "assistant_mask" of every line of `mgrl render`'s output, as
{"tokens": [...], "assistant_mask": [...]} (json.dumps), one line each."""
import json
import sys

for line in sys.stdin:
    r = json.loads(line)
    print(json.dumps({"tokens": r["tokens"], "assistant_mask": r["assistant_mask"]}))
