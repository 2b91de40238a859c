# tests/cluster.cmake: cluster tests (included by tests/CMakeLists.txt). Labels:
#   slurm      a real single-node SLURM (munged, slurmctld, slurmd) started once per ctest run by the fixture
#              slurm.cluster_start and stopped by slurm.cluster_stop; mgrl on the CPU backend under srun, salloc +
#              mpirun, and the batch scripts of slurm/ (including stop, requeue and exact resume)
#   slurm      also slurm.multinode.*: a real SLURM of 3 hosts on this machine (network namespaces with their own
#              hostnames and addresses on a bridge, a slurmd each), started once by slurm.multinode.cluster_start and
#              stopped by slurm.multinode.cluster_stop: ranks of 2 nodes over TCP, the batch scripts, preemption, and a
#              node lost mid-job (killed, link cut); one test at a time (RESOURCE_LOCK: they kill nodes)
#   module     `cmake --install` into a temporary prefix (fixture install.prefix), then real Lmod
#   packaging  the Spack recipe's dependencies against CMakeLists.txt; the easyconfigs with EasyBuild
# They exit 77 (skipped) only when SLURM, Lmod or EasyBuild cannot be had here (scripts/install_deps.sh installs
# them on Debian 12).
set(CLUSTER "${CMAKE_CURRENT_BINARY_DIR}/cluster")
set(SLURM_STATE "${CLUSTER}/slurm_state")
set(INSTALL_PREFIX "${CLUSTER}/install")

# ---- the install fixture ----
add_test(NAME install.prefix COMMAND bash -c
  "rm -rf '${INSTALL_PREFIX}' && '${CMAKE_COMMAND}' --install '${PROJECT_BINARY_DIR}' --prefix '${INSTALL_PREFIX}' > '${CLUSTER}/install.log' 2>&1 || { cat '${CLUSTER}/install.log'; exit 1; }; test -x '${INSTALL_PREFIX}/bin/mgrl' && echo 'installed into ${INSTALL_PREFIX}'")
set_tests_properties(install.prefix PROPERTIES LABELS "module;slurm" FIXTURES_SETUP mgrl_installed TIMEOUT 120)
file(MAKE_DIRECTORY "${CLUSTER}")

# ---- slurm ----
add_test(NAME slurm.cluster_start COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/cluster.sh start "${SLURM_STATE}")
set_tests_properties(slurm.cluster_start PROPERTIES LABELS slurm FIXTURES_SETUP slurm_cluster SKIP_RETURN_CODE 77 TIMEOUT 60)
add_test(NAME slurm.cluster_stop COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/cluster.sh stop "${SLURM_STATE}")
set_tests_properties(slurm.cluster_stop PROPERTIES LABELS slurm FIXTURES_CLEANUP slurm_cluster TIMEOUT 60)
set(SLURM_ENV ${MGRL_MPI_ENV} MGRL_TEST_STATE=${SLURM_STATE} MGRL_TEST_BIN=$<TARGET_FILE:mgrl>
    MGRL_TEST_SRC=${PROJECT_SOURCE_DIR} MGRL_TEST_WORK=${CLUSTER}/work MGRL_TEST_CHECK=$<TARGET_FILE:check_train>
    MGRL_TEST_PREFIX=${INSTALL_PREFIX})
foreach(case srun_info grpo_script multinode_script sft_script_installed scaling_script failure_not_requeued
             preempt_requeue_resume)
  add_test(NAME slurm.${case} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/test_slurm.sh ${case})
  set_tests_properties(slurm.${case} PROPERTIES LABELS slurm FIXTURES_REQUIRED slurm_cluster SKIP_RETURN_CODE 77
                       TIMEOUT 240 PROCESSORS 2 ENVIRONMENT "${SLURM_ENV}")
endforeach()
set_tests_properties(slurm.sft_script_installed PROPERTIES FIXTURES_REQUIRED "slurm_cluster;mgrl_installed")
# The batch scripts find common.sh when `scontrol show job` fails once (stubs for scontrol and srun; no SLURM needed).
add_test(NAME slurm.script_lookup_retries_scontrol COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/script_lookup.sh
         ${PROJECT_SOURCE_DIR} ${CLUSTER}/script_lookup)
set_tests_properties(slurm.script_lookup_retries_scontrol PROPERTIES LABELS slurm TIMEOUT 90)

# ---- slurm.multinode: 3 hosts in network namespaces (tests/slurm/multinode_cluster.sh) ----
set(MN_STATE "${CLUSTER}/multinode_state")
add_test(NAME slurm.multinode.cluster_start COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/multinode_cluster.sh start "${MN_STATE}")
set_tests_properties(slurm.multinode.cluster_start PROPERTIES LABELS slurm FIXTURES_SETUP slurm_multinode SKIP_RETURN_CODE 77
                     TIMEOUT 60 RESOURCE_LOCK slurm_multinode)
add_test(NAME slurm.multinode.cluster_stop COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/multinode_cluster.sh stop "${MN_STATE}")
set_tests_properties(slurm.multinode.cluster_stop PROPERTIES LABELS slurm FIXTURES_CLEANUP slurm_multinode TIMEOUT 60
                     RESOURCE_LOCK slurm_multinode)
set(MN_ENV ${MGRL_MPI_ENV} MGRL_TEST_MN_STATE=${MN_STATE} MGRL_TEST_BIN=$<TARGET_FILE:mgrl> MGRL_TEST_SRC=${PROJECT_SOURCE_DIR}
    MGRL_TEST_WORK=${CLUSTER}/multinode_work MGRL_TEST_CHECK=$<TARGET_FILE:check_train> MPIEXEC=${MPIEXEC_EXECUTABLE})
foreach(case srun_info sft_same_weights grpo_same_weights slow_generation_remote script_as_written preempt_requeue_resume rank_stopped startup_crash_requeued node_killed
             link_cut)
  add_test(NAME slurm.multinode.${case} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/test_multinode.sh ${case})
  set_tests_properties(slurm.multinode.${case} PROPERTIES LABELS slurm FIXTURES_REQUIRED slurm_multinode
                       SKIP_RETURN_CODE 77 TIMEOUT 300 PROCESSORS 2 RESOURCE_LOCK slurm_multinode ENVIRONMENT "${MN_ENV}")
endforeach()

# ---- module ----
foreach(case lua tcl depends_on prereq scripts)
  add_test(NAME module.${case} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/modules/test_modules.sh ${case} "${INSTALL_PREFIX}"
           "${PROJECT_SOURCE_DIR}" "${PROJECT_BINARY_DIR}" "${CLUSTER}/modules" "${PROJECT_VERSION}")
  set_tests_properties(module.${case} PROPERTIES LABELS module FIXTURES_REQUIRED mgrl_installed SKIP_RETURN_CODE 77 TIMEOUT 60)
endforeach()

# ---- packaging ----
add_test(NAME packaging.spack_dependencies COMMAND /usr/bin/env python3
         ${CMAKE_CURRENT_SOURCE_DIR}/packaging/check_spack_deps.py ${PROJECT_SOURCE_DIR}/CMakeLists.txt
         ${PROJECT_SOURCE_DIR}/packaging/spack/package.py)
add_test(NAME packaging.easybuild COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/packaging/check_easybuild.sh
         "${PROJECT_SOURCE_DIR}" "$ENV{HOME}/.cache/mgrl/easybuild-venv")
set_tests_properties(packaging.spack_dependencies packaging.easybuild PROPERTIES LABELS packaging SKIP_RETURN_CODE 77 TIMEOUT 300)
# An easyconfig that fails the style check must fail the test (the check can fail).
add_test(NAME packaging.easybuild_catches_bad_style COMMAND bash -c
  "d=$(mktemp -d) && mkdir -p $d/packaging/easybuild && sed 's/^name = /name  =  /' '${PROJECT_SOURCE_DIR}/packaging/easybuild/mgrl-0.1.0-foss-2023a.eb' > $d/packaging/easybuild/mgrl-0.1.0-foss-2023a.eb && bash '${CMAKE_CURRENT_SOURCE_DIR}/packaging/check_easybuild.sh' $d '$ENV{HOME}/.cache/mgrl/easybuild-venv'; rc=$?; rm -rf $d; [ $rc = 77 ] && exit 77; [ $rc != 0 ]")
set_tests_properties(packaging.easybuild_catches_bad_style PROPERTIES LABELS packaging SKIP_RETURN_CODE 77 TIMEOUT 300
                     DEPENDS packaging.easybuild)

# ---- cli: graceful stop without SLURM: SIGINT to a singleton (Ctrl-C), SIGUSR1 and SIGTERM to mpirun's ranks ----
set(STOP_ARGS ${SFT_ARGS} --runtime.threads=1 --checkpoint.resume=none)
add_test(NAME cli.stop.sigint_singleton COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/stop_resume.sh INT
         ${CMAKE_CURRENT_BINARY_DIR}/stop/int $<TARGET_FILE:check_train> -- $<TARGET_FILE:mgrl> ${STOP_ARGS})
# SIGUSR2 as SIGUSR1 (`sbatch --signal=USR2@300` users): it killed the run at once, no checkpoint, until 2026-11-28.
add_test(NAME cli.stop.sigusr2_singleton COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/stop_resume.sh USR2
         ${CMAKE_CURRENT_BINARY_DIR}/stop/usr2 $<TARGET_FILE:check_train> -- $<TARGET_FILE:mgrl> ${STOP_ARGS})
# SIGHUP as SIGTERM (an interactive run whose terminal or ssh session is gone): it killed the run at once until
# 2026-11-28.
add_test(NAME cli.stop.sighup_singleton COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/stop_resume.sh HUP
         ${CMAKE_CURRENT_BINARY_DIR}/stop/hup $<TARGET_FILE:check_train> -- $<TARGET_FILE:mgrl> ${STOP_ARGS})
add_test(NAME cli.stop.sigusr1_mpirun.np2 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/stop_resume.sh USR1
         ${CMAKE_CURRENT_BINARY_DIR}/stop/usr1 $<TARGET_FILE:check_train> -- ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2
         ${MGRL_MPIEXEC_FLAGS} $<TARGET_FILE:mgrl> ${STOP_ARGS})
set_tests_properties(cli.stop.sigint_singleton cli.stop.sigusr2_singleton cli.stop.sighup_singleton cli.stop.sigusr1_mpirun.np2 PROPERTIES LABELS cli TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "the same weights" ENVIRONMENT "${MGRL_MPI_ENV}")
set_tests_properties(cli.stop.sigusr1_mpirun.np2 PROPERTIES PROCESSORS 2)
# A stop signal at the edges of a run (tests/cli/stop_edges.sh): SIGTERM without checkpoint.dir says that nothing is
# saved (it claimed a checkpoint); SIGKILL during the final evaluation finds the final checkpoint written (it came
# after the evaluation). Each failed on the code of before 2026-11-28.
foreach(case no_checkpoint_dir final_eval during_setup)
  add_test(NAME cli.stop.${case} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/stop_edges.sh ${case}
           ${CMAKE_CURRENT_BINARY_DIR}/stop/${case} -- $<TARGET_FILE:mgrl> ${STOP_ARGS})
  set_tests_properties(cli.stop.${case} PROPERTIES LABELS cli TIMEOUT 120 PASS_REGULAR_EXPRESSION "PASS: ")
endforeach()
# Two runs in one checkpoint.dir at once: the second waits runtime.dir_lock_wait_s, then refuses naming the first;
# after the first has ended, a run there resumes (tests/cli/dir_lock.sh).
add_test(NAME cli.stop.dir_lock COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/dir_lock.sh ${CMAKE_CURRENT_BINARY_DIR}/stop/dir_lock
         -- $<TARGET_FILE:mgrl> ${STOP_ARGS})
set_tests_properties(cli.stop.dir_lock PROPERTIES LABELS "cli;mpi" TIMEOUT 120 PASS_REGULAR_EXPRESSION "PASS: "
                     PROCESSORS 2
                     ENVIRONMENT "${MGRL_MPI_ENV};MPIRUN=${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG};MPIFLAGS=${MPIEXEC_FLAGS_STR}")
# The example GRPO input of the batch scripts is a valid input.
mgrl_add_cli_test(grpo_gsm8k_input_is_valid 0 "^rank 0/1" - 0 -- $<TARGET_FILE:mgrl> info ${PROJECT_SOURCE_DIR}/inputs/grpo_gsm8k.toml
                  --runtime.backend=cpu)
