#!/usr/bin/env python3
"""log_window.py EVERY_STEP.jsonl WINDOWED.jsonl KEY: two metrics.jsonl of the same run (training is the same whatever
log.every_steps says), one logged every step, one every N steps. Each windowed record's KEY must be the mean of the
KEY of the steps since the previous record (the window), as transformers' Trainer logs a loss; prints
"window means: equal (K records)" or the first difference."""
import json
import sys


def records(path, key):
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if key in r and "phases" not in r:
                out[r["step"]] = r[key]
    return out


every, windowed, key = records(sys.argv[1], sys.argv[3]), records(sys.argv[2], sys.argv[3]), sys.argv[3]
previous = 0
for step in sorted(windowed):
    window = [every[s] for s in range(previous + 1, step + 1)]
    mean = sum(window) / len(window)
    if abs(windowed[step] - mean) > 1e-9 * max(1.0, abs(mean)):
        print(f"step {step}: {key} {windowed[step]!r}, the mean of steps {previous + 1}..{step} is {mean!r} "
              f"(each: {window})")
        sys.exit(1)
    previous = step
if len(windowed) < 2:
    print(f"only {len(windowed)} windowed records")
    sys.exit(1)
print(f"window means: equal ({len(windowed)} records)")
