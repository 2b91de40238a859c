#!/usr/bin/env bash
# launcher_fence.sh: the start-up fence through the launcher's PMIx server (dist/launcher_fence.h). It runs and passes
# under mpirun (`mgrl info` says so); when it fails on rank 1 (MGRL_FAULT_INJECT=launcher_fence, as a failing
# PMIx_Fence would), rank 1 ends with one line naming itself and the PMIx status, the job exits with code 4 (a lost
# rank: slurm/common.sh requeues it) within a few seconds (MGRL_STARTUP_TIMEOUT_S=5 bounds the other rank).
# usage: launcher_fence.sh -- MPIEXEC ... MGRL info --runtime.backend=cpu
shift  # --
fail() { echo "FAIL: $*"; exit 1; }
out=$("$@" 2>&1) || { echo "$out"; fail "mgrl info failed"; }
grep -E "^start-up fence through the launcher \(PMIx\): passed in [0-9.]+ ms$" <<< "$out" ||
  { echo "$out"; fail "no line saying that the launcher's fence passed"; }
start=$(date +%s)
out=$(MGRL_STARTUP_TIMEOUT_S=5 MGRL_FAULT_INJECT=launcher_fence:rank=1:step=0 "$@" 2>&1)
rc=$?
took=$(($(date +%s) - start))
echo "$out"
echo "exit code $rc after $took s"
[ "$rc" -eq 4 ] || fail "exit code $rc, not 4"
[ "$(grep -c '^mgrl: rank 1 on host [^ ]* (pid [0-9]*): the start-up barrier through the launcher (PMIx_Fence) failed with PMIx status -1 ' <<< "$out")" = 1 ] ||
  fail "not one line of rank 1 naming the failed fence and its status"
[ "$took" -lt 20 ] || fail "took $took s"
echo "PASS: the fence passed, and a failed one ended the job in $took s with exit code 4 and rank 1's line"
