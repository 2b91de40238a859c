# tests/families.cmake: the Gemma 2, Gemma 3 (text) and Mistral fixture models (tests/data/models, transformers +
# PEFT) through the whole program (included by tests/CMakeLists.txt): a short SFT run whose loss falls, the exported
# adapter and merged model scoring the same, and a GRPO run of 4 steps with finite weights.
set(FAMILIES "${CMAKE_CURRENT_BINARY_DIR}/families")
foreach(model gemma2_softcap gemma3_text mistral_window)
  set(dir "${FAMILIES}/${model}")
  set(sft_args "sft --runtime.backend=cpu --model.path=${MODELS}/${model} --model.tokenizer=${PROJECT_SOURCE_DIR}/inputs/quickstart --data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/sft/train.jsonl --eval.input=${CMAKE_CURRENT_SOURCE_DIR}/data/sft/heldout.jsonl --train.batch_size=8 --train.lr=1e-2 --lora.r=4 --lora.alpha=8 --checkpoint.resume=none --train.max_steps=30")
  set(score_in "--data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/score/${model}.jsonl")
  mgrl_add_cli_test(families.${model}.sft_export 0 "(?s)check_train: loss [0-9.]+ at step 1 -> [0-9.]+ at step 30.*log-probs relative difference" - -
    -- bash -c "rm -rf ${dir}/sft && mkdir -p ${dir}/sft && ${RUN1} ${sft_args} --log.dir=${dir}/sft --checkpoint.dir=${dir}/sft/ck > /dev/null && ${CHECK} falls ${dir}/sft/metrics.jsonl --factor=0.8 && ${RUN1} export --checkpoint.dir=${dir}/sft/ck --export.output=${dir}/sft/adapter --export.merged=true > /dev/null && ${RUN1} score --runtime.backend=cpu --model.path=${MODELS}/${model} --lora.adapter=${dir}/sft/adapter ${score_in} --score.output=${dir}/sft/a.h5 > /dev/null && ${RUN1} score --runtime.backend=cpu --model.path=${dir}/sft/adapter/merged ${score_in} --score.output=${dir}/sft/m.h5 > /dev/null && ${CHECK} scores ${dir}/sft/a.h5 ${dir}/sft/m.h5 --rtol=1e-5")
  mgrl_add_cli_test(families.${model}.grpo 0 "check_train: step 4, 0 skipped steps, 0 non-finite values" - -
    -- bash -c "rm -rf ${dir}/grpo && ${RUN1} ${CMAKE_CURRENT_SOURCE_DIR}/data/grpo_cli/grpo.toml --model.path=${MODELS}/${model} --model.tokenizer=${PROJECT_SOURCE_DIR}/inputs/quickstart --data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/sft/train.jsonl --checkpoint.dir=${dir}/grpo/ck --log.dir=${dir}/grpo > /dev/null && ${CHECK} finite ${dir}/grpo/ck/step_00000004.h5")
endforeach()
# Gemma 3's vision-language checkpoint (Gemma3ForConditionalGeneration) trained text only, in the Hub's layout: SFT,
# the adapter with the language model's PEFT names and a target_modules sparing the vision tower, the merged and the
# fully fine-tuned exports with the base's tensor names and its vision tower byte for byte (tests/cli/vlm.sh).
mgrl_add_cli_test(families.gemma3_vlm_hub.sft_export 0 "PASS: vision-language checkpoint" - 0
  -- bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/vlm.sh ${FAMILIES}/gemma3_vlm_hub $<TARGET_FILE:mgrl> ${CHECK} ${MODELS}
  ${CMAKE_CURRENT_SOURCE_DIR}/data ${PROJECT_SOURCE_DIR}/inputs/quickstart)
