# tests/perf.cmake: the scaling harness perf/scaling (issue 12) in its short mode (included by tests/CMakeLists.txt).
# perf.scaling_short: SFT and GRPO on the Qwen2 fixture, weak and strong, at 1 and 2 CPU ranks; --check asserts that
# every point ran and has a positive step time and tokens/s, compute (forward, backward) and, at 2 ranks,
# communication in its phases, generation in GRPO's, every rank's figures, an efficiency in (0, 1.5] (exactly 1 at
# 1 rank), a row in scaling.md; also that the performance model's tables, the CSV (a row per point) and the plots
# were written (SVG always, PNG where the system python has matplotlib).
# perf.scaling_check_fails: the check fails on a failed run and on an efficiency out of range.
set(SCALING "${CMAKE_CURRENT_BINARY_DIR}/scaling")
add_test(NAME perf.scaling_short COMMAND bash -c
  "rm -rf ${SCALING}/short && ${PROJECT_SOURCE_DIR}/perf/scaling --mgrl=$<TARGET_FILE:mgrl> --short --project --ranks=1,2 --out=${SCALING}/short > ${SCALING}/short.log 2>&1; rc=$?; cat ${SCALING}/short.log; [ $rc = 0 ] && ${PROJECT_SOURCE_DIR}/perf/scaling --check=${SCALING}/short && grep -q '^Projected (not measured)' ${SCALING}/short/scaling.md && grep -q '^Measured (this machine)' ${SCALING}/short/scaling.md && grep -q '<svg' ${SCALING}/short/efficiency.svg && grep -q '<svg' ${SCALING}/short/phases.svg && head -1 ${SCALING}/short/scaling.csv | grep -q '^workload,mode,ranks,' && test $(grep -c '^grpo,' ${SCALING}/short/scaling.csv) = 4 && { ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || { head -c 4 ${SCALING}/short/speedup.png | grep -q PNG && head -c 4 ${SCALING}/short/phases.png | grep -q PNG; } }")
set_tests_properties(perf.scaling_short PROPERTIES LABELS "perf;slow" TIMEOUT 300 PROCESSORS 2 ENVIRONMENT "${MGRL_MPI_ENV}"
                     FIXTURES_SETUP scaling_short)
add_test(NAME perf.scaling_check_fails COMMAND bash -c
  "d=${SCALING}/bad && rm -rf $d && mkdir -p $d/out && ${PROJECT_SOURCE_DIR}/perf/scaling --mgrl=/bin/false --short --workload=sft --mode=weak --ranks=1 --out=$d/failed; ${PROJECT_SOURCE_DIR}/perf/scaling --check=$d/failed --ranks=1 --workloads=sft --modes=weak && exit 1; cp ${SCALING}/short/scaling.md $d/out/ && sed 's/\"efficiency\": [0-9.e-]*/\"efficiency\": 3.0/' ${SCALING}/short/scaling.json > $d/out/scaling.json && { out=$(${PROJECT_SOURCE_DIR}/perf/scaling --check=$d/out); rc=$?; echo \"$out\"; [ $rc = 1 ] && grep -q 'efficiency 3.0 outside' <<< \"$out\"; } && ${PROJECT_SOURCE_DIR}/perf/scaling --check=${SCALING}/short")
set_tests_properties(perf.scaling_check_fails PROPERTIES LABELS "perf;slow" TIMEOUT 60 FIXTURES_REQUIRED scaling_short)
file(MAKE_DIRECTORY "${SCALING}")
