#!/usr/bin/env bash
# sanitize_opt.sh: the sanitizer build's compiler launcher (scripts/sanitize.sh): runs the compile command it is given
# with the optimization level chosen by the source file: -O1 for what the fuzzers and the sanitized tests spend their
# time in (the parsers in src/io, checkpoints, the reward verdicts, the CPU kernels, the fuzz targets, the tests'
# own code: unit.chat_template took 36 s of its 60 s limit with its test code at -O0), -O0 for the rest (the modes,
# the training and RL loops), which the sanitizers check just as well at -O0 and which compiles faster there
# (config_schema.cpp: 11.6 s at -O1, 3.2 s at -O0 with ASan + UBSan).
# The later -O on the command line is the one the compiler uses.
set -euo pipefail
src=""
for arg in "$@"; do
  case "$arg" in *.cpp | *.cc | *.c) src=$arg ;; esac
done
case "$src" in
  */src/io/* | */src/train/checkpoint* | */src/rl/rewards/* | */kernels/* | */fuzz/* | */tests/*) exec "$@" -O1 ;;
  *) exec "$@" -O0 ;;
esac
