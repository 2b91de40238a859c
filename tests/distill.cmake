# distill.cmake: knowledge distillation (`mgrl distill`, trl's DistillationTrainer): the divergence against trl's own
# (unit.distill).
add_executable(test_distill unit/test_distill.cpp)
target_link_libraries(test_distill PRIVATE mgrl_train mgrl_model GTest::gtest_main mgrl_warnings)
target_compile_definitions(test_distill PRIVATE MGRL_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/data"
                                                MGRL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_test(NAME unit.distill COMMAND test_distill)
set_tests_properties(unit.distill PROPERTIES LABELS unit TIMEOUT 120)

# `mgrl distill` end to end (tests/cli/distill.sh): it trains (the divergence falls), trl's metrics, the held-out
# divergence; 1 and 2 ranks and grad_accum 2 the same weights; beta acts; resume exact, refused under another teacher.
set(DISTILL_ARGS distill --runtime.backend=cpu --model.path=${MODELS}/qwen2_bias_tied
    --model.tokenizer=${PROJECT_SOURCE_DIR}/inputs/quickstart --data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/sft/train.jsonl
    --eval.input=${CMAKE_CURRENT_SOURCE_DIR}/data/sft/heldout.jsonl
    --distill.teacher=${CMAKE_CURRENT_SOURCE_DIR}/data/distill/teachers/qwen2_wide --train.batch_size=4
    --train.max_steps=4 --train.lr=5e-3 --lora.r=4 --lora.alpha=8 --distill.max_prompt_length=16
    --distill.max_completion_length=8 --checkpoint.resume=none)
string(JOIN " " DISTILL_STR ${DISTILL_ARGS})
mgrl_add_cli_test(distill.end_to_end 0 "PASS: distill" - 0
  -- bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/distill.sh ${CMAKE_CURRENT_BINARY_DIR}/distill ${CHECK}
  ${MODELS}/qwen2_bias_tied ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${MGRL_MPIEXEC_FLAGS} -- ${RUN1} ${DISTILL_ARGS})
set_tests_properties(cli.distill.end_to_end PROPERTIES TIMEOUT 240 PROCESSORS 2)
mgrl_add_cli_test(distill.teacher_required 2 - "^mgrl: error: missing required key 'distill.teacher' for mode distill" 1
  -- ${RUN1} distill --runtime.backend=cpu --model.path=${MODELS}/qwen2_bias_tied
  --model.tokenizer=${PROJECT_SOURCE_DIR}/inputs/quickstart --data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/sft/train.jsonl)
mgrl_add_cli_test(distill.teacher_of_another_vocabulary 2 - "^mgrl: error: [^\\n]*llama_gqa/config.json: the teacher's vocab_size is 211, the student's 173" 1
  -- ${RUN1} ${DISTILL_ARGS} --distill.teacher=${MODELS}/llama_gqa)
mgrl_add_cli_test(distill.beta_out_of_range 2 - "^mgrl: error: [^\\n]*distill.beta" 1
  -- ${RUN1} ${DISTILL_ARGS} --distill.beta=1.5)
# model.shard_base: the student's base and the teacher sharded over the ranks (tests/cli/distill_shard_base.sh): bit for
# bit the unsharded run at 1, 2 and 4 ranks (3 held-out prompts: a rank without any), over an NF4 student, resumed.
mgrl_add_cli_test(distill.shard_base_equals_unsharded 0 "(?s)(shard[124] = plain[124]: weights bitwise, 9 metrics.*){3}acc2s = acc2.*keep4 = plain4.*q2s = q2: weights bitwise.*PASS: distill shard_base" - 0
  -- bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/distill_shard_base.sh ${CMAKE_CURRENT_BINARY_DIR}/distill_shard ${CHECK}
  ${CMAKE_CURRENT_SOURCE_DIR}/data/sft/heldout.jsonl ${CMAKE_CURRENT_SOURCE_DIR}/data/distill/teachers/qwen2_deep
  ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${MGRL_MPIEXEC_FLAGS}
  -- ${RUN1} ${DISTILL_ARGS})
set_tests_properties(cli.distill.shard_base_equals_unsharded PROPERTIES TIMEOUT 240 PROCESSORS 4)
# An NF4 teacher (tests/cli/distill_teacher_nf4.sh): bitsandbytes' 4-bit directories train what their bf16 source
# quantized at load (distill.teacher_quantize) trains, bit for bit (fp32 and double-quantized absmax); sharded on 2
# ranks the same; the dense teacher trains other weights; mgrl plan counts it.
mgrl_add_cli_test(distill.teacher_nf4 0 "(?s)bitsandbytes' directory = quantized at load.*double-quantized.*other weights.*sharded = unsharded.*PASS: distill NF4 teacher" - 0
  -- bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/distill_teacher_nf4.sh ${CMAKE_CURRENT_BINARY_DIR}/distill_nf4 ${CHECK}
  ${CMAKE_CURRENT_SOURCE_DIR}/data/nf4 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${MGRL_MPIEXEC_FLAGS}
  -- ${RUN1} ${DISTILL_ARGS})
set_tests_properties(cli.distill.teacher_nf4 PROPERTIES TIMEOUT 240 PROCESSORS 2)
# A teacher that does not fit beside the student (tests/cli/distill_teacher_beyond_memory.sh: its config.json alone)
mgrl_add_cli_test(distill.teacher_beyond_memory_refused 2 - "^mgrl: error: [^\\n]*distill_big_teacher/config.json: the teacher's [0-9.e+]+ parameters need [0-9.]+ GiB beside the student's [0-9.]+ GiB, more than the [0-9.]+ GiB of this machine \\(model.shard_base = true shards both over the ranks. distill.teacher_quantize = \"nf4\" stores its projections in 4 bits\\)" 1
  -- bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/distill_teacher_beyond_memory.sh ${CMAKE_CURRENT_BINARY_DIR}/distill_big_teacher
  -- ${RUN1} ${DISTILL_ARGS} --log.dir= --checkpoint.dir=)
# A teacher with fewer positions than prompt + completion (its config.json copied with max_position_embeddings 20)
mgrl_add_cli_test(distill.teacher_positions_refused 2 - "^mgrl: error: distill.max_prompt_length \\+ distill.max_completion_length \\(24\\) exceeds the teacher's max_position_embeddings \\(20" 1
  -- bash -c "mkdir -p ${CMAKE_CURRENT_BINARY_DIR}/distill_short && cp ${CMAKE_CURRENT_SOURCE_DIR}/data/distill/teachers/qwen2_wide/model.safetensors ${CMAKE_CURRENT_BINARY_DIR}/distill_short/ && sed 's/\"max_position_embeddings\": 64/\"max_position_embeddings\": 20/' ${CMAKE_CURRENT_SOURCE_DIR}/data/distill/teachers/qwen2_wide/config.json > ${CMAKE_CURRENT_BINARY_DIR}/distill_short/config.json && exec ${RUN1} ${DISTILL_STR} --distill.teacher=${CMAKE_CURRENT_BINARY_DIR}/distill_short")
# The same run on the GPU (label gpu; skipped without one): bf16 (fp16 before sm_80) student and teacher, the CUDA
# divergence kernel, generation on the device; it must finish with a finite loss every step and the held-out pass.
if(MGRL_WITH_CUDA)
  add_test(NAME gpu.distill_cuda COMMAND bash -c
    "rm -rf ${CMAKE_CURRENT_BINARY_DIR}/distill_cuda && mkdir -p ${CMAKE_CURRENT_BINARY_DIR}/distill_cuda && ${RUN1} ${DISTILL_STR} --runtime.backend=cuda --distill.beta=0.5 --log.dir=${CMAKE_CURRENT_BINARY_DIR}/distill_cuda > ${CMAKE_CURRENT_BINARY_DIR}/distill_cuda/out.log 2>&1; rc=$?; cat ${CMAKE_CURRENT_BINARY_DIR}/distill_cuda/out.log; if [ $rc = 2 ] && ! nvidia-smi -L >/dev/null 2>&1; then exit 77; fi; [ $rc = 0 ] || exit $rc; grep -q '^held-out loss [0-9]' ${CMAKE_CURRENT_BINARY_DIR}/distill_cuda/out.log && ${CHECK} field ${CMAKE_CURRENT_BINARY_DIR}/distill_cuda/metrics.jsonl loss | awk '{ if (NF != 6) exit 1; for (i = 3; i <= NF; ++i) if (!($i > 0 && $i < 100)) exit 1 }'")
  set_tests_properties(gpu.distill_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
