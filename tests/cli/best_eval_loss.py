#!/usr/bin/env python3
"""best_eval_loss.py METRICS.jsonl CHECKPOINT.h5 STEP...: the checkpoint's /state/best_eval_loss against the least
eval_loss of metrics.jsonl at the given steps (the evaluations made before that checkpoint was written); prints
"best_eval_loss ok: VALUE" when they agree to 1e-6, else what differs, and exits 1."""
import json
import re
import subprocess
import sys

metrics, checkpoint, steps = sys.argv[1], sys.argv[2], {int(s) for s in sys.argv[3:]}
with open(metrics) as f:
    losses = [r["eval_loss"] for r in map(json.loads, f) if "eval_loss" in r and r["step"] in steps]
dump = subprocess.run(["h5dump", "-d", "/state/best_eval_loss", checkpoint], capture_output=True, text=True,
                      check=True).stdout
found = re.search(r"DATA \{\s*\(0\): ([^\s}]+)", dump)
stored = float(found.group(1)) if found else None
if len(losses) != len(steps) or stored is None or abs(stored - min(losses)) > 1e-6 * max(1.0, abs(min(losses))):
    print(f"best_eval_loss differs: stored {stored}, eval_loss at steps {sorted(steps)}: {losses}")
    sys.exit(1)
print(f"best_eval_loss ok: {stored}")
