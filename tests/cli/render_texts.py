#!/usr/bin/env python3
"""render_texts.py < RENDER.jsonl: the "text" of every line of `mgrl render`'s output, one JSON string a line."""
import json
import sys

for line in sys.stdin:
    print(json.dumps(json.loads(line)["text"]))
