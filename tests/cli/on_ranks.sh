# on_ranks.sh: sourced by the cli scripts that run mgrl on 1 and on several ranks (steps_per_generation.sh,
# grpo_entropy.sh, data_shuffle.sh, neftune.sh), each given MPIEXEC NUMPROC_FLAG [MPI FLAGS...] into the array
# `mpirun`. on_ranks N CMD...: CMD alone (N = 1) or under mpirun on N ranks. fail MSG: prints FAIL: MSG, exits 1.
fail() { echo "FAIL: $*"; exit 1; }
on_ranks() {
  local n=$1
  shift
  if [ "$n" -gt 1 ]; then "${mpirun[0]}" "${mpirun[1]}" "$n" "${mpirun[@]:2}" "$@"; else "$@"; fi
}
