#!/usr/bin/env python3
"""metric_values.py METRICS.jsonl KEY: "KEY: STEP=VALUE ..." for every record with KEY, values with 6 significant
digits."""
import json
import sys

key = sys.argv[2]
with open(sys.argv[1]) as f:
    pairs = [f"{r['step']}={r[key]:.6g}" for r in map(json.loads, f) if key in r]
print(f"{key}:", *pairs)
