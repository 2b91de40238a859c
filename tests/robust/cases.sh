# cases.sh: the catalogue of bad inputs (label robust). One case a line:
#   c NAME RANKS 'REGEX the one error line must match (the culprit: file and line, key or tensor)' 'SETUP (bash)' ARGS...
# run by tests/robust/robust.sh in a fresh directory holding: model/ (the Qwen2 fixture, with a PEFT adapter),
# tok/ (tokenizer.json), train.jsonl, heldout.jsonl, tokens.jsonl, prompts.jsonl, grpo.toml, run.toml, ck/ (the
# checkpoints of steps 1 and 2 of a real run), old_output.h5 and old_output.jsonl (earlier outputs). $SFT, $GRPO,
# $PPO, $SCORE, $GEN and $RESUME are good command lines; T runs tests/robust/robust_tool. Every case must end with exit
# code 2, one line naming the culprit, and every file as it was.

# ---- TOML configuration files ----
c toml_syntax 1 'bad\.toml:2:[0-9]+: invalid TOML' 'printf "[train]\nlr = = 1\n" > bad.toml' info bad.toml
c toml_unclosed_table 1 'bad\.toml:1:[0-9]+: invalid TOML' 'printf "[train\nlr = 1\n" > bad.toml' info bad.toml
c toml_unknown_key 1 "bad\.toml:3: unknown key 'train\.lrr' \(did you mean 'train\.lr'\?\)" 'printf "mode = \"info\"\n[train]\nlrr = 1\n" > bad.toml' bad.toml
c toml_unknown_section 1 'bad\.toml:1: unknown section \[trian\]' 'printf "[trian]\n" > bad.toml' info bad.toml
# TOML's nan and inf literals: no key takes them (a NaN passes every bound; train.lr = nan trained nothing with exit 0,
# reward[].weight = inf scored null and GRPO skipped every step; the command line refused them already).
c toml_nan 1 "bad\.toml:2: key 'train\.lr' must be a finite number \(got nan\)" 'printf "[train]\nlr = nan\n" > bad.toml' $SFT bad.toml
c toml_inf_reward_weight 1 "bad\.toml:5: key 'reward\[\]\.weight' must be a finite number \(got inf\)" 'printf "[[reward]]\nkind = \"regex\"\npattern = \"a\"\nname = \"r\"\nweight = inf\n" > bad.toml' reward bad.toml --data.input=train.jsonl
# A timeout beyond any run (1e300 s overflowed into "did not finish within -2147483648 s" at once): bounded by 1e6 s.
c toml_reward_timeout_huge 1 "bad\.toml:4: key 'reward\[\]\.timeout_s' must be >= 0\.0 and <= 1e\+06" 'printf "[[reward]]\nkind = \"command\"\ncommand = [\"true\"]\ntimeout_s = 1e300\n" > bad.toml' reward bad.toml --data.input=train.jsonl
c toml_wrong_type 1 "bad\.toml:2: key 'train\.lr' must be a number, not a string" 'printf "[train]\nlr = \"fast\"\n" > bad.toml' info bad.toml
c toml_out_of_range 1 "bad\.toml:2: key 'lora\.dropout' must be >= 0\.0 and <= 0\.99 \(got 2\.0\)" 'printf "[lora]\ndropout = 2.0\n" > bad.toml' info bad.toml
c toml_bad_choice 1 "bad\.toml:2: key 'train\.schedule' must be one of .*did you mean \"cosine\"" 'printf "[train]\nschedule = \"cosin\"\n" > bad.toml' info bad.toml
c toml_reward_not_table 1 "bad\.toml:1: 'reward' must be an array of tables" 'printf "reward = 1\n" > bad.toml' info bad.toml
c toml_reward_unknown_key 1 "bad\.toml:3: unknown key 'reward\[\]\.patern'" 'printf "[[reward]]\nkind = \"regex\"\npatern = \"x\"\n" > bad.toml' info bad.toml
c toml_nul_byte 1 'bad\.toml:1:[0-9]+: invalid TOML' 'printf "mode = \"info\"\0\n" > bad.toml' bad.toml
c toml_binary 1 'bad\.toml:[0-9]+:[0-9]+: invalid TOML' 'head -c 300 model/model.safetensors > bad.toml' info bad.toml
c toml_missing 1 '^mgrl: error: nope\.toml: cannot open the configuration file \(No such file' '' info nope.toml
c toml_is_directory 1 'dir\.toml: not a regular file' 'mkdir dir.toml' info dir.toml
c toml_no_mode 1 'no mode given: name one on the command line' 'printf "[train]\nlr = 1.0\n" > nomode.toml' nomode.toml
c toml_mode_unknown 1 "bad\.toml:1: key 'mode' must be one of .*\(got \"sfft\"\); did you mean \"sft\"" 'printf "mode = \"sfft\"\n" > bad.toml' bad.toml

# ---- command-line overrides ----
c cli_unknown_key 1 "command line: unknown key 'train\.lrr' \(did you mean 'train\.lr'\?\)" '' info --train.lrr=1
# A key of the [[reward]] tables names no one table: it was accepted, type-checked and ignored (exit 0, the rewards
# unchanged). A --mode that disagrees with the mode word before it was overridden by the word without a line.
c cli_table_key 1 "command line: '--reward\[\]\.pattern': the keys of \[\[reward\]\] tables cannot be set on the command line" '' reward grpo.toml --data.input=train.jsonl --reward[].pattern=x
c cli_mode_disagrees 1 "command line: '--mode=grpo' disagrees with the mode 'sft' given before it" '' $SFT --mode=grpo
c cli_not_an_integer 1 "'--train\.max_steps=ten': key 'train\.max_steps' must be an integer" '' $SFT --train.max_steps=ten
c cli_empty_integer 1 "'--train\.max_steps=': key 'train\.max_steps' must be an integer \(the value is empty\)" '' $SFT --train.max_steps=
c cli_no_value 1 "option '--train\.lr' needs a value" '' $SFT --train.lr
c cli_integer_overflow 1 "key 'train\.max_steps' must be an integer" '' $SFT --train.max_steps=99999999999999999999
c cli_nan 1 "key 'train\.lr' must be a number" '' $SFT --train.lr=nan
c cli_negative 1 "key 'train\.lr' must be >= 0\.0 \(got -1\.0\)" '' $SFT --train.lr=-1
c cli_bad_bool 1 "key 'model\.recompute' must be a boolean" '' $SFT --model.recompute=yes
c cli_bad_list 1 "key 'lora\.targets' must be a list of strings" '' $SFT '--lora.targets=[1, 2]'
# Found by fuzzing: a quoted value that is no TOML string was a TOML parser exception (exit 1); a value that is not
# UTF-8 was accepted and made the effective configuration (stored in checkpoints) unreadable.
c cli_bad_quoted_string 1 "'--model\.path=\"a\"b\"': key 'model\.path' must be a string" '' $SFT '--model.path="a"b"'
c cli_not_utf8 1 "command line: the value of '--model\.path' is not valid UTF-8 \(byte 2\)" '' $SFT $'--model.path=m\xff'
c cli_empty_required 1 "empty value of required key 'model\.path' for mode sft" '' $SFT --model.path=
c cli_missing_required 1 "missing required key 'data\.input' for mode score" '' score --model.path=model --score.output=x.h5
c cli_unknown_mode 1 "unknown mode 'trian' \(did you mean 'train'\?|unknown mode 'trian'" '' trian
c cli_empty_lora_targets 1 "key 'lora\.targets' is empty" '' $SFT --lora.targets=
c cli_absurd_batch 1 "key 'train\.batch_size' \(1000000000\): .* more than this machine's memory" '' $SFT --train.batch_size=1000000000
c cli_absurd_batch_grpo 1 "key 'train\.batch_size' \(1000000000\): .* more than this machine's memory" '' $GRPO --train.batch_size=1000000000
# A micro-batch whose activations cannot fit (a model of MLP width 2^20 and hidden 4, 32 sequences of ~130 tokens:
# ~144 GiB) is the user's setting: refused before allocating, naming the keys and what would fit (it ended with
# exit 1 "out of host memory", or not at all where memory is overcommitted). GRPO: the training micro-batch at its
# largest (every completion of the longest prompt at grpo.max_completion_length), refused at the start.
c sft_batch_beyond_memory 1 "train\.batch_size = 32 \(32 sequences per rank and micro-batch with train\.grad_accum = 1, up to [0-9]+ tokens at once.*\) needs [0-9.]+ GiB of activations, more than the [0-9.]+ GiB this rank has available \(model\.recompute = false\); (about [0-9]+ sequences per micro-batch fit|not one sequence fits): lower train\.batch_size or train\.max_seq_len, raise train\.grad_accum, or set model\.recompute = true" 'T json-set model/config.json /hidden_size 4 && T json-set model/config.json /num_attention_heads 2 && T json-set model/config.json /num_key_value_heads 1 && T json-set model/config.json /intermediate_size 1048576 && for i in $(seq 32); do printf "{\"prompt\": \"1+1=\", \"completion\": \"%s\"}\n" "$(head -c 495 /dev/zero | tr "\\0" 2)"; done > long.jsonl' $SFT --model.init=random --data.input=long.jsonl --train.batch_size=32 --lora.r=2
c grpo_batch_beyond_memory 1 "a training micro-batch of 4 completions \(train\.batch_size / ranks x grpo\.num_generations / train\.grad_accum\), each up to [0-9]+ prompt tokens \+ grpo\.max_completion_length = 1000, needs up to [0-9.]+ GiB of activations, more than the [0-9.]+ GiB this rank has available \(model\.recompute = false\): lower train\.batch_size, grpo\.num_generations or grpo\.max_completion_length, raise train\.grad_accum, or set model\.recompute = true" 'T json-set model/config.json /hidden_size 4 && T json-set model/config.json /num_attention_heads 2 && T json-set model/config.json /num_key_value_heads 1 && T json-set model/config.json /intermediate_size 1048576 && T json-set model/config.json /max_position_embeddings 4096' $GRPO --model.init=random --lora.r=2 --grpo.max_completion_length=1000
# PPO: a training mini-batch at its largest (all responses of a mini-batch on one rank, each of the longest prompt +
# ppo.response_length), refused at the start (it was killed by the kernel's OOM killer, exit 137 and no line).
c ppo_batch_beyond_memory 1 "a training mini-batch of up to 4 responses on a rank \(train\.batch_size / ppo\.num_mini_batches, at most train\.batch_size / ranks\), each up to [0-9]+ prompt tokens \+ ppo\.response_length = 1000, needs up to [0-9.]+ GiB of activations, more than the [0-9.]+ GiB this rank has available \(model\.recompute = false\): lower train\.batch_size or ppo\.response_length, raise ppo\.num_mini_batches, or set model\.recompute = true" 'T json-set model/config.json /hidden_size 4 && T json-set model/config.json /num_attention_heads 2 && T json-set model/config.json /num_key_value_heads 1 && T json-set model/config.json /intermediate_size 1048576 && T json-set model/config.json /max_position_embeddings 4096' $PPO --model.init=random --lora.r=2 --ppo.response_length=1000
# lora.r above a target layer's own rank (min of its in and out features; the fixture's k_proj: 48 in, 24 out) adds
# parameters and nothing else: refused naming the layer (it was accepted silently).
c lora_r_exceeds_layer_rank 1 "lora\.r = 30 exceeds the rank of the k_proj layers \(48 in, 24 out features\): at most 24" '' $SFT --lora.r=30
c lora_r_exceeds_layer_rank_grpo_np2 2 "lora\.r = 25 exceeds the rank of the k_proj layers" '' $GRPO --lora.r=25
c cli_absurd_eval_batch 1 "key 'eval\.batch_size' \(2000000000\)" '' $SFT --eval.input=heldout.jsonl --eval.batch_size=2000000000
c cli_loss_scale_not_power_of_two 1 "train\.loss_scale_init = 1000: must be a power of two" '' $SFT --train.loss_scaling=dynamic --train.loss_scale_init=1000
c cli_loss_scale_min_above_init_np2 2 "train\.loss_scale_min = 4: must be a power of two no larger than train\.loss_scale_init \(2\)" '' $SFT --train.loss_scale_init=2 --train.loss_scale_min=4
c cli_dtype_on_cpu 1 'model\.dtype = "fp16" needs the CUDA backend; this run uses the CPU backend' '' $SFT --model.dtype=fp16
c cli_batch_vs_accum 1 "train\.batch_size / ranks \(4\) must be divisible by train\.grad_accum \(3\)" '' $SFT --train.grad_accum=3
c cli_batch_vs_ranks_np2 2 "train\.batch_size \(5\) must be divisible by the number of ranks \(2\)" '' $SFT --train.batch_size=5

# Values at which a key's arithmetic breaks, and keys that do not apply where they are given: each was accepted until
# 2026-11-28 (a config-key hunt): adam_beta1 = 1 gave 0/0 in AdamW's bias correction (NaN weights, exit 0);
# lora.alpha = 0 trained nothing (every gradient 0, exit 0); a PEFT adapter with full fine-tuning was dropped without a
# word; generate ignored model.init; DPO's label_smoothing with the sigmoid loss (trl 1.16 smooths robust only) and
# chat.template_kwargs with a built-in chat format (not even parsed) did nothing.
# Integers past 2^31 - 1 wrapped inside mgrl until 2026-11-28 (keep_last = 2^32 + 1 kept one checkpoint): refused.
c cli_keep_last_wraps 1 "command line: key 'checkpoint\.keep_last' must be >= 0 and <= 2147483647 \(got 4294967297\)" '' $SFT --checkpoint.keep_last=4294967297
c cli_adam_beta1_one 1 "command line: key 'train\.adam_beta1' must be >= 0\.0 and < 1\.0 \(got 1\.0\)" '' $SFT --train.adam_beta1=1.0
c toml_adam_beta2_one 1 "bad\.toml:2: key 'train\.adam_beta2' must be >= 0\.0 and < 1\.0 \(got 1\.0\)" 'printf "[train]\nadam_beta2 = 1.0\n" > bad.toml' $SFT bad.toml
c cli_lora_alpha_zero 1 "command line: key 'lora\.alpha' must be > 0\.0 \(got 0\.0\)" '' $SFT --lora.alpha=0
c cli_adam_eps_zero 1 "command line: key 'train\.adam_eps' must be > 0\.0 \(got 0\.0\)" '' $SFT --train.adam_eps=0
c full_finetune_with_adapter 1 "key 'lora\.adapter' does not apply with train\.full_finetune = true, which trains the base weights: merge the adapter" '' $SFT --train.full_finetune=true --lora.adapter=model
c gen_model_init 1 'model\.init = "random" is for sft, grpo, dpo, ppo and plan; generate loads the weights of model\.path' '' $GEN --model.init=random
c score_model_init 1 'model\.init = "random" is for sft, grpo, dpo, ppo and plan; score loads the weights of model\.path' 'printf "mode = \"score\"\n[model]\ninit = \"random\"\n" > s.toml' score s.toml --runtime.backend=cpu --model.path=model --data.input=tokens.jsonl --score.output=old_output.h5
# Every pair the same on both sides (here once cut to dpo.max_length = 10: BOS "333+609=9"): every loss's gradient is 0,
# nothing learned (exit 0 until 2026-11-28). Some such pairs: a warning, cli.dpo.pairs_that_teach_nothing_said.
c dpo_every_pair_same 1 "same\.jsonl: every pair has the same chosen and rejected tokens once cut to dpo\.max_length \(10\) \(the first at line 1\): the loss's gradient would be 0 for every pair" 'printf "{\"prompt\": \"333+609=\", \"chosen\": \"942\", \"rejected\": \"932\"}\n{\"prompt\": \"2+2=\", \"chosen\": \"4\", \"rejected\": \"4\"}\n" > same.jsonl' dpo --runtime.backend=cpu --model.path=model --model.tokenizer=tok --data.input=same.jsonl --train.batch_size=2 --train.max_steps=1 --checkpoint.resume=none --dpo.max_length=10
c dpo_label_smoothing_sigmoid 1 "key 'dpo\.label_smoothing' applies to dpo\.loss_type = \"robust\", \"exo_pair\", \"aot\" and \"aot_unpaired\" only \(as in trl 1\.16\), not to \"sigmoid\"" 'cp "$src/tests/data/dpo_cli/train.jsonl" pairs.jsonl' dpo --runtime.backend=cpu --model.path=model --model.tokenizer=tok --data.input=pairs.jsonl --train.batch_size=4 --train.max_steps=1 --checkpoint.resume=none --dpo.label_smoothing=0.1
c dpo_f_divergence_with_bco 1 "key 'dpo\.f_divergence_type' = \"forward_kl\" applies to the losses of the log-ratios' difference \(as in trl 1\.16\), not to dpo\.loss_type = \"bco_pair\"" 'cp "$src/tests/data/dpo_cli/train.jsonl" pairs.jsonl' dpo --runtime.backend=cpu --model.path=model --model.tokenizer=tok --data.input=pairs.jsonl --train.batch_size=4 --train.max_steps=1 --checkpoint.resume=none --dpo.loss_type=bco_pair --dpo.f_divergence_type=forward_kl
c dpo_exo_pair_needs_epsilon 1 "key 'dpo\.label_smoothing' = 0: dpo\.loss_type = \"exo_pair\" needs its epsilon > 0" 'cp "$src/tests/data/dpo_cli/train.jsonl" pairs.jsonl' dpo --runtime.backend=cpu --model.path=model --model.tokenizer=tok --data.input=pairs.jsonl --train.batch_size=4 --train.max_steps=1 --checkpoint.resume=none --dpo.loss_type=exo_pair
c render_kwargs_builtin_format 1 "chat\.template_kwargs is set, but train\.chat_format names the built-in 'chatml' format, which takes no template variables" '' render --runtime.backend=cpu --model.path=model --model.tokenizer=tok --data.input=train.jsonl --train.chat_format=chatml '--chat.template_kwargs={"enable_thinking": false}'
c grpo_pass_k_without_correctness 1 "eval\.pass_k \(2\) counts correct completions, but no reward decides correctness" 'printf "[[reward]]\nkind = \"regex\"\npattern = \"[0-9]\"\n" > regex.toml' grpo regex.toml --runtime.backend=cpu --model.path=model --model.tokenizer=tok --data.input=train.jsonl --train.max_steps=1 --train.batch_size=2 --grpo.num_generations=2 --grpo.max_prompt_length=12 --grpo.max_completion_length=5 --eval.input=heldout.jsonl --eval.pass_k=2
# Sampling that keeps the most likely token alone: the G completions of a prompt are the same, nothing is learned
# (every step grad norm 0, exit 0, until 2026-11-28).
c grpo_top_k_one 1 "grpo\.top_k = 1 samples the most likely token only: the 2 completions of a prompt \(grpo\.num_generations\) would be the same" '' $GRPO --grpo.top_k=1
c grpo_top_p_zero 1 "grpo\.top_p = 0 samples the most likely token only" '' $GRPO --grpo.top_p=0
# A reward no data line can earn, whatever the completion: GSM8K's answers ("... #### 72") compared as numbers, a
# column absent everywhere (each scored 0 in silence until 2026-11-28).
c grpo_reward_column_no_number 1 "g\.jsonl:1: column 'completion' is 'so #### [0-9]+', no number \(compare = \"number\": .*\): no line of g\.jsonl can earn reward 'correct' \(answer_match\) anything, whatever the completion" 'sed "s/\"completion\": \"\([0-9]*\)\"/\"completion\": \"so #### \1\"/" train.jsonl > g.jsonl' $GRPO --data.input=g.jsonl
c ppo_reward_column_absent 1 "p\.jsonl:1: column 'completion' is absent: no line of p\.jsonl can earn reward" 'sed "s/\"completion\"/\"solution\"/" train.jsonl > p.jsonl' ppo.toml --model.path=model --model.tokenizer=tok --data.input=p.jsonl
c grpo_reward_weights_zero 1 "z\.toml:[0-9]+: every \[\[reward\]\] has weight 0: the total reward would be 0 for every completion" 'printf "mode = \"grpo\"\n[[reward]]\nkind = \"regex\"\npattern = \"[0-9]\"\nweight = 0.0\n" > z.toml' grpo z.toml --runtime.backend=cpu --model.path=model --model.tokenizer=tok --data.input=train.jsonl --train.max_steps=1 --train.batch_size=2 --grpo.num_generations=2 --grpo.max_prompt_length=12 --grpo.max_completion_length=5
# DAPO's overlong penalty starting after max_length - buffer_length tokens, beyond the generation's limit: 0 for every
# completion (alone: nothing learned, exit 0 until 2026-11-28; beside other rewards: a warning, tests/grpo.cmake).
c grpo_overlong_beyond_limit 1 "o\.toml:4: reward 'overlong' \(overlong\): the penalty starts after max_length - buffer_length = 8 tokens, and no completion is longer than grpo\.max_completion_length = 5: .*the only \[\[reward\]\] of weight != 0" 'printf "mode = \"grpo\"\n[[reward]]\nkind = \"overlong\"\nmax_length = 12\nbuffer_length = 4\n" > o.toml' grpo o.toml --runtime.backend=cpu --model.path=model --model.tokenizer=tok --data.input=train.jsonl --train.max_steps=1 --train.batch_size=2 --grpo.num_generations=2 --grpo.max_prompt_length=12 --grpo.max_completion_length=5
c ppo_pass_k 1 "key 'eval\.pass_k' is grpo's: ppo evaluates one greedy completion per held-out prompt" '' ppo.toml --model.path=model --model.tokenizer=tok --data.input=train.jsonl --eval.pass_k=2

# ---- config.json of the model ----
c cfg_missing 1 'model/config\.json: cannot open' 'rm model/config.json' $SFT
c cfg_invalid_json 1 'model/config\.json: invalid JSON: line [0-9]+, column [0-9]+' 'head -c 200 model/config.json > x && mv x model/config.json' $SFT
c cfg_not_object 1 'model/config\.json: not a JSON object' 'echo "[1, 2]" > model/config.json' $SFT
# An EOS id outside the vocabulary never ends a completion: every one ran to its length, silently (until 2026-11-28).
c cfg_eos_outside_vocab 1 "model/config\.json: key 'eos_token_id' holds 100000, outside the vocabulary" 'T json-set model/config.json /eos_token_id 100000' $GEN
c cfg_eos_negative 1 "model/config\.json: key 'eos_token_id' holds -5, outside the vocabulary" 'T json-set model/config.json /eos_token_id -5' $SFT
c cfg_nul_byte 1 'model/config\.json: a NUL byte at offset 8' 'printf "{\"a\": 1}\0" > model/config.json' $SFT
c cfg_unsupported_arch 1 "model/config\.json: unsupported architecture 'GPT2LMHeadModel'" 'T json-set model/config.json /architectures "[\"GPT2LMHeadModel\"]"' $SFT
c cfg_missing_key 1 "model/config\.json: missing required key 'hidden_size'" 'T json-del model/config.json /hidden_size' $SFT
c cfg_wrong_type 1 "model/config\.json: key 'hidden_size' must be an integer, not a string" 'T json-set model/config.json /hidden_size "\"48\""' $SFT
c cfg_negative 1 "model/config\.json: key 'num_hidden_layers' must be positive" 'T json-set model/config.json /num_hidden_layers -2' $SFT
c cfg_huge_layers 1 "model/config\.json: key 'num_hidden_layers' is 100000000, more than mgrl supports" 'T json-set model/config.json /num_hidden_layers 100000000' $SFT
c cfg_huge_vocab 1 "model/config\.json: key 'vocab_size' is 4000000000, more than mgrl supports" 'T json-set model/config.json /vocab_size 4000000000' $SFT
c cfg_beyond_memory 1 "model/config\.json: the model it describes has .* parameters .* more than this machine's memory" 'T json-set model/config.json /hidden_size 1000000 && T json-set model/config.json /intermediate_size 4000000 && T json-set model/config.json /num_hidden_layers 4000' $SFT
c cfg_beyond_cpu_memory 1 "model/config\.json: the model's .* parameters need .* GiB in fp32 on the CPU backend, more than the .* GiB of this machine" 'T json-set model/config.json /hidden_size 4800 && T json-set model/config.json /vocab_size $(awk "/MemTotal/ {printf \"%d\", \$2 * 1024 / 14400}" /proc/meminfo)' $SCORE
c cfg_kv_heads 1 "model/config\.json: key 'num_key_value_heads' must divide num_attention_heads" 'T json-set model/config.json /num_key_value_heads 3' $SFT
c cfg_rope_type 1 "model/config\.json: unsupported rope_scaling type 'longrope'" 'T json-set model/config.json /rope_parameters "{\"rope_type\": \"longrope\", \"rope_theta\": 10000.0}"' $SFT
c cfg_hidden_act 1 "model/config\.json: key 'hidden_act' is 'gelu'" 'T json-set model/config.json /hidden_act "\"gelu\""' $SFT
c cfg_vocab_below_tokenizer 1 "tok.*tokenizer has [0-9]+ tokens, more than the model's vocab_size \(10\)" 'T json-set model/config.json /vocab_size 10' $SFT

# ---- safetensors: single file and sharded ----
c st_missing 1 'model: no model\.safetensors or model\.safetensors\.index\.json' 'rm model/model.safetensors' $SFT
c st_too_short 1 'model/model\.safetensors: not a safetensors file: 4 bytes' 'head -c 4 model/model.safetensors > x && mv x model/model.safetensors' $SFT
c st_truncated 1 'model/model\.safetensors: .*(exceeds the file size|out of range)' 'head -c 20000 model/model.safetensors > x && mv x model/model.safetensors' $SFT
c st_bad_header 1 'model/model\.safetensors: invalid JSON header: line 1, column [0-9]+' 'printf "\x0e\0\0\0\0\0\0\0{\"a\": [1, 2,  " > model/model.safetensors' $SFT
c st_nan_weight 1 "model/model\.safetensors: tensor 'model\.norm\.weight' holds a non-finite value \(nan at index 0\)" 'T nonfinite model/model.safetensors model.norm.weight nan' $SFT
c st_inf_weight 1 "model/model\.safetensors: tensor 'model\.embed_tokens\.weight' holds a non-finite value \(inf at index 0\)" 'T nonfinite model/model.safetensors model.embed_tokens.weight inf' $SCORE
c st_missing_tensor 1 "model: tensor 'model\.norm\.weight' not found" 'T drop-tensor model/model.safetensors x model.norm.weight && mv x model/model.safetensors' $SFT
c shard_missing_file 1 'model/model-00002-of-00002\.safetensors: cannot open the safetensors file' 'T shard model model && rm model/model.safetensors model/model-00002-of-00002.safetensors' $SFT
c shard_wrong_map 1 "model/model\.safetensors\.index\.json: tensor 'model\.norm\.weight' is mapped to 'model-00001-of-00002\.safetensors', which does not hold it" 'T shard model model && rm model/model.safetensors && T json-set model/model.safetensors.index.json /weight_map/model.norm.weight "\"model-00001-of-00002.safetensors\""' $SFT
c shard_path_escape 1 "model/model\.safetensors\.index\.json: weight_map entry of tensor 'model\.norm\.weight': '\.\./x' is not a file name" 'T shard model model && rm model/model.safetensors && T json-set model/model.safetensors.index.json /weight_map/model.norm.weight "\"../x\""' $SFT
c shard_bad_index 1 'model/model\.safetensors\.index\.json: invalid JSON' 'T shard model model && rm model/model.safetensors && echo "{" > model/model.safetensors.index.json' $SFT
c shard_nan 1 "model/model-0000[12]-of-00002\.safetensors: tensor 'model\.norm\.weight' holds a non-finite value" 'T shard model model && rm model/model.safetensors && for f in model/model-0000*; do "$tool" nonfinite $f model.norm.weight nan >/dev/null 2>&1; done; true' $SFT

# ---- PEFT adapters (lora.adapter) ----
c peft_missing_config 1 'model/adapter_config\.json: cannot open the adapter configuration' 'rm model/adapter_config.json' $SCORE --lora.adapter=model
c peft_invalid_json 1 'model/adapter_config\.json: invalid JSON: line' 'echo "{\"r\": 4," > model/adapter_config.json' $SCORE --lora.adapter=model
c peft_missing_r 1 "model/adapter_config\.json: missing required key 'r'" 'T json-del model/adapter_config.json /r' $SCORE --lora.adapter=model
c peft_r_string 1 "model/adapter_config\.json: key 'r' must be a number, not \"4\"" 'T json-set model/adapter_config.json /r "\"4\""' $SCORE --lora.adapter=model
c peft_empty_targets 1 "model/adapter_config\.json: key 'target_modules' is empty" 'T json-set model/adapter_config.json /target_modules "[]"' $SCORE --lora.adapter=model
c peft_regex_targets 1 'model/adapter_config\.json: key .target_modules. = "q_proj\|v_proj" selects none of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj of the decoder layers' 'T json-set model/adapter_config.json /target_modules "\"q_proj|v_proj\""' $SCORE --lora.adapter=model
c peft_unknown_target 1 "model/adapter_config\.json: target module 'fc1' is not a linear layer" 'T json-set model/adapter_config.json /target_modules "[\"fc1\"]"' $SCORE --lora.adapter=model
c peft_dora 1 'model/adapter_config\.json: DoRA adapters \(use_dora\) are not supported' 'T json-set model/adapter_config.json /use_dora true' $SCORE --lora.adapter=model
c peft_wrong_rank 1 "model/adapter_model\.safetensors: tensor 'base_model\.model\.model\.layers\.0\..*' has shape \[4, [0-9]+\], expected \[8, [0-9]+\]" 'T json-set model/adapter_config.json /r 8' $SCORE --lora.adapter=model
c peft_nan 1 "model/adapter_model\.safetensors: tensor 'base_model\.model\.model\.layers\.0\.self_attn\.q_proj\.lora_A\.weight' holds a non-finite value \(nan" 'T nonfinite model/adapter_model.safetensors base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight nan' $SCORE --lora.adapter=model

# ---- tokenizer.json ----
c tok_missing 1 'tok.*tokenizer\.json' 'rm tok/tokenizer.json' $SFT
c tok_invalid_json 1 'tok/tokenizer\.json: invalid JSON: line [0-9]+, column [0-9]+' 'head -c 500 tok/tokenizer.json > x && mv x tok/tokenizer.json' $SFT
c tok_no_model 1 'tok/tokenizer\.json: .*model' 'T json-del tok/tokenizer.json /model' $SFT
c tok_bad_model_type 1 "tok/tokenizer\.json: .*Unigram" 'T json-set tok/tokenizer.json /model/type "\"Unigram\""' $SFT

# A chat_template list whose entry has a name of another type: passed over as a template without the name
# "default" (a JSON library message with exit 1 until 2026-11-28).
c tokenizer_chat_template_name_not_string 1 "c\.jsonl:1: tok/tokenizer\.json: the tokenizer has no chat template" 'T json-set tok/tokenizer_config.json /chat_template "[{\"name\": 5, \"template\": \"x\"}]" && printf "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1=\"}, {\"role\": \"assistant\", \"content\": \"2\"}]}\n" > c.jsonl' $SFT --data.input=c.jsonl
# A chat_template of another type (a number): read as "no chat template" until 2026-11-28, the error then naming the
# data line instead of this file.
c tokenizer_chat_template_number 1 "tok/tokenizer_config\.json: \"chat_template\" must be a string or a list of \{\"name\", \"template\"\} objects, not number" 'T json-set tok/tokenizer_config.json /chat_template 5 && printf "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1=\"}, {\"role\": \"assistant\", \"content\": \"2\"}]}\n" > c.jsonl' $SFT --data.input=c.jsonl

# ---- data JSONL, every mode ----
c sft_bad_json 1 'train\.jsonl:3: invalid JSON at column [0-9]+' 'sed -i "3s/.*/{\"prompt\": \"1+1=\", completion: 2}/" train.jsonl' $SFT
c sft_number_overflow 1 'train\.jsonl:3: invalid JSON: number overflow' 'sed -i "3s/.*/{\"prompt\": 1e999, \"completion\": \"2\"}/" train.jsonl' $SFT
c sft_nul_byte 1 'train\.jsonl:2: a NUL byte at column [0-9]+' 'sed -i "2s/\$/\x00/" train.jsonl' $SFT
# A prompt longer than the model's positions (128, below train.max_seq_len's 2048): the line names that limit (it named
# train.max_seq_len with the model's number until 2026-11-28, a key the user never set to 128).
c sft_prompt_beyond_positions 1 'train\.jsonl:2: the prompt alone has [0-9]+ tokens, not less than the model'"'"'s max_position_embeddings \(128\)' 'sed -i "2s/.*/{\"prompt\": \"$(head -c 200 /dev/zero | tr "\\0" 1)\", \"completion\": \"2\"}/" train.jsonl' $SFT
c sft_not_object 1 'train\.jsonl:1: expected a JSON object' 'sed -i "1s/.*/[1, 2]/" train.jsonl' $SFT
c sft_wrong_fields 1 'train\.jsonl:1: expected \{"prompt", "completion"\}' 'sed -i "1s/.*/{\"question\": \"x\"}/" train.jsonl' $SFT
c sft_empty 1 'empty\.jsonl: no examples' ': > empty.jsonl' $SFT --data.input=empty.jsonl
c sft_missing_data 1 'nothere\.jsonl: cannot open' '' $SFT --data.input=nothere.jsonl
c sft_bad_eval_line 1 'heldout\.jsonl:2: ' 'sed -i "2s/.*/{\"prompt\": 5, \"completion\": \"x\"}/" heldout.jsonl' $SFT --eval.input=heldout.jsonl
c sft_bad_line_np2 2 'train\.jsonl:4: invalid JSON' 'sed -i "4s/.*/{oops/" train.jsonl' $SFT
c score_bad_token 1 'tokens\.jsonl:2: token 999 is not an id' 'sed -i "2s/.*/{\"tokens\": [1, 999]}/" tokens.jsonl' $SCORE
c score_tokens_not_list 1 'tokens\.jsonl:1: ' 'sed -i "1s/.*/{\"tokens\": \"1 2 3\"}/" tokens.jsonl' $SCORE
# Token ids as written (until 2026-11-28: 2^64-1 was named "token -1"; in generate 2.5 became token 2 and 1e20 was
# named -2147483648), an empty stop string (every completion empty with finish_reason "stop", exit 0), and a
# num_generations whose sequences cannot fit memory (exit 1 "out of host memory" at the KV cache's allocation).
c score_token_beyond_uint64 1 'tokens\.jsonl:2: token 18446744073709551615 is not an id' 'sed -i "2s/.*/{\"tokens\": [1, 18446744073709551615]}/" tokens.jsonl' $SCORE
c gen_token_not_integer 1 'p\.jsonl:1: token 2\.5 is not an integer id' 'printf "{\"prompt_tokens\": [1, 2.5]}\n" > p.jsonl' $GEN --data.input=p.jsonl
c gen_token_huge 1 'p\.jsonl:1: token 99999999999 is not an id of the model'\''s vocabulary \(0\.\.172\)' 'printf "{\"prompt_tokens\": [1, 99999999999]}\n" > p.jsonl' $GEN --data.input=p.jsonl
c gen_empty_stop 1 "key 'generate\.stop': an empty stop string would end every completion at once" '' $GEN '--generate.stop=[""]'
c grpo_empty_stop 1 "key 'grpo\.stop': an empty stop string would end every completion at once" '' $GRPO '--grpo.stop=[""]'
c gen_generations_beyond_memory 1 "key 'generate\.num_generations' \(1000000000\): 1000000000 sequences of up to [0-9]+ tokens at once on a rank need more than" '' $GEN --generate.num_generations=1000000000
c generate_prompt_not_string 1 'prompts\.jsonl:1: ' 'sed -i "1s/.*/{\"prompt\": 5}/" prompts.jsonl' $GEN
c generate_nul_byte 1 'prompts\.jsonl:3: a NUL byte' 'sed -i "3s/\$/\x00/" prompts.jsonl' $GEN
c grpo_bad_line 1 'train\.jsonl:5: invalid JSON' 'sed -i "5s/.*/{\"prompt\": /" train.jsonl' $GRPO
c reward_bad_line 1 'samples\.jsonl:1: ' 'echo "{\"completion\": 3}" > samples.jsonl' reward grpo.toml --data.input=samples.jsonl
# Found by fuzzing (fuzz/, docs/reliability.md#fuzzing): these were JSON library exceptions (exit 1, no line number).
c sft_role_not_string 1 'train\.jsonl:1: each message needs string "role" and "content"' 'sed -i "1s/.*/{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}/" train.jsonl' $SFT
c reward_finish_reason_not_string 1 'samples\.jsonl:1: "finish_reason" must be a string' 'echo "{\"completion\": \"x\", \"finish_reason\": 1}" > samples.jsonl' reward grpo.toml --data.input=samples.jsonl
c reward_completion_tokens_huge 1 'samples\.jsonl:1: "completion_tokens" must be an integer in' 'echo "{\"completion\": \"x\", \"completion_tokens\": 99999999999}" > samples.jsonl' reward grpo.toml --data.input=samples.jsonl

# ---- checkpoints ----
c ck_damaged_tensor 1 "ck/step_00000002\.h5: damaged checkpoint: the data of '/trainable/base_model\.model\.model\.layers\.1\.self_attn\.v_proj\.lora_A\.weight' do not match their checksum" 'T damage-dataset ck/step_00000002.h5 /trainable/base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight' $SFT --train.max_steps=3 --checkpoint.dir=out --checkpoint.resume=ck/step_00000002.h5
c ck_damaged_moment 1 "ck/step_00000002\.h5: damaged checkpoint: the data of '/optimizer/exp_avg_sq/base_model\.model\.model\.layers\.0\.mlp\.down_proj\.lora_B\.weight'" 'T damage-dataset ck/step_00000002.h5 /optimizer/exp_avg_sq/base_model.model.model.layers.0.mlp.down_proj.lora_B.weight' $SFT --train.max_steps=3 --checkpoint.dir=out --checkpoint.resume=ck/step_00000002.h5
c ck_damaged_step 1 "ck/step_00000002\.h5: damaged checkpoint: the data of '/state/step'" 'T damage-dataset ck/step_00000002.h5 /state/step' $SFT --train.max_steps=3 --checkpoint.dir=out --checkpoint.resume=ck/step_00000002.h5
c ck_all_damaged_auto 1 "ck: no intact checkpoint to resume from \(2 damaged; the newest: ck/step_00000002\.h5: " 'T damage-dataset ck/step_00000002.h5 /config && T damage-dataset ck/step_00000001.h5 /model_identity' $RESUME
c ck_all_damaged_auto_np2 2 "ck: no intact checkpoint to resume from \(2 damaged" 'head -c 5000 ck/step_00000002.h5 > x && mv x ck/step_00000002.h5 && T damage-dataset ck/step_00000001.h5 /state/rng' $RESUME
c ck_truncated 1 'ck/step_00000002\.h5: truncated checkpoint: it has 9000 bytes, fewer than its header' 'head -c 9000 ck/step_00000002.h5 > x && mv x ck/step_00000002.h5' $SFT --train.max_steps=3 --checkpoint.resume=ck/step_00000002.h5
c ck_truncated_end 1 'ck/step_00000002\.h5: truncated checkpoint: it has [0-9]+ bytes, its header says [0-9]+$' 'head -c -1000 ck/step_00000002.h5 > x && mv x ck/step_00000002.h5' $SFT --train.max_steps=3 --checkpoint.resume=ck/step_00000002.h5
c ck_appended 1 'ck/step_00000002\.h5: corrupt checkpoint: it has [0-9]+ bytes, its header says [0-9]+ \(bytes appended\?\)$' 'echo more >> ck/step_00000002.h5' $SFT --train.max_steps=3 --checkpoint.resume=ck/step_00000002.h5
c ck_damaged_header 1 'ck/step_00000002\.h5: damaged checkpoint: its header \(the HDF5 user block\) does not match its checksum' 'T damage-seal ck/step_00000002.h5 header' $SFT --train.max_steps=3 --checkpoint.resume=ck/step_00000002.h5
c ck_damaged_metadata 1 "ck/step_00000002\.h5: damaged checkpoint: its HDF5 metadata \(the bytes outside the datasets' values\) do not match their checksum" 'T damage-seal ck/step_00000002.h5 metadata' $SFT --train.max_steps=3 --checkpoint.resume=ck/step_00000002.h5
c ck_name_mismatch 1 'ck/step_00000007\.h5: corrupt checkpoint: the file name says step 7 but it holds step 2' 'cp ck/step_00000002.h5 ck/step_00000007.h5' $SFT --train.max_steps=9 --checkpoint.resume=ck/step_00000007.h5
c ck_not_hdf5 1 'ck/step_00000002\.h5: not an HDF5 file' 'echo "not a checkpoint" > ck/step_00000002.h5' $SFT --train.max_steps=3 --checkpoint.resume=ck/step_00000002.h5
c ck_nan 1 "nan/step_00000002\.h5: corrupt checkpoint: tensor '/trainable/.*' holds a non-finite value \(nan at index 0\)" 'T checkpoint-nan ck/step_00000002.h5 nan' $SFT --train.max_steps=3 --checkpoint.resume=nan/step_00000002.h5
c ck_missing 1 'ck/step_00000042\.h5: cannot open' '' $SFT --train.max_steps=3 --checkpoint.resume=ck/step_00000042.h5
c ck_other_model 1 'ck/step_00000002\.h5: checkpoint of another model' '' $SFT --lora.r=4 --train.max_steps=3 --checkpoint.resume=ck/step_00000002.h5
c ck_export_damaged 1 "ck/step_00000002\.h5: damaged checkpoint: the data of '/trainable/.*' do not match their checksum \([0-9a-f]+, stored [0-9a-f]+\); the newest intact checkpoint is ck/step_00000001\.h5 \(step 1\): --export\.checkpoint=ck/step_00000001\.h5 exports it$" 'T damage-dataset ck/step_00000002.h5 /trainable/base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight' export --checkpoint.dir=ck --export.output=exported
c ck_export_all_damaged 1 "ck/step_00000002\.h5: truncated checkpoint: .*; no other checkpoint of ck is intact$" 'head -c 5000 ck/step_00000002.h5 > x && mv x ck/step_00000002.h5 && T damage-seal ck/step_00000001.h5 metadata' export --checkpoint.dir=ck --export.output=exported
c ck_export_named_damaged 1 "ck/step_00000001\.h5: damaged checkpoint: its HDF5 metadata .* do not match their checksum \([0-9a-f]+, stored [0-9a-f]+\)$" 'T damage-seal ck/step_00000001.h5 metadata' export --checkpoint.dir=ck --export.checkpoint=ck/step_00000001.h5 --export.output=exported
# A checkpoint of another mode (an SFT run's, resumed by GRPO: the same adapter shapes) was resumed silently, with
# another objective's step count, schedule and moments (until 2026-11-28).
c ck_other_mode 1 "ck/step_00000002\.h5: a checkpoint of mgrl sft, resumed by mgrl grpo" '' $GRPO --lora.r=2 --checkpoint.dir=ck --checkpoint.resume=auto
# The base weights changed under a run's adapters (another model of the same shapes at model.path: an instruct
# version, another revision): the adapters trained over the old weights were resumed over the new ones (until
# 2026-11-28, silently, exit 0). Here every value of one tensor of model/ changes sign.
c ck_other_base 1 "ck/step_00000002\.h5: trained over other base weights than this run's \(tensor 'model\.layers\.0\.mlp\.up_proj\.weight' differs; its run: model\.path = \"[^\"]*/qwen2_bias_tied\"; this run: model\.path = \"model\"\): adapters trained over one base do not fit another\. .*checkpoint\.allow_other_base = true" 'T negate model/model.safetensors model.layers.0.mlp.up_proj.weight' $RESUME
c ck_other_base_np2 2 "ck/step_00000002\.h5: trained over other base weights than this run's \(tensor 'model\.layers\.1\.self_attn\.q_proj\.bias' differs" 'T negate model/model.safetensors model.layers.1.self_attn.q_proj.bias' $RESUME

# checkpoint.dir holding an earlier run's checkpoints and resume = "none" (or a path before the newest): the new run
# replaced them one by one and pruning counted them among the newest (deleting its own), exit 0, until 2026-11-28.
c ck_resume_none_over_run 1 "ck \(checkpoint\.dir\) holds checkpoints of an earlier run \(the newest: ck/step_00000002\.h5\) and checkpoint\.resume = \"none\" starts afresh" '' $SFT --checkpoint.dir=ck
c ck_resume_none_over_run_np2 2 "ck \(checkpoint\.dir\) holds checkpoints of an earlier run" '' $SFT --checkpoint.dir=ck
c ck_resume_path_before_newest 1 "ck \(checkpoint\.dir\) holds checkpoints after step 1 of ck/step_00000001\.h5 \(the newest: ck/step_00000002\.h5\)" '' $SFT --checkpoint.dir=ck --checkpoint.resume=ck/step_00000001.h5
# ---- output locations ----
c out_ck_dir_is_file 1 'old_output\.jsonl: cannot create the checkpoint directory \(Not a directory\)' '' $SFT --checkpoint.dir=old_output.jsonl
c out_ck_dir_under_file 1 'old_output\.jsonl/ck: cannot create the checkpoint directory \(Not a directory\)' '' $SFT --checkpoint.dir=old_output.jsonl/ck
c out_ck_dir_unwritable_fs 1 '/sys/mgrl_robust_ck: cannot create the checkpoint directory \((Operation not permitted|Read-only file system|Permission denied)\)' '' $SFT --checkpoint.dir=/sys/mgrl_robust_ck
c out_log_dir_is_file 1 'old_output\.jsonl: cannot create the .*log directory' '' $SFT --log.dir=old_output.jsonl
# log.dir's files in the way, found at the start on every rank (a directory as metrics.jsonl: no metrics, exit 0; a
# file as rollouts/: rank 0 alone at the first rollout file, the others ended by MPI_Abort; until 2026-11-28).
c out_log_metrics_is_dir 1 "L/metrics\.jsonl: not a regular file \(log\.dir's metrics\.jsonl is a directory\)" 'mkdir -p L/metrics.jsonl' $SFT --log.dir=L
c out_log_summary_is_dir_np2 2 "L/job_summary\.txt: not a regular file \(log\.dir's job_summary\.txt is a directory\)" 'mkdir -p L/job_summary.txt' $SFT --log.dir=L
c out_log_rollouts_is_file_np2 2 "L/rollouts: not a directory \(log\.dir's rollout files are written there\)" 'mkdir -p L && echo x > L/rollouts' $GRPO --log.dir=L
c out_score_missing_dir 1 'nodir/scores\.h5' '' $SCORE --score.output=nodir/scores.h5
c out_score_is_dir 1 'ck' '' $SCORE --score.output=ck
c out_generate_under_file 1 'old_output\.jsonl/out\.jsonl' '' $GEN --generate.output=old_output.jsonl/out.jsonl
c out_export_is_file 1 'old_output\.jsonl: exists and is not a directory' '' export --checkpoint.dir=ck --export.output=old_output.jsonl
# An output over one of the run's inputs (found by a data-loss hunt): the prompts replaced by the completions, the
# model's config.json or weights, the tokenizer, the scored data replaced by HDF5, each with exit 0 (until 2026-11-28).
# (An output that is a link to an input replaces the link, not the input: allowed.)
c out_generate_over_prompts 1 "key 'generate\.output' = prompts\.jsonl: it is data\.input \(prompts\.jsonl\), the input of this run; writing there would replace it" '' $GEN --generate.output=prompts.jsonl
c out_generate_over_model_config 1 "key 'generate\.output' = model/config\.json: a file of model\.path \(model\), an input of this run" '' $GEN --generate.output=model/config.json
c out_generate_over_tokenizer 1 "key 'generate\.output' = tok/tokenizer\.json: a file of model\.tokenizer \(tok\)" '' $GEN --generate.output=tok/tokenizer.json
c out_generate_over_adapter_np2 2 "key 'generate\.output' = ad/adapter_config\.json: a file of lora\.adapter \(ad\)" 'mkdir ad && cp model/adapter_config.json model/adapter_model.safetensors ad/' $GEN --lora.adapter=ad --generate.output=ad/adapter_config.json
c out_score_over_tokens 1 "key 'score\.output' = tokens\.jsonl: it is data\.input \(tokens\.jsonl\)" '' $SCORE --score.output=tokens.jsonl
c out_score_over_weights_np2 2 "key 'score\.output' = model/model\.safetensors: a file of model\.path \(model\)" '' $SCORE --score.output=model/model.safetensors
# GRPO's rollout files are named as checkpoints are: checkpoint.dir = <log.dir>/rollouts replaced them (and pruning
# set them aside as damaged checkpoints).
c out_ck_dir_is_rollouts 1 "key 'checkpoint\.dir' = L/rollouts: it is log\.dir's rollouts directory \(L/rollouts\)" '' $GRPO --log.dir=L --checkpoint.dir=L/rollouts
c out_generate_is_fifo 1 'pipe: exists and is not a regular file' 'mkfifo pipe' $GEN --generate.output=pipe
c out_score_is_fifo 1 'pipe: exists and is not a regular file' 'mkfifo pipe' $SCORE --score.output=pipe
c out_export_adapter_is_dir 1 'exported/adapter_model\.safetensors: exists and is not a regular file' 'mkdir -p exported/adapter_model.safetensors' export --checkpoint.dir=ck --export.output=exported
# A disk that fills up: tests/faults/disk_full.sh (fault.disk_full_*) mounts a small tmpfs in a mount namespace of its
# own; tests/unit/test_checkpoint.cpp (DiskFullIsAUserErrorAndKeepsTheOldFiles) limits the file size of a child
# process (RLIMIT_FSIZE); here that limit would stop MPI itself from starting.

# ---- mgrl export ----
# Into the base model's own directory (model.path of the run): refused before writing (a full fine-tuning's export
# left the base's config.json empty and replaced its model.safetensors; a LoRA export wrote its adapter beside it).
c export_into_base_dir 1 "key 'export\.output' = model: the directory of the base model \(model\.path of the run: model\); exporting there would overwrite it" 'mgrl_sft() { "$mgrl" sft --runtime.backend=cpu --model.path=$1 --model.tokenizer=tok --data.input=train.jsonl --train.batch_size=4 --train.max_steps=1 --lora.r=2 --checkpoint.resume=none --checkpoint.dir=$2 "${@:3}" > /dev/null 2>&1; } && mgrl_sft model ck_full --train.full_finetune=true' export --checkpoint.dir=ck_full --export.output=model
# At 2 ranks: rank 0's checks and writes are agreed on (every rank ends with its line and exit code 2, not rank 0's
# error and an MPI_Abort, until 2026-11-28).
c export_into_base_dir_np2 2 "key 'export\.output' = model: the directory of the base model" 'mgrl_sft() { "$mgrl" sft --runtime.backend=cpu --model.path=$1 --model.tokenizer=tok --data.input=train.jsonl --train.batch_size=4 --train.max_steps=1 --lora.r=2 --checkpoint.resume=none --checkpoint.dir=$2 "${@:3}" > /dev/null 2>&1; } && mgrl_sft model ck_full --train.full_finetune=true' export --checkpoint.dir=ck_full --export.output=model
c export_merged_into_base_dir 1 "key 'export\.output' = \.: \./merged is the directory of the base model \(model\.path of the run: merged\)" 'cp -r model merged && "$mgrl" sft --runtime.backend=cpu --model.path=merged --model.tokenizer=tok --data.input=train.jsonl --train.batch_size=4 --train.max_steps=1 --lora.r=2 --checkpoint.resume=none --checkpoint.dir=ck_lora > /dev/null 2>&1' export --checkpoint.dir=ck_lora --export.output=. --export.merged=true
# A merge whose base model cannot be read (moved away since the run): refused before the adapter is written.
c export_merged_base_gone 1 "^mgrl: error: gone: " 'cp -r model gone && "$mgrl" sft --runtime.backend=cpu --model.path=gone --model.tokenizer=tok --data.input=train.jsonl --train.batch_size=4 --train.max_steps=1 --lora.r=2 --checkpoint.resume=none --checkpoint.dir=ck_lora > /dev/null 2>&1 && rm -rf gone' bash -c '"$0" export --checkpoint.dir=ck_lora --export.output=exported --export.merged=true; rc=$?; [ ! -e exported ] || { echo "mgrl: exported/ was written"; exit 9; }; exit $rc' "$mgrl"

# A run of a built-in shape (model.shape: random weights, no model directory) exported: an internal error (exit 1,
# "configuration key 'model.path' has no value") until 2026-11-28.
c export_model_shape_run 1 "shp/step_00000001\.h5: its run built the model from model\.shape = \"tiny-llama\" \(random weights, no model directory\)" '"$mgrl" sft --runtime.backend=cpu --model.shape=tiny-llama --model.init=random --model.tokenizer=tok --data.input=train.jsonl --train.batch_size=4 --train.max_steps=1 --lora.r=2 --checkpoint.dir=shp --checkpoint.resume=none --log.dir= > /dev/null 2>&1' export --checkpoint.dir=shp --export.output=exported

# ---- inputs that are not regular files ----
# A FIFO blocked the open for good (no timeout watches the start: a hang at 1 and 2 ranks); a directory read as an
# empty file ("no examples", "the tokenizer has no EOS token", the template "renders no assistant turn", or a
# reward run scoring nothing with exit 0). Refused by name before they are opened (found by a user-error hunt).
c input_fifo_data 1 "^mgrl: error: p\.jsonl: not a regular file \(the data is a FIFO\)$" 'mkfifo p.jsonl' $SFT --data.input=p.jsonl
c input_fifo_data_np2 2 "p\.jsonl: not a regular file \(the data is a FIFO\)$" 'mkfifo p.jsonl' $SFT --data.input=p.jsonl
c input_fifo_toml 1 "^mgrl: error: p\.toml: not a regular file" 'mkfifo p.toml' p.toml
c input_fifo_safetensors 1 "model/model\.safetensors: not a regular file" 'mv model/model.safetensors w.bin && mkfifo model/model.safetensors' $SCORE
c input_fifo_checkpoint 1 "f\.h5: not a regular file" 'mkfifo f.h5' $SFT --train.max_steps=3 --checkpoint.dir=ck --checkpoint.resume=f.h5
c input_dir_reward_data 1 "^mgrl: error: d\.jsonl: not a regular file \(the data is a directory\)$" 'mkdir d.jsonl' reward grpo.toml --data.input=d.jsonl
c input_dir_chat_template 1 "^mgrl: error: t\.jinja: not a regular file \(the chat template \(chat\.template\) is a directory\)$" 'mkdir t.jinja && printf "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1=\"}, {\"role\": \"assistant\", \"content\": \"2\"}]}\n" > c.jsonl' $SFT --data.input=c.jsonl --chat.template=t.jinja
c input_dir_tokenizer_config 1 "^mgrl: error: tok/tokenizer_config\.json: not a regular file" 'rm tok/tokenizer_config.json && mkdir tok/tokenizer_config.json' $SFT
c input_dir_model_config 1 "^mgrl: error: model/config\.json: not a regular file" 'rm model/config.json && mkdir model/config.json' $SFT

# ---- NF4 (bitsandbytes 4-bit) models ----
# A NaN block scale: every weight of its block NaN (trained on with exit 0, `loss nan ... skipped` until 2026-11-28).
c nf4_nonfinite_absmax 1 "nf: tensor 'model\.layers\.0\.mlp\.down_proj\.weight\.absmax': a non-finite value at element 0" 'cp -r "$src/tests/data/nf4/llama_nf4_plain" nf && T nonfinite nf/model.safetensors model.layers.0.mlp.down_proj.weight.absmax nan' $SFT --model.path=nf
