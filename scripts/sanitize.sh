#!/usr/bin/env bash
# sanitize.sh: the sanitizer job (scripts/test.sh runs it after the main suite; docs/reliability.md):
#  1. builds the CPU backend, mgrl, the tests and the libFuzzer targets with clang, AddressSanitizer and
#     UndefinedBehaviorSanitizer (every UB report is an error: -fno-sanitize-recover) into build-sanitize/
#     (or $MGRL_SANITIZE_DIR);
#  2. runs tests under them: in CI a subset (below), with MGRL_SANITIZE_FULL=1 every unit, mpi and cli test;
#  3. runs every fuzz target for $MGRL_FUZZ_SECONDS seconds (default 15) over its committed corpus (fuzz/corpus/),
#     as many at a time as there are cores.
# A sanitizer report, a crash or an escaped exception fails the job; a crashing input is left in
# build-sanitize/fuzz-findings/ (commit it to fuzz/corpus/<target>/ with the fix, as a regression input).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MGRL_SANITIZE_DIR:-$root/build-sanitize}
seconds=${MGRL_FUZZ_SECONDS:-15}
mkdir -p "$build"
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g1"
# The optimization level per source file: scripts/sanitize_opt.sh (-O1 for the parsers, checkpoints, reward verdicts,
# kernels, fuzz targets and tests, -O0 for the modes and the training and RL loops).
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMGRL_CUDA=OFF \
  -DCMAKE_C_COMPILER_LAUNCHER="$root/scripts/sanitize_opt.sh" -DCMAKE_CXX_COMPILER_LAUNCHER="$root/scripts/sanitize_opt.sh" \
  -DMGRL_BUILD_BENCH=OFF -DMGRL_FUZZ=ON -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
# CI (the default) builds and runs a subset that keeps the job within CI's time budget on 2 cores: the parsers'
# unit tests, the 2-rank communicator, SFT/GRPO/fault cli tests and the fuzz targets. MGRL_SANITIZE_FULL=1 builds
# everything and runs every unit, mpi and cli test (about 40 minutes on 2 cores; docs/reliability.md has its result).
full=${MGRL_SANITIZE_FULL:-0}
targets=(mgrl check_train test_config test_errors test_tokenizer test_chat_template test_safetensors test_checkpoint test_comm
         fuzz_config fuzz_safetensors fuzz_tokenizer_json fuzz_tokenizer_encode fuzz_jsonl fuzz_checkpoint fuzz_verdict
         fuzz_jinja)
if [ "$full" = 1 ]; then
  cmake --build "$build" --parallel "$(nproc)"
else
  cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]}"
fi
# Leaks: Open MPI and HDF5 keep allocations until exit by design; leak checking would report theirs, not ours.
# allocator_may_return_null: libhdf5 asks for absurd sizes on damaged files and copes with NULL, as glibc returns.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd "$build"
if [ "$full" = 1 ]; then
  ctest --output-on-failure --timeout 600 -j "$(nproc)" -L "unit|mpi|cli" -LE "slow|gpu" -E "kill9_checkpoint_trials"
else
  ctest --output-on-failure --timeout 300 -j "$(nproc)" \
    -R "^unit\.(config|errors|tokenizer|chat_template|safetensors|checkpoint)$|^comm\.cpu\.np2$|^cli\.sft\.(resume_is_exact|same_weights_on_1_2_4_ranks)$|^fault\.(kill9_rank1|sigstop_rank1)\.np2$|^cli\.grpo\.resume_is_exact$|^cli\.(unknown_key|wrong_type|bad_toml)"
fi
mkdir -p fuzz-findings
# Each target runs for $seconds; as many at a time as there are cores (each fuzzer is one process, one thread), the
# results reported in the targets' order.
fuzz_one() {
  local target=$1 rc=0
  local corpus="$root/fuzz/corpus/${target#fuzz_}"
  local work="fuzz-corpus/${target#fuzz_}"  # new inputs found now go here, not into the source tree
  mkdir -p "$work"
  "./fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix=fuzz-findings/"$target"- "$work" "$corpus" > "fuzz-$target.log" 2>&1 || rc=$?
  echo "$rc" > "fuzz-$target.rc"
}
targets=(fuzz_config fuzz_safetensors fuzz_tokenizer_json fuzz_tokenizer_encode fuzz_jsonl fuzz_checkpoint fuzz_verdict
         fuzz_jinja)
lanes=$(nproc)
for ((i = 0; i < ${#targets[@]}; i += lanes)); do
  for target in "${targets[@]:i:lanes}"; do
    echo "sanitize: $target for ${seconds} s"
    rm -f "fuzz-$target.rc"
    fuzz_one "$target" &
  done
  wait
done
for target in "${targets[@]}"; do
  rc=$(cat "fuzz-$target.rc" 2>/dev/null || echo "no exit status")
  echo "sanitize: $target: $(grep -E "stat::number_of_executed_units|stat::new_units_added" "fuzz-$target.log" | tr '\n' ' ')"
  if [ "$rc" != 0 ]; then
    grep -E -A30 "ERROR|SUMMARY|runtime error|terminate called" "fuzz-$target.log" | head -n 60
    echo "sanitize: $target found a failing input (exit $rc; $build/fuzz-findings/)"
    exit 1
  fi
done
echo "sanitize: done"
