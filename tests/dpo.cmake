# dpo.cmake: `mgrl dpo`: the objective against the real trl (unit.dpo) and the binary end to end (cli.dpo.*).
add_executable(test_dpo unit/test_dpo.cpp)
target_link_libraries(test_dpo PRIVATE mgrl_train mgrl_model GTest::gtest_main mgrl_warnings)
target_compile_definitions(test_dpo PRIVATE MGRL_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/data"
                                            MGRL_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_test(NAME unit.dpo COMMAND test_dpo)
set_tests_properties(unit.dpo PROPERTIES LABELS unit TIMEOUT 120)

# The binary end to end (LoRA on the Qwen2 fixture with the quickstart tokenizer; 48 quickstart pairs in
# data/dpo_cli): the same weights on 1, 2 and 4 ranks; resume equals an uninterrupted run bit for bit, with the
# reference from the adapter switched off (LoRA) and from the starting weights computed before the resume (full
# fine-tuning); the exported adapter is PEFT's; a broken line is one error naming file and line.
set(DPO "${CMAKE_CURRENT_BINARY_DIR}/dpo")
set(DPO_ARGS dpo --runtime.backend=cpu --model.path=${MODELS}/qwen2_bias_tied --model.tokenizer=${PROJECT_SOURCE_DIR}/inputs/quickstart
    --data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/dpo_cli/train.jsonl --eval.input=${CMAKE_CURRENT_SOURCE_DIR}/data/dpo_cli/heldout.jsonl
    --train.batch_size=8 --train.lr=2e-3 --lora.r=4 --lora.alpha=8 --checkpoint.resume=none)
string(JOIN " " DPO_STR ${DPO_ARGS})
mgrl_add_cli_test(dpo.same_weights_on_1_2_4_ranks 0 "(?s)relative differences.*relative differences" - 0 -- bash -c
  "rm -rf ${DPO}/dp && ${RUN1} ${DPO_STR} --train.max_steps=4 --checkpoint.dir=${DPO}/dp/np1 && ${RUNN} 2 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} --train.max_steps=4 --checkpoint.dir=${DPO}/dp/np2 && ${RUNN} 4 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} --train.max_steps=4 --train.grad_accum=2 --checkpoint.dir=${DPO}/dp/np4 && ${CHECK} weights ${DPO}/dp/np2/step_00000004.h5 ${DPO}/dp/np1/step_00000004.h5 --rtol=1e-5 --moments && ${CHECK} weights ${DPO}/dp/np4/step_00000004.h5 ${DPO}/dp/np1/step_00000004.h5 --rtol=1e-5 --moments")
set_tests_properties(cli.dpo.same_weights_on_1_2_4_ranks PROPERTIES TIMEOUT 120)
# LoRA dropout (with dpo.disable_dropout = false): the same weights on 1 and 2 ranks and with grad_accum (masks by a sequence's slot in the step, the
# chosen and rejected of a pair told apart); and the dropout acts.
mgrl_add_cli_test(dpo.dropout_same_weights_on_1_2_ranks_and_accum 0 "(?s)relative differences.*relative differences.*dropout acts" - 0 -- bash -c
  "rm -rf ${DPO}/dpdrop && ${RUN1} ${DPO_STR} --train.max_steps=3 --lora.dropout=0.2 --dpo.disable_dropout=false --checkpoint.dir=${DPO}/dpdrop/np1 && ${RUNN} 2 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} --train.max_steps=3 --lora.dropout=0.2 --dpo.disable_dropout=false --checkpoint.dir=${DPO}/dpdrop/np2 && ${RUN1} ${DPO_STR} --train.max_steps=3 --lora.dropout=0.2 --dpo.disable_dropout=false --train.grad_accum=4 --checkpoint.dir=${DPO}/dpdrop/acc4 && ${RUN1} ${DPO_STR} --train.max_steps=3 --checkpoint.dir=${DPO}/dpdrop/none && ${CHECK} weights ${DPO}/dpdrop/np2/step_00000003.h5 ${DPO}/dpdrop/np1/step_00000003.h5 --rtol=1e-5 && ${CHECK} weights ${DPO}/dpdrop/acc4/step_00000003.h5 ${DPO}/dpdrop/np1/step_00000003.h5 --rtol=1e-5 && ! ${CHECK} weights ${DPO}/dpdrop/none/step_00000003.h5 ${DPO}/dpdrop/np1/step_00000003.h5 --rtol=1e-3 && echo dropout acts")
set_tests_properties(cli.dpo.dropout_same_weights_on_1_2_ranks_and_accum PROPERTIES TIMEOUT 120 PROCESSORS 2)
# dpo.loss_mix (trl's loss_type list with loss_weights; the math against trl: unit.dpo mpo_initial and
# mix_aot_robust_base): a mix of sigmoid alone trains bitwise the weights of dpo.loss_type = sigmoid, and
# sigmoid + sft:0.5 those of dpo.sft_weight = 0.5; MPO's mix runs and trains other weights; beside dpo.loss_type it
# is refused, and so is an item that is not a loss type.
mgrl_add_cli_test(dpo.loss_mix_as_the_single_keys 0 "(?s)relative differences.*relative differences.*mpo differs" - 0 -- bash -c
  "rm -rf ${DPO}/mix && ${RUN1} ${DPO_STR} --train.max_steps=2 --checkpoint.dir=${DPO}/mix/plain > /dev/null && ${RUN1} ${DPO_STR} --train.max_steps=2 --dpo.loss_mix=sigmoid --checkpoint.dir=${DPO}/mix/mix1 > /dev/null && ${CHECK} weights ${DPO}/mix/mix1/step_00000002.h5 ${DPO}/mix/plain/step_00000002.h5 --rtol=0 && ${RUN1} ${DPO_STR} --train.max_steps=2 --dpo.sft_weight=0.5 --checkpoint.dir=${DPO}/mix/sft > /dev/null && ${RUN1} ${DPO_STR} --train.max_steps=2 --dpo.loss_mix=sigmoid:1,sft:0.5 --checkpoint.dir=${DPO}/mix/mixsft > /dev/null && ${CHECK} weights ${DPO}/mix/mixsft/step_00000002.h5 ${DPO}/mix/sft/step_00000002.h5 --rtol=0 && ${RUN1} ${DPO_STR} --train.max_steps=2 --dpo.loss_mix=sigmoid:0.8,bco_pair:0.2,sft:1 --checkpoint.dir=${DPO}/mix/mpo > /dev/null && ! ${CHECK} weights ${DPO}/mix/mpo/step_00000002.h5 ${DPO}/mix/plain/step_00000002.h5 --rtol=1e-4 > /dev/null && echo mpo differs")
mgrl_add_cli_test(dpo.loss_mix_beside_loss_type_refused 2 - "^mgrl: error: keys 'dpo.loss_mix' and 'dpo.loss_type' are both given" 1
  -- ${RUN1} ${DPO_ARGS} --dpo.loss_type=hinge --dpo.loss_mix=sigmoid:0.5,hinge:0.5)
mgrl_add_cli_test(dpo.loss_mix_unknown_type_refused 2 - "^mgrl: error: key 'dpo.loss_mix': \"sigmod\" is not a loss type" 1
  -- ${RUN1} ${DPO_ARGS} --dpo.loss_mix=sigmod:0.5,hinge:0.5)
# trl's DPO turns every dropout off (disable_dropout = True, its default): a given lora.dropout is said and not applied
# (the weights are those of no dropout, bitwise), and the exported adapter_config.json keeps it, as trl's does.
mgrl_add_cli_test(dpo.dropout_off_by_default_as_trl 0 "(?s)relative differences.*lora_dropout 0.2" "^mgrl: warning: LoRA dropout 0.2 \\(lora.dropout\\) is not applied: dpo.disable_dropout = true \\(trl's default\\) turns dropout off in DPO" 1 -- bash -c
  "rm -rf ${DPO}/nodrop && ${RUN1} ${DPO_STR} --train.max_steps=2 --lora.dropout=0.2 --checkpoint.dir=${DPO}/nodrop/d > /dev/null && ${RUN1} ${DPO_STR} --train.max_steps=2 --checkpoint.dir=${DPO}/nodrop/none > /dev/null 2>&1 && ${CHECK} weights ${DPO}/nodrop/d/step_00000002.h5 ${DPO}/nodrop/none/step_00000002.h5 --rtol=0 && ${RUN1} export --checkpoint.dir=${DPO}/nodrop/d --export.output=${DPO}/nodrop/out > /dev/null 2>&1 && python3 -c \"print('lora_dropout', __import__('json').load(open('${DPO}/nodrop/out/adapter_config.json'))['lora_dropout'])\"")
# DPO on a sharded base (model.shard_base): LoRA weights, moments, training and held-out losses equal the unsharded
# run's on 1, 2 (reference log-probs precomputed) and 4 ranks (recompute); 13 held-out pairs in batches of 3 give
# the ranks unequal numbers of passes, evened out with one-token passes.
mgrl_add_cli_test(dpo.shard_base_equals_unsharded_on_1_2_4_ranks 0 "(?s)(base [0-9.]+ MiB/rank.*bitwise equal: yes.*0 differ.*0 differ.*){3}" - 0 -- bash -c
  "rm -rf ${DPO}/shard && mkdir -p ${DPO}/shard && head -n 13 ${CMAKE_CURRENT_SOURCE_DIR}/data/dpo_cli/heldout.jsonl > ${DPO}/shard/eval13.jsonl && ${RUN1} ${DPO_STR} --train.max_steps=4 --eval.input=${DPO}/shard/eval13.jsonl --eval.batch_size=3 --eval.every_steps=2  --checkpoint.dir=${DPO}/shard/np1/plain --log.dir=${DPO}/shard/np1/plain && ${RUN1} ${DPO_STR} --train.max_steps=4 --eval.input=${DPO}/shard/eval13.jsonl --eval.batch_size=3 --eval.every_steps=2  --model.shard_base=true --checkpoint.dir=${DPO}/shard/np1/shard --log.dir=${DPO}/shard/np1/shard && ${CHECK} weights ${DPO}/shard/np1/plain/step_00000004.h5 ${DPO}/shard/np1/shard/step_00000004.h5 --exact && ${CHECK} losses ${DPO}/shard/np1/plain/metrics.jsonl ${DPO}/shard/np1/shard/metrics.jsonl && ${CHECK} losses ${DPO}/shard/np1/plain/metrics.jsonl ${DPO}/shard/np1/shard/metrics.jsonl --key=eval_loss && ${RUNN} 2 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} --train.max_steps=4 --eval.input=${DPO}/shard/eval13.jsonl --eval.batch_size=3 --eval.every_steps=2 --dpo.precompute_ref_log_probs=true --checkpoint.dir=${DPO}/shard/np2/plain --log.dir=${DPO}/shard/np2/plain && ${RUNN} 2 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} --train.max_steps=4 --eval.input=${DPO}/shard/eval13.jsonl --eval.batch_size=3 --eval.every_steps=2 --dpo.precompute_ref_log_probs=true --model.shard_base=true --checkpoint.dir=${DPO}/shard/np2/shard --log.dir=${DPO}/shard/np2/shard && ${CHECK} weights ${DPO}/shard/np2/plain/step_00000004.h5 ${DPO}/shard/np2/shard/step_00000004.h5 --exact && ${CHECK} losses ${DPO}/shard/np2/plain/metrics.jsonl ${DPO}/shard/np2/shard/metrics.jsonl && ${CHECK} losses ${DPO}/shard/np2/plain/metrics.jsonl ${DPO}/shard/np2/shard/metrics.jsonl --key=eval_loss && ${RUNN} 4 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} --train.max_steps=4 --eval.input=${DPO}/shard/eval13.jsonl --eval.batch_size=3 --eval.every_steps=2 --model.recompute=true --checkpoint.dir=${DPO}/shard/np4/plain --log.dir=${DPO}/shard/np4/plain && ${RUNN} 4 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} --train.max_steps=4 --eval.input=${DPO}/shard/eval13.jsonl --eval.batch_size=3 --eval.every_steps=2 --model.recompute=true --model.shard_base=true --checkpoint.dir=${DPO}/shard/np4/shard --log.dir=${DPO}/shard/np4/shard && ${CHECK} weights ${DPO}/shard/np4/plain/step_00000004.h5 ${DPO}/shard/np4/shard/step_00000004.h5 --exact && ${CHECK} losses ${DPO}/shard/np4/plain/metrics.jsonl ${DPO}/shard/np4/shard/metrics.jsonl && ${CHECK} losses ${DPO}/shard/np4/plain/metrics.jsonl ${DPO}/shard/np4/shard/metrics.jsonl --key=eval_loss")
set_tests_properties(cli.dpo.shard_base_equals_unsharded_on_1_2_4_ranks PROPERTIES TIMEOUT 120 PROCESSORS 4)
# eval.accuracy on a sharded base with more ranks than held-out pairs: the rank without a prompt still steps with the
# generating one (each step gathers the layers). Until 2026-11-28 DPO's accuracy skipped it, the ranks' collectives
# no longer matched, and the job ended at runtime.comm_timeout_s (20 s here) with exit 1.
mgrl_add_cli_test(dpo.shard_base_accuracy_with_a_rank_without_prompts 0 "(?s)eval before step 0 \\| held-out accuracy [0-9.]+%.*held-out step 2 \\| held-out accuracy [0-9.]+%" - 0 -- bash -c
  "rm -rf ${DPO}/shard_acc && mkdir -p ${DPO}/shard_acc && head -n 1 ${CMAKE_CURRENT_SOURCE_DIR}/data/dpo_cli/heldout.jsonl > ${DPO}/shard_acc/eval1.jsonl && ${RUNN} 2 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} --model.num_layers=5 --model.init=random --train.max_steps=2 --eval.input=${DPO}/shard_acc/eval1.jsonl --eval.accuracy=true --eval.max_new_tokens=8 --model.shard_base=true --runtime.comm_timeout_s=20 --checkpoint.dir= --log.dir=${DPO}/shard_acc")
set_tests_properties(cli.dpo.shard_base_accuracy_with_a_rank_without_prompts PROPERTIES TIMEOUT 60 PROCESSORS 2)
mgrl_add_cli_test(dpo.eval_generation_too_long_refused_at_start 2 - "^mgrl: error: key 'eval.max_new_tokens' = 122: the longest held-out prompt of .*heldout.jsonl has [0-9]+ prompt tokens, and with eval.max_new_tokens that exceeds the model's max_position_embeddings \\(128\\)" 1 -- bash -c
  "rm -rf ${DPO}/evfit && ${RUNN} 2 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} --train.max_steps=3 --checkpoint.every_steps=2 --eval.accuracy=true --eval.max_new_tokens=122 --checkpoint.dir=${DPO}/evfit/ck --log.dir=${DPO}/evfit; rc=$?; test ! -e ${DPO}/evfit/ck/step_00000002.h5 || exit 9; exit $rc")
foreach(kind lora full)
  if(kind STREQUAL "full")
    set(extra "--train.full_finetune=true --train.lr=1e-3")
  else()
    set(extra "--dpo.loss_type=ipo")
  endif()
  mgrl_add_cli_test(dpo.resume_is_exact_${kind} 0 "bitwise equal: yes" - - -- bash -c
    "rm -rf ${DPO}/resume_${kind} && ${RUNN} 2 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} ${extra} --train.max_steps=6 --checkpoint.dir=${DPO}/resume_${kind}/a --log.dir=${DPO}/resume_${kind}/a && ${RUNN} 2 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} ${extra} --train.max_steps=6 --train.stop_at_step=3 --checkpoint.dir=${DPO}/resume_${kind}/b --log.dir=${DPO}/resume_${kind}/b && ${RUNN} 2 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} ${extra} --train.max_steps=6 --checkpoint.dir=${DPO}/resume_${kind}/b --log.dir=${DPO}/resume_${kind}/b --checkpoint.resume=auto && ${CHECK} weights ${DPO}/resume_${kind}/a/step_00000006.h5 ${DPO}/resume_${kind}/b/step_00000006.h5 --exact && ${CHECK} losses ${DPO}/resume_${kind}/a/metrics.jsonl ${DPO}/resume_${kind}/b/metrics.jsonl --after=3")
  set_tests_properties(cli.dpo.resume_is_exact_${kind} PROPERTIES TIMEOUT 120)
endforeach()
# The step line, trl's metric names in metrics.jsonl, the held-out preference accuracy, and the checkpoint exported
# as a PEFT adapter that `mgrl score` loads.
mgrl_add_cli_test(dpo.metrics_eval_and_export 0
  "(?s)^dpo: pretrained Qwen2ForCausalLM, 48 training pairs, 16 held-out, LoRA on 1 rank, loss sigmoid, beta 0[.]1, reference the adapter switched off.*step 3/3 [|] loss [0-9.]+ [|] accuracy [0-9.]+ [|] margin -?[0-9.]+ [|] lr .*held-out step 3 [|] loss [0-9.]+ [|] preference accuracy [0-9.]+% [|] margin.*rewards/accuracies.*rewards/chosen.*rewards/margins.*rewards/rejected.*eval_rewards/accuracies.*adapter_model.safetensors" - 0 -- bash -c
  "rm -rf ${DPO}/metrics && ${RUN1} ${DPO_STR} --train.max_steps=3 --log.dir=${DPO}/metrics --checkpoint.dir=${DPO}/metrics/ck && head -c 100000 ${DPO}/metrics/metrics.jsonl && ${RUN1} export --checkpoint.dir=${DPO}/metrics/ck --export.output=${DPO}/metrics/adapter && ${RUN1} score --runtime.backend=cpu --model.path=${MODELS}/qwen2_bias_tied --lora.adapter=${DPO}/metrics/adapter --data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/score/qwen2_bias_tied.jsonl --score.output=${DPO}/metrics/s.h5 > /dev/null && ls ${DPO}/metrics/adapter")
mgrl_add_cli_test(dpo.broken_line 2 - "bad.jsonl:2: expected \\{\"prompt\", \"chosen\", \"rejected\"\\}: no \"rejected\"" 1
  -- ${MPIRUN} 2 ${MGRL_MPIEXEC_FLAGS} $<TARGET_FILE:mgrl> ${DPO_ARGS} --data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/dpo_cli/bad.jsonl --train.max_steps=1)
mgrl_add_cli_test(dpo.batch_must_divide 2 - "train.batch_size \\(6 pairs\\) must be divisible by the number of ranks \\(4\\)" 1
  -- ${MPIRUN} 4 ${MGRL_MPIEXEC_FLAGS} $<TARGET_FILE:mgrl> ${DPO_ARGS} --train.batch_size=6 --train.max_steps=1)
# DPO learns: the quickstart's tiny Llama from random weights, full fine-tuning on the 2000 quickstart pairs (reference:
# the random starting model, scored once), 300 steps of 32 pairs: the held-out preference accuracy rises from 0 (the
# policy is the reference) to >= 60%, and the policy's own preference for the right sum over the wrong one from
# below 50% to >= 55%. One thread (the same sums on any machine); about 6 s of CPU time.
mgrl_add_cli_test(dpo.preference_accuracy_rises 0
  "(?s)eval before step 0 [|] loss 0[.]6931 [|] preference accuracy 0[.]0% [|] margin 0[.]0000 [|] chosen more likely [0-4][0-9][.][0-9]%.*held-out step 300 [|] loss 0[.][0-5][0-9]* [|] preference accuracy (6[0-9]|[7-9][0-9])[.][0-9]% [|] margin [0-9.]+ [|] chosen more likely (5[5-9]|[6-9][0-9])[.][0-9]%" - 0
  -- ${RUN1} dpo --runtime.backend=cpu --runtime.threads=1 --model.path=${PROJECT_SOURCE_DIR}/inputs/quickstart --model.init=random --model.init_std=0.05
     --data.input=${PROJECT_SOURCE_DIR}/inputs/quickstart/dpo_train.jsonl --eval.input=${PROJECT_SOURCE_DIR}/inputs/quickstart/dpo_heldout.jsonl
     --train.full_finetune=true --train.batch_size=32 --train.max_steps=300 --train.lr=3e-3 --train.schedule=cosine
     --train.warmup_steps=10 --dpo.beta=0.1 --log.every_steps=100 --eval.every_steps=100 --checkpoint.resume=none)
set_tests_properties(cli.dpo.preference_accuracy_rises PROPERTIES TIMEOUT 180)
# Dynamic loss scaling (what fp16 storage uses; forced on the f32 CPU backend): the backward's per-token weights carry
# the scale and the update divides it out, so 4 steps train bit for bit the weights and moments of 4 steps without it.
mgrl_add_cli_test(dpo.loss_scaling_changes_nothing_in_f32 0 "(?s)step 4/4 [^\\n]*[|] scale 65536.*bitwise equal: yes" - - -- bash -c
  "rm -rf ${DPO}/scaling && ${RUN1} ${DPO_STR} --train.max_steps=4 --checkpoint.dir=${DPO}/scaling/a > /dev/null && ${RUN1} ${DPO_STR} --train.max_steps=4 --train.loss_scaling=dynamic --checkpoint.dir=${DPO}/scaling/b && ${CHECK} weights ${DPO}/scaling/a/step_00000004.h5 ${DPO}/scaling/b/step_00000004.h5 --exact")
# Resuming over other base weights: refused, or with checkpoint.allow_other_base a warning (as grpo.resume_other_base).
mgrl_add_cli_test(dpo.resume_other_base 0 "other base: ok" - -
  -- bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/other_base.sh ${DPO}/other_base $<TARGET_FILE:robust_tool>
  model.layers.0.self_attn.k_proj.weight 1 2 -- $<TARGET_FILE:mgrl> ${DPO_ARGS})
# log.every_steps = N: the line's and the record's loss and metrics are those of the window's pairs (its last step's
# until 2026-11-28).
mgrl_add_cli_test(dpo.log_window_mean_loss 0 "window means: equal \\(2 records\\)" - 0 -- bash -c
  "rm -rf ${DPO}/window && $<TARGET_FILE:mgrl> ${DPO_STR} --eval.input= --train.max_steps=4 --log.dir=${DPO}/window/a > /dev/null && $<TARGET_FILE:mgrl> ${DPO_STR} --eval.input= --train.max_steps=4 --log.every_steps=2 --log.dir=${DPO}/window/b > /dev/null && python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/log_window.py ${DPO}/window/a/metrics.jsonl ${DPO}/window/b/metrics.jsonl loss")
# Pairs that teach nothing, counted at the start (silent until 2026-11-28): chosen = rejected as read (line 2), and
# a pair that differs only after dpo.max_length (line 3: cut at 12 tokens, both sides are the same). Every pair so:
# refused (robust.dpo_every_pair_same). The notes come once the start-up checks have passed.
mgrl_add_cli_test(dpo.pairs_that_teach_nothing_said 0 "step 1/1 "
  "(?s)\\A(?=.*^mgrl: warning: [^\\n]*/teach.jsonl: 1 pair has the same chosen and rejected tokens: the loss's gradient is 0 for them, they teach nothing \\(the first at line 2\\)$)(?=.*^mgrl: warning: [^\\n]*/teach.jsonl: 1 pair differs only after dpo.max_length \\(12\\) tokens: cut there, chosen and rejected are the same and teach nothing\\x3b raise dpo.max_length \\(the first at line 3\\)$)" 2
  -- bash -c "mkdir -p ${DPO} && printf '%s\\n' '{\"prompt\": \"915+4=\", \"chosen\": \"919\", \"rejected\": \"619\"}' '{\"prompt\": \"2+2=\", \"chosen\": \"4\", \"rejected\": \"4\"}' '{\"prompt\": \"2+3=\", \"chosen\": \"5555555555\", \"rejected\": \"5555555556\"}' > ${DPO}/teach.jsonl && ${RUN1} ${DPO_STR} --data.input=${DPO}/teach.jsonl --eval.input= --train.batch_size=2 --train.max_steps=1 --dpo.max_length=12")
# The checkpoints' best held-out loss: the least of the evaluations at steps 2 and 4, in the step-6 checkpoint (the
# final evaluation comes after it). DPO's stayed inf until 2026-11-28.
mgrl_add_cli_test(dpo.best_eval_loss_kept 0 "best_eval_loss ok: [0-9.]+" - 0 -- bash -c
  "rm -rf ${DPO}/best && ${RUN1} ${DPO_STR} --train.max_steps=6 --eval.every_steps=2 --checkpoint.dir=${DPO}/best --log.dir=${DPO}/best > /dev/null && python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/best_eval_loss.py ${DPO}/best/metrics.jsonl ${DPO}/best/step_00000006.h5 2 4")

# `mgrl kto` (trl's KTOTrainer in DPO's trainer; the objective: unit.dpo KtoTrlCase): trains with trl's metrics, the
# same on 1 and 2 ranks, pairs unpaired, resume exact (tests/cli/kto.sh); its errors in one line.
set(KTO_ARGS kto --runtime.backend=cpu --model.path=${MODELS}/qwen2_bias_tied --model.tokenizer=${PROJECT_SOURCE_DIR}/inputs/quickstart
    --data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/kto_cli/train.jsonl --eval.input=${CMAKE_CURRENT_SOURCE_DIR}/data/dpo_cli/heldout.jsonl
    --train.batch_size=8 --train.lr=2e-3 --lora.r=4 --lora.alpha=8 --checkpoint.resume=none --train.max_steps=4)
mgrl_add_cli_test(kto.end_to_end 0 "PASS: kto" - 0
  -- bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/kto.sh ${CMAKE_CURRENT_BINARY_DIR}/kto ${CHECK}
  ${CMAKE_CURRENT_SOURCE_DIR}/data/dpo_cli/train.jsonl ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${MGRL_MPIEXEC_FLAGS}
  -- ${RUN1} ${KTO_ARGS})
set_tests_properties(cli.kto.end_to_end PROPERTIES TIMEOUT 240 PROCESSORS 2)
# TR-DPO (sync_ref_model) in dpo, kto and grpo: against trl's DPOTrainer (tests/data/trdpo: losses, weights and the
# synced reference), resumes across a sync exact, the resumes that would change the reference refused, LoRA, KTO and
# GRPO (tests/cli/trdpo.sh).
mgrl_add_cli_test(dpo.sync_ref_model 0 "(?s)plain: every step's loss within 2e-6.*sync: every step's loss within 2e-6.*trl: the same losses.*resume across a sync.*2 ranks.*resume_without_sync: refused.*resume_with_sync: refused.*precompute: refused.*LoRA: the run without.*lora_at_tau: refused.*LoRA: resumed with the sync.*kto: the sync acts.*grpo: the sync acts.*grpo: a sync inside a generation round.*grpo_beta0: refused.*PASS: trdpo" - 0
  -- bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/trdpo.sh ${DPO}/trdpo ${CHECK} ${CMAKE_CURRENT_SOURCE_DIR}/data/trdpo
  ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${MGRL_MPIEXEC_FLAGS} -- ${RUN1} ${DPO_ARGS} -- ${KTO_ARGS}
  -- ${GRPO_ARGS})
set_tests_properties(cli.dpo.sync_ref_model PROPERTIES TIMEOUT 240 PROCESSORS 2)
# The same on the GPU (label gpu; skipped without one): full fine-tuning with fp32 master weights, the mix on the
# master copy, a resume across a sync (tests/cli/gpu_dpo_sync.sh).
if(MGRL_WITH_CUDA)
  add_test(NAME gpu.dpo_sync_ref_cuda COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/gpu_dpo_sync.sh ${DPO}/gpu_sync
           ${CHECK} -- ${RUN1} ${DPO_ARGS})
  set_tests_properties(gpu.dpo_sync_ref_cuda PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 180)
endif()
# KTO on a sharded base (model.shard_base; 5 random layers, more than the two gathered at a time): 2 and 4 ranks
# train and evaluate (13 held-out pairs in batches of 3, every 2 steps) what the unsharded runs do, bit for bit
# (tests/cli/kto_shard_base.sh).
mgrl_add_cli_test(kto.shard_base_equals_unsharded_on_2_4_ranks 0 "(?s)2 ranks: sharded = unsharded.*4 ranks: sharded = unsharded.*PASS" - 0
  -- bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/kto_shard_base.sh ${DPO}/kto_shard ${CHECK}
  ${CMAKE_CURRENT_SOURCE_DIR}/data/dpo_cli/heldout.jsonl ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${MGRL_MPIEXEC_FLAGS}
  -- ${RUN1} ${KTO_ARGS})
set_tests_properties(cli.kto.shard_base_equals_unsharded_on_2_4_ranks PROPERTIES TIMEOUT 120 PROCESSORS 4)
mgrl_add_cli_test(kto.micro_batch_of_one_refused 2 - "^mgrl: error: mgrl kto needs train.batch_size / train.grad_accum >= 2 \\(got 1\\)" 1
  -- ${RUN1} ${KTO_ARGS} --train.batch_size=2 --train.grad_accum=2)
mgrl_add_cli_test(kto.broken_label_names_line 2 - "^mgrl: error: [^\\n]*bad.jsonl:2: expected \\{\"prompt\", \"chosen\", \"rejected\"\\}: no \"rejected\"" 1
  -- ${RUN1} ${KTO_ARGS} --data.input=${CMAKE_CURRENT_SOURCE_DIR}/data/dpo_cli/bad.jsonl)
mgrl_add_cli_test(kto.eval_accuracy_refused 2 - "^mgrl: error: key 'eval.accuracy' is not available in mgrl kto" 1
  -- ${RUN1} ${KTO_ARGS} --eval.accuracy=true)
# dpo.use_weighting (WPO; the math against trl: unit.dpo sigmoid_wpo_initial, mix_wpo_truncated_base): the weights
# act (other weights than without, a held-out loss below the unweighted one's: every weight is below 1), the same on
# 1 and 2 ranks; with aot or an sft term it is refused in one line.
mgrl_add_cli_test(dpo.use_weighting_acts_same_on_1_2_ranks 0 "(?s)WPO-weighted.*relative differences.*wpo differs.*held-out loss lower" - 0 -- bash -c
  "rm -rf ${DPO}/wpo && ${RUN1} ${DPO_STR} --train.max_steps=2 --checkpoint.dir=${DPO}/wpo/plain > ${DPO}/wpo.plain.log && ${RUN1} ${DPO_STR} --train.max_steps=2 --dpo.use_weighting=true --checkpoint.dir=${DPO}/wpo/w1 | tee ${DPO}/wpo.w1.log | grep '^dpo:' && ${RUNN} 2 ${MPIEXEC_FLAGS_STR} ${RUN1} ${DPO_STR} --train.max_steps=2 --dpo.use_weighting=true --checkpoint.dir=${DPO}/wpo/w2 > /dev/null && ${CHECK} weights ${DPO}/wpo/w2/step_00000002.h5 ${DPO}/wpo/w1/step_00000002.h5 --rtol=1e-5 --moments && ! ${CHECK} weights ${DPO}/wpo/plain/step_00000002.h5 ${DPO}/wpo/w1/step_00000002.h5 --rtol=1e-3 > /dev/null && echo wpo differs && a=$(sed -n 's/^eval before step 0 | loss \\([0-9.]*\\).*/\\1/p' ${DPO}/wpo.plain.log) && b=$(sed -n 's/^eval before step 0 | loss \\([0-9.]*\\).*/\\1/p' ${DPO}/wpo.w1.log) && echo \"$a $b\" && awk -v a=$a -v b=$b 'BEGIN { exit !(b < a && b > 0) }' && echo held-out loss lower")
set_tests_properties(cli.dpo.use_weighting_acts_same_on_1_2_ranks PROPERTIES TIMEOUT 120 PROCESSORS 2)
mgrl_add_cli_test(dpo.use_weighting_with_aot_refused 2 - "^mgrl: error: key 'dpo.use_weighting' does not apply to the aot losses" 1
  -- ${RUN1} ${DPO_ARGS} --dpo.loss_type=aot --dpo.use_weighting=true)
mgrl_add_cli_test(dpo.use_weighting_with_sft_refused 2 - "^mgrl: error: key 'dpo.use_weighting' with an sft term" 1
  -- ${RUN1} ${DPO_ARGS} --dpo.sft_weight=0.5 --dpo.use_weighting=true)
# A resume keeps its run's reference policy: KTO, DPO and GRPO started from an adapter refuse a resume without it or
# with another (one line, exit 2, on 1 and 2 ranks, the checkpoints untouched), resume with its copy elsewhere to the
# straight run's weights; GRPO without a reference (beta 0) resumes without it (tests/cli/reference_resume.sh).
mgrl_add_cli_test(resume.keeps_the_reference_policy 0 "PASS: reference_resume" - 0
  -- bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/reference_resume.sh ${CMAKE_CURRENT_BINARY_DIR}/reference_resume ${CHECK}
  ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${MGRL_MPIEXEC_FLAGS} -- ${RUN1} ${KTO_ARGS} -- ${DPO_ARGS} -- ${GRPO_ARGS})
set_tests_properties(cli.resume.keeps_the_reference_policy PROPERTIES TIMEOUT 240 PROCESSORS 2)
