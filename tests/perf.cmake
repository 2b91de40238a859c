# tests/perf.cmake: the scaling harness perf/scaling (issue 12) in its short mode (included by tests/CMakeLists.txt).
# perf.scaling_short: SFT and GRPO on the Qwen2 fixture, weak and strong, at 1 and 2 CPU ranks; --check asserts that
# every point ran and has a positive step time and tokens/s, compute (forward, backward) and, at 2 ranks,
# communication in its phases, generation in GRPO's, every rank's figures, an efficiency that its step times give
# (positive, finite; beyond 1.5 only said: timing noise), exactly 1 at 1 rank, a row in scaling.md; also that the performance model's tables, the CSV (a row per point) and the plots
# were written (SVG always, PNG where the system python has matplotlib).
# perf.scaling_check_fails: the check fails on a failed run and on efficiencies its step times do not give, and
# only notes a super-linear one they do give (tests/perf/scaling_check_cases.sh).
set(SCALING "${CMAKE_CURRENT_BINARY_DIR}/scaling")
add_test(NAME perf.scaling_short COMMAND bash -c
  "rm -rf ${SCALING}/short && ${PROJECT_SOURCE_DIR}/perf/scaling --mgrl=$<TARGET_FILE:mgrl> --short --project --ranks=1,2 --out=${SCALING}/short > ${SCALING}/short.log 2>&1; rc=$?; cat ${SCALING}/short.log; [ $rc = 0 ] && ${PROJECT_SOURCE_DIR}/perf/scaling --check=${SCALING}/short && grep -q '^Projected (not measured)' ${SCALING}/short/scaling.md && grep -q '^Measured (this machine)' ${SCALING}/short/scaling.md && grep -q '<svg' ${SCALING}/short/efficiency.svg && grep -q '<svg' ${SCALING}/short/phases.svg && head -1 ${SCALING}/short/scaling.csv | grep -q '^workload,mode,ranks,' && test $(grep -c '^grpo,' ${SCALING}/short/scaling.csv) = 4 && { ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || { head -c 4 ${SCALING}/short/speedup.png | grep -q PNG && head -c 4 ${SCALING}/short/phases.png | grep -q PNG; } }")
set_tests_properties(perf.scaling_short PROPERTIES LABELS "perf;slow" TIMEOUT 300 PROCESSORS 2 ENVIRONMENT "${MGRL_MPI_ENV}"
                     FIXTURES_SETUP scaling_short)
add_test(NAME perf.scaling_check_fails COMMAND bash ${PROJECT_SOURCE_DIR}/tests/perf/scaling_check_cases.sh ${SCALING}
         ${PROJECT_SOURCE_DIR})
set_tests_properties(perf.scaling_check_fails PROPERTIES LABELS "perf;slow" TIMEOUT 60 FIXTURES_REQUIRED scaling_short)
file(MAKE_DIRECTORY "${SCALING}")

# perf.bench_*: the Google Benchmark suites of perf/ (the `bench` target runs them in full) run briefly, only their
# small sizes: each must exit 0 and write JSON in which every benchmark named here ran without error with a positive
# bytes/s (and a positive FLOP/s where it reports one). A few seconds each; the figures are not checked.
if(MGRL_BUILD_BENCH)
  set(CHECK_BENCH ${PROJECT_SOURCE_DIR}/perf/check_bench_json.py)
  add_test(NAME perf.bench_io COMMAND ${CHECK_BENCH} ${CMAKE_CURRENT_BINARY_DIR}/bench/bench_io.json
    BM_TokenizerEncode/qwen2_bytelevel BM_TokenizerEncode/llama3_bytelevel BM_TokenizerEncode/llama2_sentencepiece
    BM_CheckpointWrite/1 BM_CheckpointRead/1 BM_SafetensorsLoad/BF16/1 BM_SafetensorsLoad/F32/1
    -- $<TARGET_FILE:bench_io> --bench_dir=${CMAKE_CURRENT_BINARY_DIR}/bench)
  set(_kernels "")
  foreach(op LinearForward LinearBackward LoraForward LoraBackward AttentionForward AttentionBackward RmsnormForward
             RmsnormBackward RopeForward SwigluForward SwigluBackward LmHeadLogprobForward LmHeadLogprobBackward
             AttentionCached)
    list(APPEND _kernels BM_${op}/64)
  endforeach()
  add_test(NAME perf.bench_kernels_cpu COMMAND ${CHECK_BENCH} ${CMAKE_CURRENT_BINARY_DIR}/bench/bench_kernels_cpu.json
    ${_kernels} BM_Sample/8 BM_AdamW/65536 -- $<TARGET_FILE:bench_kernels_cpu>)
  add_test(NAME perf.bench_comm COMMAND ${CHECK_BENCH} ${CMAKE_CURRENT_BINARY_DIR}/bench/bench_comm.json
    BM_AllreduceF32/4096 BM_AllreduceF32/65536
    -- ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MGRL_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS}
       $<TARGET_FILE:bench_comm> ${MPIEXEC_POSTFLAGS} --backend=cpu)
  set_tests_properties(perf.bench_io PROPERTIES LABELS perf TIMEOUT 60 FIXTURES_SETUP bench_io_json)
  set_tests_properties(perf.bench_kernels_cpu PROPERTIES LABELS perf TIMEOUT 60)
  # perf.bench_check_fails: the check fails on a benchmark that did not run and on a zero bytes/s.
  set(_json ${CMAKE_CURRENT_BINARY_DIR}/bench/bench_io.json)
  set(_zero ${CMAKE_CURRENT_BINARY_DIR}/bench/zero.json)
  add_test(NAME perf.bench_check_fails COMMAND bash -c
    "${CHECK_BENCH} ${_json} BM_CheckpointWrite/1 && ! ${CHECK_BENCH} ${_json} BM_CheckpointWrite/1 BM_NoSuchBenchmark && sed 's/\"bytes_per_second\": [0-9.e+]*/\"bytes_per_second\": 0/' ${_json} > ${_zero} && ! ${CHECK_BENCH} ${_zero} BM_CheckpointWrite/1")
  set_tests_properties(perf.bench_check_fails PROPERTIES LABELS perf TIMEOUT 30 FIXTURES_REQUIRED bench_io_json)
  set_tests_properties(perf.bench_comm PROPERTIES LABELS perf TIMEOUT 60 PROCESSORS 2 ENVIRONMENT "${MGRL_MPI_ENV}")
  file(MAKE_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/bench")
endif()

# perf.gpu_program_dry: perf/gpu_program.sh (the GPU programme of a session lent a GPU) on this GPU-less machine: an
# unknown stage refused, three files in $OUT (the device tool returns at most 8), a failure inside a stage's pipeline
# is its rc, the call's deadline skips stages and cuts a long stage (~30 s: a stub nvidia-smi that sleeps).
add_test(NAME perf.gpu_program_dry COMMAND bash ${PROJECT_SOURCE_DIR}/tests/perf/gpu_program_dry.sh)
set_tests_properties(perf.gpu_program_dry PROPERTIES LABELS perf TIMEOUT 120)
