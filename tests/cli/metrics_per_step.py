#!/usr/bin/env python3
"""metrics_per_step.py METRICS.jsonl N: how many records with a "loss" each step 1..N has in a metrics.jsonl."""
import collections
import json
import sys

counts = collections.Counter()
with open(sys.argv[1]) as f:
    for line in f:
        record = json.loads(line)
        if "loss" in record:
            counts[record["step"]] += 1
print("loss records per step:", *[counts[s] for s in range(1, int(sys.argv[2]) + 1)])
