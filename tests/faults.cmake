# tests/faults.cmake: faults in multi-rank jobs and checkpoints under kill -9 (issue 13; tests/cli/faults.sh and
# tests/cli/kill_trials.sh say what each asserts; docs/reliability.md has the figures). Included by
# tests/CMakeLists.txt after SFT_ARGS is set.
set(FAULT_ARGS ${SFT_ARGS} --runtime.threads=1)
set(FAULT_LAUNCH ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MGRL_MPIEXEC_FLAGS} $<TARGET_FILE:mgrl> ${FAULT_ARGS})
foreach(scenario kill9-rank1 sigstop-rank1 throw-ckpt-write sigterm-launcher sigint-launcher)
  string(REPLACE "-" "_" name "${scenario}")
  add_test(NAME cli.fault.${name}.np2 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/faults.sh ${scenario}
           ${CMAKE_CURRENT_BINARY_DIR}/faults/${name} $<TARGET_FILE:check_train> -- ${FAULT_LAUNCH})
  set_tests_properties(cli.fault.${name}.np2 PROPERTIES LABELS cli TIMEOUT 120 PROCESSORS 2
                       ENVIRONMENT "${MGRL_MPI_ENV}" FAIL_REGULAR_EXPRESSION "FAIL")
endforeach()
# kill -9 during checkpoint writes: a few trials in the quick suite, 50 in the slow one (about 3 minutes).
add_test(NAME cli.fault.kill9_checkpoint_trials COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/kill_trials.sh 4 7
         ${CMAKE_CURRENT_BINARY_DIR}/faults/kill_trials $<TARGET_FILE:check_train> -- $<TARGET_FILE:mgrl> ${FAULT_ARGS})
add_test(NAME cli.fault.kill9_checkpoint_trials_50 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/kill_trials.sh 50 2026
         ${CMAKE_CURRENT_BINARY_DIR}/faults/kill_trials_50 $<TARGET_FILE:check_train> -- $<TARGET_FILE:mgrl> ${FAULT_ARGS})
set_tests_properties(cli.fault.kill9_checkpoint_trials PROPERTIES LABELS cli TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "every resume ended bitwise")
set_tests_properties(cli.fault.kill9_checkpoint_trials_50 PROPERTIES LABELS "cli;slow" TIMEOUT 900
                     PASS_REGULAR_EXPRESSION "every resume ended bitwise")
