#!/usr/bin/env bash
# score_invariant.sh WORK MGRL MODELS DATA -- MPIEXEC NUMPROC_FLAG [MPI FLAGS...]: `mgrl score` writes the same file
# on 1 and 2 ranks and at score.batch_size 1, 2 and 5 (h5diff, exact), for two fixture models, one thread a rank.
set -euo pipefail
work=$1 mgrl=$2 models=$3 data=$4
shift 4
[ "$1" = -- ] && shift
mpiexec=$1 np=$2
shift 2
flags=("$@")
mpi() { local n=$1; shift; "$mpiexec" "$np" "$n" "${flags[@]}" "$@"; }
rm -rf "$work" && mkdir -p "$work"
for m in llama_gqa gemma3_text; do
  s=("$mgrl" score --runtime.backend=cpu --runtime.threads=1 --model.path="$models/$m" --lora.adapter="$models/$m"
     --data.input="$data/$m.jsonl")
  mpi 1 "${s[@]}" --score.batch_size=2 --score.output="$work/$m.1.h5" > /dev/null
  mpi 2 "${s[@]}" --score.batch_size=5 --score.output="$work/$m.2.h5" > /dev/null
  "${s[@]}" --score.batch_size=1 --score.output="$work/$m.b1.h5" > /dev/null
  h5diff "$work/$m.1.h5" "$work/$m.2.h5"
  h5diff "$work/$m.1.h5" "$work/$m.b1.h5"
  echo "$m: np2 equal, batch 1 equal"
done
