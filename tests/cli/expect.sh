#!/usr/bin/env bash
# expect.sh: runs a command and checks its exit code, stdout, stderr and the number of lines mgrl
# wrote to stderr (lines starting "mgrl:"; launcher banners are not counted).
# usage: expect.sh RC STDOUT_REGEX STDERR_REGEX MGRL_STDERR_LINES -- command [args...]
#        ('-' skips a check; regexes are grep -P multi-line patterns matched against the whole stream, ^ and $ at line ends)
set -u
want_rc=$1 want_out=$2 want_err=$3 want_lines=$4
shift 4
[ "$1" = "--" ] && shift
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
start=$(date +%s)
"$@" >"$out" 2>"$err"
rc=$?
secs=$(( $(date +%s) - start ))
fail=0
report() { echo "FAIL: $*"; fail=1; }
[ "$want_rc" = "-" ] || [ "$rc" = "$want_rc" ] || report "exit code $rc, expected $want_rc"
if [ "$want_out" != "-" ] && ! grep -Pzq -- "(?m)$want_out" "$out"; then report "stdout does not match /$want_out/"; fi
if [ "$want_err" != "-" ] && ! grep -Pzq -- "(?m)$want_err" "$err"; then report "stderr does not match /$want_err/"; fi
if [ "$want_lines" != "-" ]; then
  n=$(grep -c '^mgrl:' "$err")
  [ "$n" = "$want_lines" ] || report "$n lines from mgrl on stderr, expected $want_lines"
fi
echo "command: $* (exit $rc after ${secs}s)"
echo "--- stdout"; cat "$out"
echo "--- stderr"; cat "$err"
exit $fail
