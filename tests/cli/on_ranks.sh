# on_ranks.sh: sourced by the cli scripts that run mgrl on 1 and on several ranks (steps_per_generation.sh,
# grpo_entropy.sh, grpo_rloo.sh, kto.sh, data_shuffle.sh, neftune.sh, reference_resume.sh), each given MPIEXEC NUMPROC_FLAG [MPI FLAGS...]
# into the array `mpirun`.
#   take_launcher MPIEXEC NUMPROC_FLAG [MPI FLAGS...] -- REST...: `mpirun` gets the words before "--", `rest` the
#     others (then: set -- "${rest[@]}").
#   on_ranks N CMD...: CMD alone (N = 1) or under mpirun on N ranks.
#   run NAME RANKS ARGS...: on_ranks RANKS ARGS with a checkpoint every step in $work/NAME/ck, the run log in
#     $work/NAME and its output in $work/NAME.log, failing with its last lines; ck NAME STEP: that run's checkpoint.
#   fail MSG: prints FAIL: MSG, exits 1.
#   split_parts NAME... --words WORDS...: WORDS up to each "--" into the arrays NAME... in turn
#     (split_parts kto dpo grpo --words "$@": kto=(...) dpo=(...) grpo=(...)).
#   refused NAME RANKS PATTERN ARGS...: on_ranks RANKS ARGS exits 2 with one error line, matching PATTERN (grep -E),
#     its output in $work/NAME.out; prints "NAME: refused".
fail() { echo "FAIL: $*"; exit 1; }
refused() {
  local name=$1 ranks=$2 pattern=$3
  shift 3
  on_ranks "$ranks" "$@" > "$work/$name.out" 2>&1
  local rc=$?
  [ $rc -eq 2 ] || fail "$name: exit $rc, not 2: $(tail -n 2 "$work/$name.out")"
  grep -qE "$pattern" "$work/$name.out" || fail "$name: $(grep 'error' "$work/$name.out" | head -n 2)"
  [ "$(grep -c '^mgrl: error' "$work/$name.out")" -eq 1 ] ||
    fail "$name: not one error line: $(grep -c '^mgrl: error' "$work/$name.out")"
  echo "$name: refused"
}
split_parts() {
  local names=() n
  while [ "$#" -gt 0 ] && [ "$1" != "--words" ]; do names+=("$1"); shift; done
  shift
  for n in "${names[@]}"; do eval "$n=()"; done
  local i=0 word
  for word in "$@"; do
    if [ "$word" = "--" ]; then
      [ $((i + 1)) -lt ${#names[@]} ] && i=$((i + 1))
      continue
    fi
    eval "${names[$i]}+=(\"\$word\")"
  done
}
on_ranks() {
  local n=$1
  shift
  if [ "$n" -gt 1 ]; then "${mpirun[0]}" "${mpirun[1]}" "$n" "${mpirun[@]:2}" "$@"; else "$@"; fi
}
take_launcher() {
  mpirun=()
  while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done
  shift
  rest=("$@")
}
run() {  # NAME RANKS ARGS...
  local name=$1 ranks=$2
  shift 2
  on_ranks "$ranks" "$@" --checkpoint.dir="$work/$name/ck" --log.dir="$work/$name" --checkpoint.every_steps=1 \
    > "$work/$name.log" 2>&1 || fail "$name: $(tail -n 3 "$work/$name.log")"
}
ck() { echo "$work/$1/ck/step_0000000$2.h5"; }
