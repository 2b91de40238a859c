#!/usr/bin/env python3
"""make_packing_fixtures.py: the rows trl's pack_dataset(strategy="bfd") makes (trl 1.16.0, datasets 5.2.0: the
packing of SFTTrainer's packing = True), for unit.sft_packing (train::pack_bfd). Each case: the examples' lengths and
the row capacity (trl's max_length); the expected rows as lists of example indices, in trl's order. Example i's
input_ids are [i] * length, so each packed row's tokens name its examples. 2500 examples cross the 1000-example
batches of datasets' map, within which trl packs.
    /work/venv-fixtures/bin/python tools/make_packing_fixtures.py     (writes tests/data/sft/packing_bfd.json)"""
import json
import os
import random

from datasets import Dataset
from trl.data_utils import pack_dataset

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
rng = random.Random(7)
cases = []
for name, capacity, lengths in [
    ("ties", 8, [3, 5, 3, 2, 8, 1, 1, 4, 4, 6, 2, 7, 3, 3, 5, 1]),
    ("uniform", 64, [rng.randint(1, 64) for _ in range(300)]),
    ("short_many", 50, [rng.randint(1, 12) for _ in range(2500)]),
]:
    ds = Dataset.from_dict({"input_ids": [[i] * n for i, n in enumerate(lengths)]})
    packed = pack_dataset(ds, capacity, strategy="bfd")
    rows = []
    for ids, seq_lengths in zip(packed["input_ids"], packed["seq_lengths"]):
        row, at = [], 0
        for n in seq_lengths:
            row.append(ids[at])
            at += n
        rows.append(row)
    cases.append({"name": name, "capacity": capacity, "lengths": lengths, "rows": rows})
with open(os.path.join(root, "tests", "data", "sft", "packing_bfd.json"), "w") as f:
    json.dump({"trl": "1.16.0", "cases": cases}, f, separators=(",", ":"))
    f.write("\n")
print({c["name"]: len(c["rows"]) for c in cases})
