#!/usr/bin/env python3
"""safetensors_dtypes.py FILE.safetensors [CONFIG.json]: "dtypes: BF16 x21" (each dtype and its tensor count, sorted),
and the config's torch_dtype when a config is given."""
import collections
import json
import struct
import sys

with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
counts = collections.Counter(v["dtype"] for k, v in header.items() if k != "__metadata__")
line = "dtypes: " + " ".join(f"{d} x{n}" for d, n in sorted(counts.items()))
if len(sys.argv) > 2:
    with open(sys.argv[2]) as f:
        line += " | torch_dtype: " + str(json.load(f).get("torch_dtype"))
print(line)
