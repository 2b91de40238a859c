# metrics_harness.sh: sourced by the scripts called as SCRIPT WORK EXPECTED MPIRUN... -- MGRL ARGS... (token_metrics.sh,
# dft.sh): sets work and expected, the mpirun command array, the positional parameters to MGRL ARGS (the caller runs
# `set -- "${cmd[@]}"`), a fresh WORK directory, and fail().
work=$1 expected=$2
shift 2
mpirun=()
while [ "$1" != -- ]; do mpirun+=("$1"); shift; done
shift
cmd=("$@")
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
