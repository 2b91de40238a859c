# tests/faults: faults in running multi-rank jobs (issue 13, items 5 and 6), with real mpirun on the Qwen2 fixture.
# Each asserts the exit code, the time the job took to end, the one line of ours, and that no process is left.
# Label `fault` (and `cli`, `mpi`); the 50-trial kill -9 run is also `slow`.
set(FAULT_ARGS ${SFT_ARGS} --runtime.threads=1 --checkpoint.resume=none)
set(FAULT_MPIRUN ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG})
function(mgrl_add_fault_test name ranks)
  add_test(NAME fault.${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/faults.sh ${ARGN}
           ${CMAKE_CURRENT_BINARY_DIR}/faults/${name} $<TARGET_FILE:check_train>
           -- ${FAULT_MPIRUN} ${ranks} ${MGRL_MPIEXEC_FLAGS} $<TARGET_FILE:mgrl> ${FAULT_ARGS})
  set_tests_properties(fault.${name} PROPERTIES LABELS "fault;cli;mpi" TIMEOUT 90 PROCESSORS 2
                       PASS_REGULAR_EXPRESSION "PASS: " ENVIRONMENT "${MGRL_MPI_ENV}")
endfunction()
# A rank killed (SIGKILL) mid-run: the lowest surviving rank of the host names it and what it was waiting in.
mgrl_add_fault_test(kill9_rank1.np2 2 kill9:1)
mgrl_add_fault_test(kill9_rank0.np4 4 kill9:0)
# A rank stopped (SIGSTOP): the others wait in a collective until runtime.comm_timeout_s, then one line names it.
mgrl_add_fault_test(sigstop_rank1.np2 2 sigstop:1)
mgrl_add_fault_test(sigstop_rank2.np4 4 sigstop:2)
# A rank that throws while a checkpoint is written (rank 0 half way through the file; rank 1 while rank 0 writes):
# every rank ends with rank 0's line and one exit code, no temporary is left, and resume = auto finishes the run
# with the weights of an uninterrupted one.
mgrl_add_fault_test(ckthrow_rank0.np2 2 ckthrow:0)
mgrl_add_fault_test(ckthrow_rank1.np2 2 ckthrow:1)
# A rank that crashes (a call through a null function pointer, while a checkpoint is written): its line names the
# rank, host, pid, signal, address and phase; its frames resolve with addr2line; the job ends (core/crash.h).
mgrl_add_fault_test(cksegv_rank1.np2 2 cksegv:1)
# Rank 0's checkpoint write slower than runtime.comm_timeout_s (a slow file system) while the others wait for it: the
# job goes on (the wait for a checkpoint may take the timeout twice, or its bytes at 20 MB/s); a write that hangs
# ends the job after that with one line naming the wait and the file. Failed on the old code (the timeout at 6 s).
mgrl_add_fault_test(ckslow_rank0.np2 2 ckslow:0)
mgrl_add_fault_test(ckstall_rank0.np2 2 ckstall:0)

# The polite signals to mpirun (SIGUSR1 is cli.stop.sigusr1_mpirun.np2): the ranks checkpoint and stop, resume
# reaches the same weights. Open MPI's mpirun does not forward SIGTERM and SIGINT: it sends the ranks SIGTERM itself
# (SIGKILL 1 s later: odls_base_sigkill_timeout) and exits 1.
foreach(sig TERM INT)
  string(TOLOWER ${sig} lower)
  add_test(NAME fault.sig${lower}_mpirun.np2 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/stop_resume.sh ${sig}
           ${CMAKE_CURRENT_BINARY_DIR}/faults/sig${lower} $<TARGET_FILE:check_train>
           -- ${FAULT_MPIRUN} 2 ${MGRL_MPIEXEC_FLAGS} $<TARGET_FILE:mgrl> ${FAULT_ARGS} --checkpoint.every_steps=50)
  set_tests_properties(fault.sig${lower}_mpirun.np2 PROPERTIES LABELS "fault;cli;mpi" TIMEOUT 120 PROCESSORS 2
                       PASS_REGULAR_EXPRESSION "the same weights"
                       ENVIRONMENT "${MGRL_MPI_ENV};STOP_RC=1;STOP_STEPS=300;STOP_ABORT_OK=1")
endforeach()

# kill -9 to the checkpoint writer at random moments (seeded): the newest complete checkpoint always reads back and
# resume = auto reaches the uninterrupted run's weights bit for bit. 5 trials in the quick suite, 50 in `slow`.
set(KILL9_LAUNCH $<TARGET_FILE:mgrl> ${FAULT_ARGS})
add_test(NAME fault.kill9_checkpoints_quick COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/kill9_checkpoints.sh 5 13
         ${CMAKE_CURRENT_BINARY_DIR}/faults/kill9_quick $<TARGET_FILE:check_train> -- ${KILL9_LAUNCH})
set_tests_properties(fault.kill9_checkpoints_quick PROPERTIES LABELS "fault;cli" TIMEOUT 120)
add_test(NAME fault.kill9_checkpoints_50 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/kill9_checkpoints.sh 50 2024
         ${CMAKE_CURRENT_BINARY_DIR}/faults/kill9_50 $<TARGET_FILE:check_train> -- ${KILL9_LAUNCH})
set_tests_properties(fault.kill9_checkpoints_50 PROPERTIES LABELS "fault;slow" TIMEOUT 400)

# The log's disk fills up mid-run (log.dir on a tmpfs of 12 KiB): the run goes on to its final checkpoint (the
# uninterrupted weights), one warning a log file; the next run's metrics lines start on a line of their own.
add_test(NAME fault.log_disk_full.np1 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/log_disk_full.sh
         ${CMAKE_CURRENT_BINARY_DIR}/faults/log_disk_full $<TARGET_FILE:check_train> -- ${KILL9_LAUNCH})
set_tests_properties(fault.log_disk_full.np1 PROPERTIES LABELS "fault;cli" TIMEOUT 120 SKIP_RETURN_CODE 77
                     PASS_REGULAR_EXPRESSION "PASS: ")
# A re-export over an earlier one (adapter and merged model) on a disk with room for one: exit 2, the earlier export
# whole (it was left mixing two exports), then with room every file replaced.
add_test(NAME fault.export_disk_full COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/export_disk_full.sh
         ${CMAKE_CURRENT_BINARY_DIR}/faults/export_disk_full -- $<TARGET_FILE:mgrl> ${FAULT_ARGS})
set_tests_properties(fault.export_disk_full PROPERTIES LABELS "fault;cli" TIMEOUT 120 SKIP_RETURN_CODE 77
                     PASS_REGULAR_EXPRESSION "PASS: ")
# score's output on a full disk: exit 2 naming the file (exit 1 before, its line an HDF5 call's); GRPO's rollout
# files there: a warning, and the run goes on (it ended with exit 1). No temporary.
add_test(NAME fault.outputs_disk_full COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/outputs_disk_full.sh
         ${CMAKE_CURRENT_BINARY_DIR}/faults/outputs_disk_full ${PROJECT_SOURCE_DIR} -- $<TARGET_FILE:mgrl>)
set_tests_properties(fault.outputs_disk_full PROPERTIES LABELS "fault;cli" TIMEOUT 120 SKIP_RETURN_CODE 77
                     PASS_REGULAR_EXPRESSION "PASS: ")
# The checkpoint disk fills up (issue 20): a tmpfs a little larger than one checkpoint (second) or smaller (first),
# mounted in a mount namespace of the test's own; skipped (77) where none can be mounted. Exit code 2 with one line
# naming the checkpoint and the full disk (was a SIGSEGV of libhdf5 at exit), every rank ends, no temporary is left,
# step 2 stays intact (reads back, equals an uninterrupted run's) and resume = auto reaches the uninterrupted weights.
foreach(which first second)
  add_test(NAME fault.disk_full_${which}.np1 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/disk_full.sh ${which}
           ${CMAKE_CURRENT_BINARY_DIR}/faults/disk_full_${which}_np1 $<TARGET_FILE:check_train> -- ${KILL9_LAUNCH})
  add_test(NAME fault.disk_full_${which}.np2 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/disk_full.sh ${which}
           ${CMAKE_CURRENT_BINARY_DIR}/faults/disk_full_${which}_np2 $<TARGET_FILE:check_train>
           -- ${FAULT_MPIRUN} 2 ${MGRL_MPIEXEC_FLAGS} $<TARGET_FILE:mgrl> ${FAULT_ARGS})
  set_tests_properties(fault.disk_full_${which}.np1 PROPERTIES LABELS "fault;cli" TIMEOUT 120 SKIP_RETURN_CODE 77)
  set_tests_properties(fault.disk_full_${which}.np2 PROPERTIES LABELS "fault;cli;mpi" TIMEOUT 120 PROCESSORS 2
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${MGRL_MPI_ENV}")
endforeach()

# A rank that never finishes MPI's start-up (MGRL_FAULT_INJECT=startup_stall: it stops before the first
# collective, as a rank that crashed or could not connect there leaves the others): the start-up deadline
# (MGRL_STARTUP_TIMEOUT_S, here 3 s) ends the job with one line and exit code 4 instead of a hang.
add_test(NAME fault.startup_stall.np2 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/startup_fault.sh
         stall -- ${FAULT_MPIRUN} 2 ${MGRL_MPIEXEC_FLAGS} $<TARGET_FILE:mgrl> info --runtime.backend=cpu)
set_tests_properties(fault.startup_stall.np2 PROPERTIES LABELS "fault;cli;mpi" TIMEOUT 60 PROCESSORS 2
                     PASS_REGULAR_EXPRESSION "PASS: " ENVIRONMENT "${MGRL_MPI_ENV}")

# A rank that crashes inside MPI's start-up (MGRL_FAULT_INJECT=startup:...:action=segv, as Open MPI's TCP transport did under
# srun, docs/reliability.md): its report, then exit code 4 (a lost rank: the batch scripts requeue), the job ends.
add_test(NAME fault.startup_crash.np2 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/startup_fault.sh
         crash -- ${FAULT_MPIRUN} 2 ${MGRL_MPIEXEC_FLAGS} $<TARGET_FILE:mgrl> info --runtime.backend=cpu)
set_tests_properties(fault.startup_crash.np2 PROPERTIES LABELS "fault;cli;mpi" TIMEOUT 60 PROCESSORS 2
                     PASS_REGULAR_EXPRESSION "PASS: " ENVIRONMENT "${MGRL_MPI_ENV}")
