#!/usr/bin/env bash
# gpu_program_dry.sh: perf/gpu_program.sh's mechanics on a machine without a GPU (its stages fail at once there):
# an unknown stage is refused before anything runs; $OUT holds the three files the device tool can return
# (summary.txt, results.md, logs.tgz) however many tables the stages write; a stage's failure inside a pipeline is
# its rc; the call's deadline (GPU_DEADLINE) skips the stages that would get under 20 s and cuts a stage's limit to
# what is left (a stub nvidia-smi that sleeps stands for a stage that runs long).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/gpu_program_dry.XXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
prog="$root/perf/gpu_program.sh"
export MGRL_BUILD_DIR=$work/nobuild

# 1. an unknown stage: exit 2, no summary written
OUT=$work/o1 bash "$prog" sampler no_such_stage > "$work/1.log" 2>&1; rc=$?
[ $rc = 2 ] || fail "unknown stage: rc $rc, want 2"
grep -q "no stage 'no_such_stage'" "$work/1.log" || fail "unknown stage: no message"
[ ! -s "$work/o1/summary.txt" ] || fail "unknown stage: a stage ran"

# 2. stages that fail at once; a table file per stage in the results folder, three files in $OUT
OUT=$work/o2 bash "$prog" sampler norm > "$work/2.log" 2>&1 || fail "stages sampler norm: rc $?"
n=$(ls "$work/o2" | wc -l)
[ "$n" = 3 ] || fail "\$OUT holds $n files: $(ls "$work/o2")"
for f in summary.txt results.md logs.tgz; do [ -f "$work/o2/$f" ] || fail "no $f"; done
grep -q '^stage sampler: rc [1-9]' "$work/o2/summary.txt" || fail "the sampler's failure (inside a pipeline) is not its rc"
grep -q '^=== bench_norm.txt ===' "$work/o2/results.md" || fail "results.md lacks bench_norm.txt"
# The listing first, then grep: `tar | grep -q` under pipefail fails when grep exits at its match before tar has
# written the rest (tar then dies of SIGPIPE): it failed that way 1 run in 4 on a loaded machine.
listing=$(tar -tzf "$work/o2/logs.tgz") || fail "logs.tgz unreadable"
grep -q 'results/bench_sample.txt' <<< "$listing" || fail "logs.tgz lacks the results folder"
grep -q 'sampler.log' <<< "$listing" || fail "logs.tgz lacks sampler.log"

# 3. the preset 'first' under a deadline that leaves no stage 20 s: every stage skipped, said in the summary
OUT=$work/o3 GPU_DEADLINE=34 bash "$prog" first > "$work/3.log" 2>&1 || fail "first: rc $?"
for s in info ctest_quick train05 grpo gen; do
  grep -q "^stage $s: skipped (the call's deadline: 34 s)" "$work/o3/summary.txt" || fail "first: $s not skipped"
done

# 4. a stage that runs long is cut to the deadline: info's limit is 120 s, the call's deadline 40 s leaves it 25 s
mkdir -p "$work/bin" && printf '#!/bin/sh\nsleep 100\n' > "$work/bin/nvidia-smi" && chmod +x "$work/bin/nvidia-smi"
t0=$SECONDS
PATH=$work/bin:$PATH OUT=$work/o4 GPU_DEADLINE=40 bash "$prog" info sampler > "$work/4.log" 2>&1 || fail "info: rc $?"
took=$((SECONDS - t0))
grep -q '^stage info: rc 124, 2[5-9] s' "$work/o4/summary.txt" || fail "info not cut at 25 s: $(cat "$work/o4/summary.txt")"
grep -q '^stage sampler: skipped' "$work/o4/summary.txt" || fail "sampler not skipped after the cut"
[ "$took" -le 40 ] || fail "the call took $took s, past its 40 s deadline"
echo "gpu_program_dry: all checks passed (the deadline run took $took s)"
