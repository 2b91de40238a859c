#!/usr/bin/env python3
"""check_bench_json.py: checks a Google Benchmark JSON file (--benchmark_out_format=json) for the smoke tests of
tests/perf.cmake: it parses, and every NAME given ran without error with a positive bytes_per_second (and a
positive FLOP/s where the benchmark reports one). A NAME matches a run whose name is NAME, or NAME followed by
Google Benchmark's own suffixes (/real_time, /iterations:20, ...). Exit 0 when all hold, 1 with a list of what
failed otherwise.

    perf/check_bench_json.py FILE NAME... [-- COMMAND...]

With a COMMAND (a benchmark binary and its arguments, or mpirun ... binary ...), FILE is removed and COMMAND is
run first with these arguments appended: only the NAMEs (--benchmark_filter), briefly (--benchmark_min_time=0.01:
seconds, the syntax of Google Benchmark 1.7), JSON to FILE; its failure is the check's failure.

    perf/check_bench_json.py x.json BM_CheckpointWrite/1 BM_TokenizerEncode/qwen2_bytelevel -- build/perf/bench_io
"""
import json
import os
import re
import subprocess
import sys

# What Google Benchmark appends to a benchmark's name and argument: options, not part of what it measures.
SUFFIX = re.compile(r"(/(real_time|manual_time|iterations:\d+|min_time:[0-9.]+s?|repeats:\d+|threads:\d+))+$")


def main(argv):
    if len(argv) < 3 or argv[2] == "--":
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, names, command = argv[1], argv[2:], []
    if "--" in names:
        command = names[names.index("--") + 1:]
        names = names[:names.index("--")]
    if command:
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_/]+", n)]
        if bad or not names:
            print(f"names must be non-empty and of letters, digits, _ and / (they become a regex): {bad}")
            return 2
        if os.path.exists(path):
            os.remove(path)  # a file of an earlier run must not pass for this one
        flags = [f"--benchmark_filter=^({'|'.join(names)})(/.*)?$", "--benchmark_min_time=0.01",
                 f"--benchmark_out={path}", "--benchmark_out_format=json"]
        rc = subprocess.call(command + flags)
        if rc != 0:
            print(f"{' '.join(command)}: exit status {rc}")
            return 1
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{path}: not a readable JSON file: {e}")
        return 1
    runs = {}
    for b in doc.get("benchmarks", []):
        if b.get("run_type", "iteration") == "iteration":
            runs[SUFFIX.sub("", b["name"])] = b
    problems = []
    for name in names:
        b = runs.get(name)
        if b is None:
            problems.append(f"{name}: no such run (runs: {', '.join(sorted(runs)) or 'none'})")
            continue
        if b.get("error_occurred"):
            problems.append(f"{name}: error: {b.get('error_message')}")
        if not b.get("iterations", 0) > 0:
            problems.append(f"{name}: no iterations")
        if not b.get("bytes_per_second", 0) > 0:
            problems.append(f"{name}: bytes_per_second is {b.get('bytes_per_second')}")
        if "FLOP/s" in b and not b["FLOP/s"] > 0:
            problems.append(f"{name}: FLOP/s is {b['FLOP/s']}")
    for p in problems:
        print(f"{path}: {p}")
    if not problems:
        print(f"{path}: {len(names)} benchmarks ran, each with a positive bytes_per_second")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
