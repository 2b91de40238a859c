#!/usr/bin/env python3
"""ncu_table.py: the kernels of a run by name from Nsight Compute's raw CSV (one row a launch), as a markdown table.

    ncu --csv --page raw --metrics gpu__time_duration.sum --log-file run.csv <command>
    python3 perf/ncu_table.py run.csv                      # every launch of the run
    python3 perf/ncu_table.py long.csv --minus short.csv --per 4
        # the launches of `long` beyond those of `short` (the same command with 4 more decode steps), per step

Per kernel name: launches, total and mean microseconds, share of the total; the sum of every kernel's time is the
time the GPU was busy (each kernel timed alone by ncu), to hold against a measured time per step: the difference is
what the GPU spent between kernels (launch gaps, host waits). With --minus, counts and times are the differences by
name, divided by --per.
"""
import argparse
import csv
import io
import re
import sys
from collections import OrderedDict


def short_name(name):
    """The kernel's function name without its namespace, template arguments and parameter list."""
    name = name.strip().replace("(anonymous namespace)", "anon")
    depth, out = 0, []
    for ch in name:  # template arguments and the parameter list
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    name = "".join(out).strip()
    for prefix in ("void ",):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.split("::")[-1] or name


def read(path):
    """{kernel name: [launches, total us]} in order of first launch, from ncu's raw CSV (units in its second row)."""
    text = open(path, errors="replace").read()
    # ncu's log may hold lines before the CSV (==PROF== notes): the CSV starts at the header row.
    start = text.find('"ID"')
    if start < 0:
        raise SystemExit(f"{path}: no ncu CSV (no \"ID\" header row)")
    rows = list(csv.reader(io.StringIO(text[start:])))
    header = rows[0]
    try:
        name_col = header.index("Kernel Name")
        time_col = header.index("gpu__time_duration.sum")
    except ValueError:
        raise SystemExit(f"{path}: the CSV lacks the Kernel Name or gpu__time_duration.sum column: {header[:12]}")
    scale = 1.0
    data = rows[1:]
    if data and not re.match(r"^\d", data[0][0] if data[0] else ""):  # the units row
        unit = data[0][time_col].strip()
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
        data = data[1:]
    out = OrderedDict()
    for r in data:
        if len(r) <= max(name_col, time_col) or not r[time_col].strip():
            continue
        try:
            t = float(r[time_col].replace(",", "")) * scale
        except ValueError:
            continue
        e = out.setdefault(short_name(r[name_col]), [0, 0.0])
        e[0] += 1
        e[1] += t
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--minus", help="a shorter run of the same command: its launches are subtracted by name")
    ap.add_argument("--per", type=float, default=1.0, help="divide counts and times by this (steps)")
    ap.add_argument("--title", default="")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    k = read(args.csv)
    if args.minus:
        for name, (n, t) in read(args.minus).items():
            e = k.setdefault(name, [0, 0.0])
            e[0] -= n
            e[1] -= t
    rows = [(name, n / args.per, t / args.per) for name, (n, t) in k.items() if n != 0 or abs(t) > 1e-9]
    total = sum(t for _, _, t in rows)
    launches = sum(n for _, n, _ in rows)
    rows.sort(key=lambda r: -r[2])
    if args.title:
        print(args.title)
        print()
    print(f"{launches:,.1f} launches, {total:,.1f} us of kernel time" + (f" per {args.per:g}" if args.per != 1 else ""))
    print()
    print("| kernel | launches | us | us a launch | share |")
    print("|---|---|---|---|---|")
    for name, n, t in rows[:args.top]:
        print(f"| {name} | {n:,.2f} | {t:,.1f} | {t / n if n else 0:,.2f} | {100 * t / total if total else 0:.1f}% |")
    if len(rows) > args.top:
        rest = rows[args.top:]
        print(f"| ({len(rest)} more) | {sum(r[1] for r in rest):,.2f} | {sum(r[2] for r in rest):,.1f} | | "
              f"{100 * sum(r[2] for r in rest) / total if total else 0:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
