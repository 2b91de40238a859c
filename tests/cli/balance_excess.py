#!/usr/bin/env python3
# balance_excess.py NONE_METRICS TOKENS_METRICS: reads the end-of-run straggler record of two GRPO runs (grpo.balance
# none and tokens) and checks that balancing at least halves the training work's token imbalance over ranks (excess
# of max / mean over 1), on a workload skewed enough that there is an imbalance to remove.
import json
import sys


def excess(path):
    for line in open(path):
        rec = json.loads(line)
        if "straggler_wait" in rec:
            return rec["straggler_wait"]["imbalance_training_tokens"] - 1.0, rec["straggler_wait"]["balance"]
    sys.exit(f"{path}: no straggler_wait record")


(none, b0), (tokens, b1) = excess(sys.argv[1]), excess(sys.argv[2])
assert (b0, b1) == ("none", "tokens"), (b0, b1)
ok = none > 0.05 and tokens <= 0.5 * none
print(f"training excess none {none:.4f}, tokens {tokens:.4f}: {'halved' if ok else 'NOT halved'}")
sys.exit(0 if ok else 1)
