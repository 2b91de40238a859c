"""make_schedule_fixtures.py: transformers' learning-rate schedules, step by step, for mgrl's train.schedule kinds
(tests/data/schedules/transformers.json; compared in tests/unit/test_train.cpp, Schedule.MatchesTransformers).

For each case, a torch optimizer with lr 1 is driven by transformers.get_scheduler (as the Trainer builds it, with
lr_scheduler_kwargs) and the learning rate before each of the total steps is recorded.

Run by hand:  /work/venv-fixtures/bin/python tools/make_schedule_fixtures.py
"""
import json
import os

import torch
import transformers
from transformers import get_scheduler

CASES = [
    dict(kind="linear", warmup=0, total=10),
    dict(kind="linear", warmup=3, total=11),
    dict(kind="cosine", warmup=0, total=9),
    dict(kind="cosine", warmup=4, total=17),
    dict(kind="constant", warmup=0, total=5),
    dict(kind="constant_with_warmup", warmup=3, total=8),
    dict(kind="cosine_with_min_lr", warmup=0, total=12, kwargs=dict(min_lr_rate=0.1)),
    dict(kind="cosine_with_min_lr", warmup=5, total=23, kwargs=dict(min_lr_rate=0.25)),
    dict(kind="linear", warmup=1, total=1),
]


def main():
    out = {"transformers": transformers.__version__, "cases": []}
    for c in CASES:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=1.0)
        sched = get_scheduler(c["kind"], opt, num_warmup_steps=c["warmup"], num_training_steps=c["total"],
                              scheduler_specific_kwargs=c.get("kwargs"))
        lrs = []
        for _ in range(c["total"]):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        out["cases"].append(dict(kind=c["kind"], warmup=c["warmup"], total=c["total"],
                                 min_lr_rate=c.get("kwargs", {}).get("min_lr_rate", 0.0), lr=lrs))
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "schedules", "transformers.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{len(out['cases'])} schedules written to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
