# tests/qlora_shard.cmake: model.shard_base over an NF4 (QLoRA) base (included by tests/CMakeLists.txt): the sharded
# run equals the unsharded one bit for bit at 1, 2 and 4 ranks in sft, grpo, dpo, generate and score
# (tests/cli/qlora_shard.sh says which cases), and a rank holds and gathers NF4 bytes as `mgrl plan` counts them.
foreach(m sft grpo dpo generate score)
  add_test(NAME cli.${m}.qlora_shard_base_equals_unsharded
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/qlora_shard.sh ${m} $<TARGET_FILE:mgrl>
                   $<TARGET_FILE:check_train> ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/qlora_shard/${m})
  set_tests_properties(cli.${m}.qlora_shard_base_equals_unsharded PROPERTIES LABELS cli TIMEOUT 180
                       PROCESSORS 4
                       ENVIRONMENT "${MGRL_MPI_ENV};MPIRUN=${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG};MPIFLAGS=${MPIEXEC_FLAGS_STR}")
endforeach()
