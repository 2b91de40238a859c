"""make_ppo_kl_fixtures.py: writes tests/data/ppo/adaptive_kl.json, trl 0.x's own AdaptiveKLController run on fixed
sequences of (KL, batch size) updates, for unit.ppo_loss (the adaptive KL coefficient of mgrl ppo).

trl 0.x's PPOTrainer (removed in trl 0.12) kept its adaptive KL controller in trl/trainer/utils.py; that module imports
torch and transformers, but the class itself needs only numpy, so this script reads the module's source, takes the
class definition out of it with `ast` and runs that, unchanged. Usage (from the repository root):

    pip download --no-deps trl==0.11.4 -d /tmp/w && unzip -q -o /tmp/w/trl-0.11.4-*.whl trl/trainer/utils.py -d /tmp/trl011
    python3 tools/make_ppo_kl_fixtures.py --utils /tmp/trl011/trl/trainer/utils.py --out tests/data/ppo/adaptive_kl.json
"""
import argparse
import ast
import hashlib
import json

import numpy as np


def load_controller(utils_path):
    tree = ast.parse(open(utils_path).read())
    cls = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AdaptiveKLController"]
    if len(cls) != 1:
        raise SystemExit(f"{utils_path}: no AdaptiveKLController class")
    scope = {"np": np}
    exec(compile(ast.Module(body=cls, type_ignores=[]), utils_path, "exec"), scope)
    return scope["AdaptiveKLController"], hashlib.sha256(open(utils_path, "rb").read()).hexdigest()


# Each case: the controller's (init_kl_coef, target, horizon) and the (current KL, n_steps) of successive updates, as
# trl's step() passes them: stats["objective/kl"] and batch_size * num_processes. Python floats (float64) throughout.
CASES = [
    # trl 0.x's defaults (init 0.2, target 6, horizon 10000), a batch of 256: below the clip, inside it, at the
    # target, above the clip, a negative KL estimate, zero.
    {"name": "trl_defaults", "init": 0.2, "target": 6.0, "horizon": 10000.0, "n": 256,
     "kl": [0.5, 3.0, 5.5, 6.0, 6.9, 7.5, 20.0, -1.0, 0.0, 6.3]},
    # horizon equal to the batch: each update moves the coefficient by up to 20% (the CLI tests' setting).
    {"name": "horizon_is_batch", "init": 0.05, "target": 0.1, "horizon": 8.0, "n": 8,
     "kl": [0.01, 0.02, 0.095, 0.1, 0.105, 0.118, 0.5, 0.3, 0.07, 0.1234567]},
    # a horizon of a few batches and a batch that is not a power of two.
    {"name": "mid_horizon", "init": 0.1, "target": 2.5, "horizon": 300.0, "n": 48,
     "kl": [2.0, 2.4, 2.6, 3.1, 1.2, 2.5, 9.0, 0.3]},
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--utils", required=True, help="trl 0.x's trl/trainer/utils.py")
    ap.add_argument("--trl-version", default="0.11.4")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    Controller, digest = load_controller(a.utils)
    cases = []
    for c in CASES:
        ctl = Controller(c["init"], c["target"], c["horizon"])
        values = []
        for kl in c["kl"]:
            ctl.update(kl, c["n"])
            values.append(float(ctl.value))
        cases.append({**c, "values": values})
    out = {"generator": "tools/make_ppo_kl_fixtures.py", "trl": a.trl_version, "numpy": np.__version__,
           "utils_py_sha256": digest, "cases": cases}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
