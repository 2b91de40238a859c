#!/usr/bin/env bash
# scaling_check_cases.sh SCALING_DIR REPO: perf/scaling --check on outputs it must refuse and accept (perf.scaling_
# check_fails): a failed run is refused; efficiencies that are not what the points' step times give (all set to 3.0)
# are refused naming one; a super-linear efficiency that its step times do give (2.0 at 2 ranks: a baseline slowed by
# the scheduler) is said in a line, not refused; the real short run's output passes.
set -uo pipefail
d=$1/bad repo=$2
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$d" && mkdir -p "$d/out" "$d/super" || exit 1
"$repo/perf/scaling" --mgrl=/bin/false --short --workload=sft --mode=weak --ranks=1 --out="$d/failed" > /dev/null 2>&1
"$repo/perf/scaling" --check="$d/failed" --ranks=1 --workloads=sft --modes=weak && fail "a failed run passed the check"
cp "$1/short/scaling.md" "$d/out/" && cp "$1/short/scaling.md" "$d/super/" || exit 1
sed -e 's/"efficiency": [0-9.e-]*/"efficiency": 3.0/' "$1/short/scaling.json" > "$d/out/scaling.json"
out=$("$repo/perf/scaling" --check="$d/out")
rc=$?
echo "$out"
[ $rc = 1 ] && grep -q 'efficiency 3.0 is not what its step times give' <<< "$out" || fail "inconsistent efficiencies passed"
python3 - "$1/short/scaling.json" "$d/super/scaling.json" <<'PY' || exit 1
import json, sys
s = json.load(open(sys.argv[1]))
base = {(p["workload"], p["mode"]): p for p in s["points"] if p["ranks"] == 1}
for p in s["points"]:
    if p["ranks"] > 1:
        b = base[(p["workload"], p["mode"])]
        p["efficiency"] = 2.0
        p["step_ms"] = b["step_ms"] / (2.0 * (1 if p["mode"] == "weak" else p["ranks"]))
json.dump(s, open(sys.argv[2], "w"))
PY
out=$("$repo/perf/scaling" --check="$d/super")
rc=$?
echo "$out"
[ $rc = 0 ] && grep -q 'efficiency 2.00 beyond 1.5: timing noise' <<< "$out" || fail "a consistent super-linear point refused"
"$repo/perf/scaling" --check="$1/short" || fail "the short run's output"
echo "PASS: scaling check cases"
