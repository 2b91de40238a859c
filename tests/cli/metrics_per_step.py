#!/usr/bin/env python3
"""metrics_per_step.py METRICS.jsonl N [KEY]: how many records with KEY ("loss" when not given) each step 1..N has in a
metrics.jsonl."""
import collections
import json
import sys

key = sys.argv[3] if len(sys.argv) > 3 else "loss"
counts = collections.Counter()
with open(sys.argv[1]) as f:
    for line in f:
        record = json.loads(line)
        if key in record:
            counts[record["step"]] += 1
print(key, "records per step:", *[counts[s] for s in range(1, int(sys.argv[2]) + 1)])
