#!/usr/bin/env bash
# check_cuda_host_exit.sh OBJECT_OR_ARCHIVE...: fails when host code in the given objects calls a function whose
# host-side body is nvcc's silent `exit(1)`.
#
# Why: host code that reaches a __device__-only function through a template (a generic lambda given to dispatch(),
# say) compiles without an error or a warning (nvcc 13, and -Werror cross-execution-space-call does not catch it):
# nvcc emits the host function as a bare call to exit(1). The program then ends with code 1 and no message the first
# time it gets there (2026-11-27: embedding_forward's scale rounding, to_f32(from_f32<S>(scale)) in the host-side
# lambda, ended every CUDA run on its first embedding). nvcc also emits such exit(1) bodies for __device__ functions
# that no host code calls; those are harmless, so only functions that some host code calls are reported.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 OBJECT_OR_ARCHIVE..." >&2; exit 2; }
command -v objdump >/dev/null || { echo "$0: objdump (binutils) not found" >&2; exit 2; }
for f in "$@"; do [ -r "$f" ] || { echo "$0: cannot read $f" >&2; exit 2; }; done
objdump -dr --no-show-raw-insn "$@" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = $0; sub(/^[0-9a-f]+ </, "", fn); sub(/>:$/, "", fn); nfn++; next }
  /R_X86_64_(PLT32|PC32)[ \t]+exit-/ || /\t(call|jmp) +[0-9a-f]+ <exit@plt>$/ { exits[fn] = 1; next }
  /R_X86_64_(PLT32|PC32)[ \t]/ && pending { t = $NF; sub(/[-+]0x[0-9a-f]+$/, "", t); calls[fn SUBSEP t] = 1; pending = 0; next }
  /\tcall / || /\tjmp / {
    pending = 0
    if (match($0, /<[^>]*>$/)) { t = substr($0, RSTART + 1, RLENGTH - 2); sub(/\+0x[0-9a-f]+$/, "", t); calls[fn SUBSEP t] = 1 }
    pending = 1; next
  }
  { pending = 0 }
  END {
    bad = 0
    for (k in calls) {
      split(k, p, SUBSEP)
      if ((p[2] in exits) && p[1] != p[2] && !(p[1] in exits)) {
        printf "host code calls a silent exit(1): %s calls %s\n", p[1], p[2]; bad = 1
      }
    }
    if (nfn == 0) { print "no functions found in the objects"; exit 2 }
    exit bad
  }' | { out=$(cat); [ -z "$out" ] || echo "$out" | (command -v c++filt >/dev/null && c++filt || cat); [ -z "$out" ]; }
