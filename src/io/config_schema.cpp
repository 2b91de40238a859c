// config_schema.cpp: mgrl's configuration keys. Add a key here and nowhere else; docs/config.md
// is `mgrl help-config` and a test keeps the two in step.
#include "io/config_schema.h"

namespace mgrl::io {

const std::vector<std::string>& mgrl_modes() {
  static const std::vector<std::string> modes{"info", "sft", "grpo", "dpo", "kto", "ppo", "distill", "reward", "export", "score",
                                              "generate", "render", "plan", "help-config"};
  return modes;
}

const Schema& mgrl_schema() {
  using T = ValueType;
  static const Schema schema = [] {
    Schema s;
    auto add = [&s](KeySpec k) { s.push_back(std::move(k)); };
    add({"mode", T::String, std::nullopt,
         "what to run: info (ranks, devices, versions), sft (supervised fine-tuning), grpo (reinforcement learning "
         "with group-relative policy optimisation), dpo (direct preference optimisation on preference pairs), ppo "
         "(reinforcement learning with a value head and GAE, as trl's PPO trainer), distill (on-policy knowledge "
         "distillation from a teacher model, as trl's DistillationTrainer), reward "
         "(score completions with the [[reward]] functions), export (a checkpoint as a PEFT adapter or merged model), "
         "score (log-probs of token sequences), generate (completions of prompts), render (the text, tokens and "
         "assistant mask of chat data), plan (the memory a run needs per rank, from the model's shape alone) or help-config (this list); the command line may name it instead",
         mgrl_modes(), {}, {}, {}});
    add({"runtime.backend", T::String, Value(std::string("auto")),
         "compute backend: auto (CUDA when every rank has a GPU of its own, else CPU), cpu or cuda",
         {"auto", "cpu", "cuda"}, {}, {}, {}});
    add({"runtime.threads", T::Int, Value(std::int64_t{0}),
         "CPU threads per rank; 0: the cores this rank may use (its affinity mask, shared when unbound)",
         {}, 0.0, 4096.0, {}});
    add({"runtime.comm_timeout_s", T::Float, Value(600.0),
         "seconds a collective may take before the job is ended with a message naming it (a wait for a checkpoint "
         "or export that other ranks write or read: twice that, or longer by the time its bytes take at 20 MB/s; for "
         "the reward programs of other ranks: twice that, or their own reward[].timeout_s; while another rank still "
         "makes progress in its generation, counted from its last decode step); 0: no limit",
         {}, 0.0, std::nullopt, {}});
    add({"runtime.dir_lock_wait_s", T::Float, Value(300.0),
         "seconds a training run waits for another mgrl run that holds its checkpoint.dir or log.dir (their lock "
         "file .mgrl.lock) before it refuses to start (exit 2); a lock whose holder stopped refreshing it 180 s ago "
         "(a node that died holding it on a network file system) is passed over with a warning",
         {}, 0.0, 86400.0, {}});
    add({"model.path", T::String, std::nullopt,
         "Hugging Face model directory: config.json and model.safetensors (or a sharded index)", {}, {}, {},
         {"score", "generate", "sft", "grpo", "dpo", "kto", "ppo", "distill", "unless model.shape"}});
    add({"model.shape", T::String, Value(std::string("")),
         "a built-in model shape instead of model.path's config.json (sft, grpo, dpo, ppo with model.init = \"random\", "
         "and plan): tiny-llama, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, llama-3.1-70b, qwen2.5-0.5b, -1.5b, -3b, "
         "-7b, -14b, -32b, -72b, qwen3-0.6b, qwen3-8b, qwen3-32b; the tokenizer then comes from model.tokenizer",
         {}, {}, {}, {}});
    add({"model.num_layers", T::Int, Value(std::int64_t{0}),
         "decoder layers of the model instead of its config's num_hidden_layers (model.init = \"random\" or plan: "
         "e.g. a 70B-shaped step on fewer layers); 0: the config's",
         {}, 0.0, 4096.0, {}});
    add({"model.init", T::String, Value(std::string("pretrained")),
         "pretrained: weights from model.path; random: only the model's shape is read (model.path/config.json or "
         "model.shape) and the weights are drawn (normal(0, model.init_std); norms 1), seeded by train.seed: for "
         "training a small model from scratch, or measuring a large model's step without its files",
         {"pretrained", "random"}, {}, {}, {}});
    add({"model.init_std", T::Float, Value(0.02), "standard deviation of random initial weights", {}, 0.0, {}, {}});
    add({"model.recompute", T::Bool, Value(false),
         "recompute each layer's activations in the backward pass instead of keeping them (less memory)", {}, {}, {},
         {}});
    add({"model.shard_base", T::Bool, Value(false),
         "store 1/P of every decoder layer's frozen base weights on each of the P ranks and all-gather each layer just before it runs (forward and backward; ZeRO-3 / FSDP for the frozen part); the embeddings, the final norm and the LM head stay whole; LoRA weights, gradients and AdamW state stay replicated. Results are bitwise those of the unsharded run. sft, grpo, dpo, kto, ppo, distill (its teacher sharded too), generate and score; not with train.full_finetune. NF4 base weights (model.quantize = \"nf4\" or a bitsandbytes 4-bit directory) are sharded as stored: a gather moves NF4 bytes",
         {}, {}, {}, {}});
    add({"model.shard_base_keep", T::Bool, Value(false),
         "with model.shard_base: keep the layers gathered by a training forward until the end of its backward (no second gather, but the whole base in the workspace at the step's peak)",
         {}, {}, {}, {}});
    add({"model.dtype", T::String, Value(std::string("auto")),
         "CUDA backend: storage of the frozen weights and activations: auto (bf16 on compute capability 8.0 and "
         "newer, fp16 before: V100 and T4 have no bf16), bf16 or fp16 (fp16 on any GPU, e.g. to compare with bf16 on "
         "the same one); LoRA weights, gradients and AdamW moments are f32 either way. The CPU backend is f32 and "
         "takes auto only",
         {"auto", "bf16", "fp16"}, {}, {}, {}});
    add({"model.tokenizer", T::String, Value(std::string("")),
         "directory with tokenizer.json (and tokenizer_config.json); empty: model.path", {}, {}, {}, {}});
    add({"model.quantize", T::String, Value(std::string("none")),
         "frozen base projections (q/k/v/o, gate/up/down) quantized at load: none, or nf4 (QLoRA: 4-bit NormalFloat "
         "in bitsandbytes' layout, blocks of 64 values with an absmax each, dequantized per layer into a workspace "
         "for the GEMMs); embeddings, norms and lm_head stay dense. A model.path that transformers saved in "
         "bitsandbytes 4-bit form (config.json quantization_config) is read as NF4 whatever this says. LoRA only: "
         "refused with train.full_finetune",
         {"none", "nf4"}, {}, {}, {}});
    add({"model.quantize_double", T::Bool, Value(false),
         "with model.quantize = \"nf4\": double quantization (bitsandbytes' bnb_4bit_use_double_quant): each block's "
         "absmax stored as 8 bits with an fp32 scale per 256 blocks (about 0.37 fewer bits a weight)",
         {}, {}, {}, {}});
    add({"lora.adapter", T::String, Value(std::string("")),
         "PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) to apply; empty: none",
         {}, {}, {}, {}});
    add({"data.input", T::String, std::nullopt,
         "input JSONL file; score: {\"tokens\": [ids]}, {\"text\": text} or {\"messages\": [...]} per line; generate: "
         "{\"prompt\": text}, {\"messages\": [{\"role\", \"content\"}]} or {\"prompt_tokens\": [ids]} per line; "
         "dpo: {\"prompt\", \"chosen\", \"rejected\"} per line (docs/dpo.md); kto: {\"prompt\", \"completion\", "
         "\"label\"} or DPO's pairs per line (docs/kto.md); render: {\"messages\": [...]} per line",
         {}, {}, {}, {"score", "generate", "sft", "grpo", "dpo", "kto", "ppo", "distill", "reward", "render"}});
    add({"chat.template", T::String, Value(std::string("")),
         "a Jinja chat template file (.jinja) used instead of the model's own (tokenizer_config.json chat_template or "
         "chat_template.jinja); empty: the model's. Only with chat_format = auto",
         {}, {}, {}, {}});
    add({"chat.template_kwargs", T::String, Value(std::string("{}")),
         "extra variables for the chat template, a JSON object, e.g. '{\"enable_thinking\": false}' (as "
         "apply_chat_template(..., **kwargs))",
         {}, {}, {}, {}});
    add({"lora.r", T::Int, Value(std::int64_t{8}), "LoRA rank", {}, 1.0, 4096.0, {}});
    add({"lora.alpha", T::Float, Value(16.0), "LoRA alpha: the adapter's output is scaled by alpha / r", {}, 0.0, {},
         {}, true});
    add({"lora.dropout", T::Float, Value(0.0), "dropout on the adapter's input while training", {}, 0.0, 0.99, {}});
    add({"lora.use_rslora", T::Bool, Value(false), "scale by alpha / sqrt(r) (rank-stabilised LoRA)", {}, {}, {},
         {}});
    add({"lora.targets", T::StringList,
         Value(std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
         "linear layers that get an adapter", {}, {}, {}, {}});
    add({"train.full_finetune", T::Bool, Value(false),
         "train every weight instead of a LoRA adapter (16 bytes a parameter on the CPU backend, 18 on a GPU)", {}, {},
         {}, {}});
    add({"train.master_weights", T::String, Value(std::string("auto")),
         "full fine-tuning: fp32 master weights that the optimizer updates and checkpoints hold, rounded into the "
         "bf16/fp16 weights after each step: auto (when the weights are not f32, i.e. on a GPU) or always (on the "
         "CPU too: the same path, for checks)",
         {"auto", "always"}, {}, {}, {}});
    add({"train.max_steps", T::Int, Value(std::int64_t{100}), "optimizer steps", {}, 1.0, {}, {}});
    add({"train.num_epochs", T::Float, Value(0.0),
         "the run's length in passes over the training data (trl's num_train_epochs), instead of train.max_steps: "
         "ceil(epochs x ceil(rows / train.batch_size)) optimizer steps (GRPO, as trl's repeat sampler: whole "
         "generation rounds of train.batch_size x grpo.steps_per_generation prompts only, ceil(epochs x "
         "floor(rows / round) x steps_per_generation x num_iterations); PPO: times its epochs x mini-batches); rows are examples (packed rows with train.packing), pairs or prompts; 0: use "
         "train.max_steps",
         {}, 0.0, {}, {}});
    add({"train.max_nonfinite_steps", T::Int, Value(std::int64_t{25}),
         "a step whose loss or gradient norm is not finite changes nothing (skipped on every rank) and writes no "
         "periodic checkpoint; this many in a row stop the run with exit 2 naming the last checkpoint. With loss "
         "scaling, an overflow (gradients not finite at a scale above train.loss_scale_min: skipped, scale halved) "
         "does not count; a non-finite loss, or an overflow at the minimum scale, does. 0: never stop",
         {}, 0.0, {}, {}});
    add({"train.loss_scaling", T::String, Value(std::string("auto")),
         "dynamic loss scaling: the loss is multiplied by a scale before the backward and the gradients divided by it "
         "before clipping and the update; a step whose gradients overflow is skipped on every rank and halves the "
         "scale, train.loss_scale_growth_interval clean steps in a row double it (at most 2^24). auto: dynamic "
         "exactly when the weights are fp16; dynamic: always (on the CPU too: f32 trains the same weights bit for "
         "bit); off: never",
         {"auto", "dynamic", "off"}, {}, {}, {}});
    add({"train.loss_scale_init", T::Float, Value(65536.0),
         "the loss scale a run starts with (a power of two, at most 2^24 = 16777216)", {}, 0.0, 16777216.0, {}});
    add({"train.loss_scale_min", T::Float, Value(1.0),
         "the smallest loss scale (a power of two <= train.loss_scale_init): gradients that overflow at this scale "
         "are a diverged step (train.max_nonfinite_steps), not an overflow", {}, 0.0, 16777216.0, {}});
    add({"train.loss_scale_growth_interval", T::Int, Value(std::int64_t{2000}),
         "clean steps in a row (no overflow, no skipped step) after which the loss scale doubles (2000: torch's "
         "GradScaler default)", {}, 1.0, {}, {}});
    add({"train.stop_at_step", T::Int, Value(std::int64_t{0}),
         "end the run (with a checkpoint) after this step, as a time-limited job would, without changing the "
         "schedule, which still spans max_steps; 0: run to max_steps", {}, 0.0, {}, {}});
    add({"train.batch_size", T::Int, Value(std::int64_t{8}),
         "sequences per optimizer step over all ranks (split over ranks, so 1, 2 or 4 ranks train the same model)",
         {}, 1.0, {}, {}});
    add({"train.grad_accum", T::Int, Value(std::int64_t{1}), "micro-batches per rank per step", {}, 1.0, {}, {}});
    add({"train.lr", T::Float, Value(1e-4), "peak learning rate", {}, 0.0, {}, {}});
    add({"train.schedule", T::String, Value(std::string("linear")),
         "learning-rate schedule, as transformers' lr_scheduler_type of that name: constant (no warmup), "
         "constant_with_warmup, linear or cosine (decay to 0 at max_steps), cosine_with_min_lr (to lr x "
         "train.min_lr_rate)",
         {"constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr"}, {}, {}, {}});
    add({"train.min_lr_rate", T::Float, Value(0.0),
         "cosine_with_min_lr: the final learning rate as a fraction of train.lr (transformers' min_lr_rate)", {}, 0.0,
         1.0, {}});
    add({"train.warmup_steps", T::Int, Value(std::int64_t{0}), "linear warmup steps (wins over warmup_ratio)", {},
         0.0, {}, {}});
    add({"train.warmup_ratio", T::Float, Value(0.0), "warmup as a fraction of max_steps", {}, 0.0, 1.0, {}});
    add({"train.weight_decay", T::Float, Value(0.0), "AdamW decoupled weight decay", {}, 0.0, {}, {}});
    add({"train.adam_beta1", T::Float, Value(0.9), "AdamW beta1", {}, 0.0, 1.0, {}, false, true});
    add({"train.adam_beta2", T::Float, Value(0.999), "AdamW beta2", {}, 0.0, 1.0, {}, false, true});
    add({"train.adam_eps", T::Float, Value(1e-8), "AdamW epsilon", {}, 0.0, {}, {}, true});
    add({"train.max_grad_norm", T::Float, Value(1.0), "clip the global gradient norm to this; 0: no clipping", {},
         0.0, {}, {}});
    add({"train.seed", T::Int, Value(std::int64_t{0}), "seed of the data order, LoRA initialisation and dropout", {},
         0.0, {}, {}});
    add({"train.max_seq_len", T::Int, Value(std::int64_t{2048}),
         "longest training sequence in tokens; longer completions are cut", {}, 2.0, {}, {}});
    add({"train.chat_format", T::String, Value(std::string("auto")),
         "how {\"messages\"} examples become text: auto (the model's own chat template, or chat.template), or a "
         "built-in format for models without one: chatml, llama3 or none",
         {"auto", "chatml", "llama3", "none"}, {}, {}, {}});
    add({"train.neftune_noise_alpha", T::Float, Value(0.0),
         "SFT: NEFTune (Jain et al. 2023; trl's and transformers' neftune_noise_alpha, e.g. 5): uniform noise of "
         "magnitude alpha / sqrt(L x hidden_size) added to the input embeddings of every training forward, L the "
         "example's own length (transformers uses the padded length of the device's batch, which depends on the "
         "batching), drawn per token so that any rank count adds the same; evaluation and the exported model see "
         "none; 0: off",
         {}, 0.0, 1e6, {}});
    add({"data.shuffle", T::Bool, Value(true),
         "training: each epoch's examples (SFT rows, DPO pairs, GRPO and PPO prompts) in a random order seeded by "
         "train.seed, a new one each epoch, as transformers' and trl's samplers draw them; false: in the data file's "
         "order (with train.packing the packed rows' order), epoch after epoch (trl's shuffle_dataset = False, e.g. "
         "for a curriculum)",
         {}, {}, {}, {}});
    add({"data.text_field", T::String, Value(std::string("text")),
         "SFT: the key of a language-modeling line's text, {\"text\": ...} by default (trl's dataset_text_field)", {}, {},
         {}, {}});
    add({"train.eos_token", T::String, Value(std::string("")),
         "SFT: the token appended to completions and texts in place of the tokenizer's EOS (trl's "
         "SFTConfig.eos_token, e.g. \"<|im_end|>\" for a base model trained to chat); \"\": the tokenizer's",
         {}, {}, {}, {}});
    add({"train.loss_type", T::String, Value(std::string("nll")),
         "SFT's loss, as trl's SFTConfig.loss_type: nll (the mean negative log-likelihood of the loss tokens) or dft "
         "(each token's term times its probability under the model, taken as a constant: Dynamic Fine-Tuning)",
         {"nll", "dft"}, {}, {}, {}});
    add({"train.completion_only_loss", T::Bool, Value(true),
         "SFT: the loss covers the completion ({\"prompt\", \"completion\"}) or the assistant turns ({\"messages\"}) "
         "only; false: every token but the first, the prompt too (trl's completion_only_loss = False, and trl's default "
         "for {\"messages\"}, whose assistant_only_loss is off). {\"text\"} examples are trained whole either way",
         {}, {}, {}, {}});
    add({"train.packing", T::Bool, Value(false),
         "SFT: pack the examples into rows of up to train.max_seq_len tokens by best fit decreasing, as trl's "
         "packing = True (packing_strategy = \"bfd\"); train.batch_size then counts rows. Each example keeps its own "
         "attention and positions, as in trl's padding-free packing",
         {}, {}, {}, {}});
    add({"eval.input", T::String, Value(std::string("")), "held-out JSONL (same format as data.input); empty: none",
         {}, {}, {}, {}});
    add({"eval.every_steps", T::Int, Value(std::int64_t{0}), "held-out loss every N steps; 0: only at the end", {},
         0.0, {}, {}});
    add({"eval.batch_size", T::Int, Value(std::int64_t{16}), "sequences per forward pass in evaluation", {}, 1.0, {},
         {}});
    add({"eval.accuracy", T::Bool, Value(false),
         "at the end, greedy-generate every held-out completion and report exact-match accuracy", {}, {}, {}, {}});
    add({"eval.pass_k", T::Int, Value(std::int64_t{0}),
         "grpo: also report pass@k on the held-out prompts from eval.num_samples sampled completions each; 0: off",
         {}, 0.0, {}, {}});
    add({"eval.num_samples", T::Int, Value(std::int64_t{0}),
         "grpo: completions sampled per held-out prompt for pass@k (at grpo.temperature); 0: eval.pass_k", {}, 0.0,
         {}, {}});
    add({"eval.accuracy_reward", T::String, Value(std::string("")),
         "grpo: the reward (by name) whose full credit (>= 1) counts as a correct completion; empty: the first "
         "answer_match or code_exec reward", {}, {}, {}, {}});
    add({"eval.max_new_tokens", T::Int, Value(std::int64_t{32}), "longest generated completion for eval.accuracy",
         {}, 1.0, {}, {}});
    add({"checkpoint.dir", T::String, Value(std::string("")),
         "directory of step_<8 digits>.h5 checkpoints; empty: no checkpoints", {}, {}, {}, {}});
    add({"checkpoint.every_steps", T::Int, Value(std::int64_t{0}), "checkpoint every N steps (and at the end); 0: "
         "only at the end", {}, 0.0, {}, {}});
    add({"checkpoint.keep_last", T::Int, Value(std::int64_t{0}),
         "keep only the newest K intact checkpoints (damaged ones are set aside as <file>.damaged); 0: all", {}, 0.0,
         {}, {}});
    add({"checkpoint.resume", T::String, Value(std::string("auto")),
         "auto: continue from the newest complete checkpoint of checkpoint.dir if there is one; none; or a path",
         {}, {}, {}, {}});
    add({"checkpoint.allow_other_base", T::Bool, Value(false),
         "resume a checkpoint written over other base weights than this run's (model.path or model.init); false: "
         "refused naming the first base tensor that differs", {}, {}, {}, {}});
    add({"export.checkpoint", T::String, Value(std::string("auto")),
         "checkpoint to export: a path, or auto (the newest of checkpoint.dir; when it is damaged, export stops and names "
         "the newest intact one)", {}, {}, {}, {}});
    add({"export.output", T::String, std::nullopt,
         "output directory: a PEFT adapter (adapter_config.json + adapter_model.safetensors), or the full model",
         {}, {}, {}, {"export"}});
    add({"export.merged", T::Bool, Value(false),
         "also write <export.output>/merged: a Hugging Face model directory with the adapter merged into the weights",
         {}, {}, {}, {}});
    add({"export.merged_dtype", T::String, Value(std::string("auto")),
         "dtype of the merged model's weights: auto keeps each base tensor's (f32, bf16 or f16; a bitsandbytes 4-bit "
         "projection's: bfloat16), or one for all", {"auto", "float32", "bfloat16", "float16"}, {}, {}, {}});
    add({"score.output", T::String, std::nullopt,
         "output HDF5 file: tokens, lengths and logprobs (see docs/score.md)", {}, {}, {}, {"score"}});
    add({"score.batch_size", T::Int, Value(std::int64_t{8}), "sequences per forward pass on each rank", {}, 1.0,
         {}, {}});
    add({"generate.output", T::String, std::nullopt, "output JSONL file, one line per completion (docs/generate.md)",
         {}, {}, {}, {"generate"}});
    add({"generate.max_new_tokens", T::Int, Value(std::int64_t{256}), "most tokens generated per completion", {},
         1.0, {}, {}});
    add({"generate.num_generations", T::Int, Value(std::int64_t{1}),
         "completions per prompt; they share one prefill of the prompt", {}, 1.0, {}, {}});
    add({"generate.temperature", T::Float, Value(1.0), "sampling temperature; 0: greedy", {}, 0.0, {}, {}});
    add({"generate.top_k", T::Int, Value(std::int64_t{0}), "sample among the k most likely tokens; 0: off", {}, 0.0,
         {}, {}});
    add({"generate.top_p", T::Float, Value(1.0),
         "sample among the most likely tokens whose probability reaches top_p; 1: off", {}, 0.0, 1.0, {}});
    add({"generate.min_p", T::Float, Value(0.0),
         "drop tokens less likely than min_p times the most likely one; 0: off", {}, 0.0, 1.0, {}});
    add({"generate.use_generation_config", T::Bool, Value(true),
         "sampling keys not given (temperature, top_k, top_p, min_p, repetition_penalty) take the model's "
         "generation_config.json values as transformers' generate reads them (do_sample false: greedy; sampling: its "
         "top_k, else transformers' 50); false, or no such file: the defaults here",
         {}, {}, {}, {}});
    add({"generate.repetition_penalty", T::Float, Value(1.0),
         "the logits of the tokens already in the prompt or completion are divided by it (positive ones) or "
         "multiplied by it (negative ones) before sampling, as transformers' and vLLM's repetition_penalty; 1: off",
         {}, 1e-6, {}, {}});
    add({"generate.seed", T::Int, Value(std::int64_t{0}),
         "sampling seed; a completion depends only on it, its prompt's index and its own index", {}, 0.0, {}, {}});
    add({"generate.stop", T::StringList, Value(std::vector<std::string>{}),
         "strings that end a completion (cut from its text)", {}, {}, {}, {}});
    add({"generate.chat_format", T::String, Value(std::string("auto")),
         "how {\"messages\"} inputs become text: auto (the model's own chat template, or chat.template), or a "
         "built-in format for models without one: chatml, llama3 or none",
         {"auto", "chatml", "llama3", "none"}, {}, {}, {}});
    add({"generate.max_sequences", T::Int, Value(std::int64_t{64}),
         "sequences generated at once on each rank (KV-cache slots)", {}, 1.0, {}, {}});
    add({"generate.max_prefill_tokens", T::Int, Value(std::int64_t{2048}),
         "prompt tokens prefilled per generation step beside the running decodes (longer prompts in chunks)", {},
         1.0, {}, {}});
    add({"generate.kv_block_size", T::Int, Value(std::int64_t{16}),
         "positions per KV-cache block (a prompt's blocks are shared by its completions)", {}, 1.0, 4096.0, {}});
    add({"generate.sync_interval", T::Int, Value(std::int64_t{8}),
         "decode steps run back to back on the device, with no host round trip, while no prompt can be admitted "
         "(sampled tokens, EOS and length stay on the device; stop strings, freed slots and admissions wait for the "
         "download every this many steps); 1: a round trip per step. Results do not depend on it",
         {}, 1.0, 1024.0, {}});
    add({"generate.merge_lora", T::String, Value(std::string("auto")),
         "sample from the LoRA adapter merged into the base weights (W + scale B A of the adapted projections, "
         "refreshed before every generation; one more copy of them in memory; changes only which tokens are drawn, "
         "by the rounding of the merged weights): auto (on the CUDA backend with a dense, unsharded base when the copy "
         "takes at most 1/8 of the free device memory; unmerged, with a warning, otherwise), on (any backend; refused with an NF4 or sharded base), off",
         {"auto", "on", "off"}, {}, {}, {}});
    add({"plan.gpus", T::Int, Value(std::int64_t{1}),
         "plan: the ranks (GPUs) of the planned job; `mgrl plan --gpus N` sets it", {}, 1.0, 65536.0, {}});
    add({"plan.gpu_memory", T::String, Value(std::string("80GiB")),
         "plan: memory of one GPU (or, with plan.target = \"cpu\", of one rank's share of the host) to fit, e.g. "
         "80GiB, 141GB, 16GiB; `mgrl plan --gpu-memory 80GiB` sets it",
         {}, {}, {}, {}});
    add({"plan.target", T::String, Value(std::string("cuda")),
         "plan: the backend planned for: cuda (bf16/fp16 storage, CUDA context and cuBLAS workspace) or cpu (f32 "
         "storage, peak host memory of the process)",
         {"cuda", "cpu"}, {}, {}, {}});
    add({"plan.json", T::Bool, Value(false), "plan: print the plan as one JSON object instead of a table; `mgrl plan "
         "--json` sets it", {}, {}, {}, {}});
    add({"grpo.num_generations", T::Int, Value(std::int64_t{8}),
         "completions sampled per prompt (the group G); they share one prefill of the prompt", {}, 2.0, {}, {}});
    add({"grpo.max_prompt_length", T::Int, Value(std::int64_t{512}),
         "longest prompt in tokens; longer prompts keep their last tokens (mgrl's limit: trl 1.16's GRPOTrainer "
         "keeps whole prompts)", {},
         1.0, {}, {}});
    add({"grpo.max_completion_length", T::Int, Value(std::int64_t{512}),
         "most tokens generated per completion (trl's default, 512; 256 until 2026-11-29); a completion that reaches it "
         "without EOS is truncated", {}, 1.0, {}, {}});
    add({"grpo.temperature", T::Float, Value(1.0),
         "sampling temperature; the policy's log-probs in the loss use the same temperature (as TRL)", {}, 1e-6, {},
         {}});
    add({"grpo.top_p", T::Float, Value(1.0), "nucleus sampling; 1: off", {}, 0.0, 1.0, {}});
    add({"grpo.top_k", T::Int, Value(std::int64_t{0}), "sample among the k most likely tokens; 0: off", {}, 0.0, {},
         {}});
    add({"grpo.min_p", T::Float, Value(0.0), "drop tokens less likely than min_p times the most likely; 0: off", {},
         0.0, 1.0, {}});
    add({"grpo.repetition_penalty", T::Float, Value(1.0),
         "trl's repetition_penalty: the logits of the tokens already in the prompt or completion are divided by it "
         "(positive ones) or multiplied by it (negative ones) before sampling; 1: off. The loss's log-probs are the "
         "model's, as trl's",
         {}, 1e-6, {}, {}});
    add({"grpo.stop", T::StringList, Value(std::vector<std::string>{}),
         "strings that end a completion (cut from its text; its tokens are kept)", {}, {}, {}, {}});
    add({"grpo.beta", T::Float, Value(0.0),
         "weight of the KL penalty (k3 estimator) against grpo.reference; 0: no reference pass at all", {}, 0.0,
         {}, {}});
    add({"grpo.kl_bias_correction", T::Bool, Value(true),
         "multiply the per-token KL by the importance ratio (TRL's use_bias_correction_kl, whose default is true in "
         "trl 1.16; mgrl's was false until 2026-11-28); only with beta > 0", {}, {}, {}, {}});
    add({"grpo.reference", T::String, Value(std::string("initial")),
         "reference policy of the KL term: initial (the policy at the start of the run: base model + starting "
         "adapter, kept as a frozen copy of the adapter only) or base (the adapter switched off)",
         {"initial", "base"}, {}, {}, {}});
    // TR-DPO (trl's sync_ref_model): the reference policy moves towards the policy, for dpo, kto and grpo.
    const auto add_sync_ref = [&add](const std::string& mode) {
      add({mode + ".sync_ref_model", T::Bool, Value(false),
           "TR-DPO (trl's sync_ref_model): every " + mode + ".ref_model_sync_steps steps the reference policy becomes "
           "(1 - alpha) reference + alpha policy (alpha = " + mode + ".ref_model_mixup_alpha), weight by weight: "
           "the full model with train.full_finetune, the adapter's A and B with LoRA (trl: full fine-tuning only). "
           "The reference is then a copy of the trainable weights (8 bytes a value), kept in every checkpoint",
           {}, {}, {}, {}});
      add({mode + ".ref_model_mixup_alpha", T::Float, Value(0.6),
           "TR-DPO's alpha: the policy's share of the reference at a sync (" + mode + ".sync_ref_model)", {}, 0.0,
           1.0, {}});
      add({mode + ".ref_model_sync_steps", T::Int, Value(std::int64_t{512}),
           "TR-DPO's tau: optimizer steps between two syncs of the reference (" + mode + ".sync_ref_model)", {}, 1.0,
           {}, {}});
    };
    add_sync_ref("grpo");
    add({"grpo.epsilon", T::Float, Value(0.2), "lower clipping range: ratios below 1 - epsilon are clipped", {}, 0.0,
         1.0, {}});
    add({"grpo.epsilon_high", T::Float, Value(0.0),
         "upper clipping range (ratios above 1 + epsilon_high are clipped; DAPO's clip-higher); with loss_type = "
         "cispo the cap of the ratio's weight itself (CISPO's epsilon_max, e.g. 5.0); 0: epsilon", {},
         0.0, {}, {}});
    add({"grpo.delta", T::Float, Value(0.0),
         "two-sided clipping (INTELLECT-2; trl's delta): the unclipped ratio is capped at delta too, which bounds the "
         "loss of negative advantages; > 1 + epsilon_high recommended; 0: off", {}, 0.0, {}, {}});
    add({"grpo.off_policy_mask_threshold", T::Float, Value(0.0),
         "off-policy sequence masking (DeepSeek-V3.2; trl's off_policy_mask_threshold, e.g. 0.5): a completion with a "
         "negative advantage whose mean log-prob drop from the old policy to the current one exceeds this gets no "
         "policy loss (its KL term stays); acts from the second step of a generation round (num_iterations or steps_per_generation > 1); 0: off",
         {}, 0.0, {}, {}});
    add({"grpo.top_entropy_quantile", T::Float, Value(1.0),
         "trl's top_entropy_quantile (\"Beyond the 80/20 rule\", Wang et al. 2025): only the tokens whose entropy reaches "
         "this quantile from the top (0.2: the 20% most uncertain) of each micro-batch (every rank's) get the policy "
         "loss; the KL term and the normalisers are unchanged; 1: every token",
         {}, 1e-6, 1.0, {}});
    add({"grpo.loss_type", T::String, Value(std::string("dapo")),
         "the objective and its normalisation (as trl): grpo (per-sequence token mean, then mean over sequences), "
         "bnpo (tokens of each micro-batch), dr_grpo (sequences x max_completion_length), dapo (tokens of the whole "
         "batch), luspo (per-sequence token sum, mean over sequences); cispo (the ratio's weight capped at "
         "epsilon_high and detached, times the log-prob; normalised as dapo); sapo (a sigmoid gate of temperature "
         "sapo_temperature_pos / _neg instead of the clip; normalised as grpo); vespo (the log-prob weighted by a "
         "gamma function of the sequence's importance ratio, vespo_k_* / vespo_lambda_*; normalised as dapo); rloo "
         "(trl's RLOOTrainer: leave-one-out advantages, each completion's reward minus the mean of the others of its "
         "group, with beta x its summed KL to the reference (k1) subtracted from its reward; the ratio of the summed "
         "log-probs of the completion, clipped; the mean over completions; grpo.normalize_advantages and "
         "grpo.reward_clip_min / max)",
         {"grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo", "rloo"}, {}, {}, {}});
    add({"grpo.normalize_advantages", T::Bool, Value(false),
         "rloo: the advantages normalised over each generation round (mean 0, std 1: (A - mean) / (std + 1e-4)), as "
         "trl's RLOOConfig.normalize_advantages",
         {}, {}, {}, {}});
    // (finite defaults: no key takes inf, config.cpp)
    add({"grpo.reward_clip_min", T::Float, Value(-1e30),
         "rloo: rewards below this are raised to it before the KL penalty and the advantages (trl's reward_clip_range "
         "= (min, max)); the default: none",
         {}, {}, {}, {}});
    add({"grpo.reward_clip_max", T::Float, Value(1e30),
         "rloo: rewards above this are lowered to it (trl's reward_clip_range); the default: none", {}, {}, {}, {}});
    add({"grpo.vespo_k_pos", T::Float, Value(2.0),
         "vespo: the power k of the gamma weight e^lambda w^k e^(-lambda w) for advantages >= 0", {}, {}, {}, {}});
    add({"grpo.vespo_lambda_pos", T::Float, Value(3.0), "vespo: the decay lambda for advantages >= 0", {}, {}, {},
         {}});
    add({"grpo.vespo_k_neg", T::Float, Value(3.0), "vespo: the power k for negative advantages", {}, {}, {}, {}});
    add({"grpo.vespo_lambda_neg", T::Float, Value(2.0), "vespo: the decay lambda for negative advantages", {}, {},
         {}, {}});
    add({"grpo.sapo_temperature_pos", T::Float, Value(1.0), "sapo: the gate's temperature for positive advantages",
         {}, 0.0, {}, {}, true});
    add({"grpo.sapo_temperature_neg", T::Float, Value(1.05),
         "sapo: the gate's temperature for zero or negative advantages", {}, 0.0, {}, {}, true});
    add({"grpo.scale_rewards", T::String, Value(std::string("group")),
         "advantages = reward - group mean, divided by the std of the group, of the batch, or by nothing (none)",
         {"group", "batch", "none"}, {}, {}, {}});
    add({"grpo.multi_objective_aggregation", T::String, Value(std::string("sum_then_normalize")),
         "several rewards: sum_then_normalize (the advantages of their weighted sum, per scale_rewards) or "
         "normalize_then_sum (GDPO: each reward normalised within its group, the weighted sum then normalised over "
         "the batch; scale_rewards not used)",
         {"sum_then_normalize", "normalize_then_sum"}, {}, {}, {}});
    add({"grpo.entropy_coef", T::Float, Value(0.0),
         "trl's entropy bonus: the loss minus entropy_coef x the mean entropy (of the tempered distributions) over each "
         "micro-batch's completion tokens that the policy loss covers (the top_entropy_quantile ones when set), divided "
         "by train.grad_accum, whatever grpo.loss_type; 0: none (with use_adaptive_entropy: the starting coefficient)",
         {}, {}, {}, {}});
    add({"grpo.use_adaptive_entropy", T::Bool, Value(false),
         "adaptive entropy control (Skywork-OR1, trl's): after each step grpo.entropy_coef moves by "
         "grpo.entropy_coef_delta, up when the step's mean entropy (every rank's tokens) is at most "
         "grpo.entropy_target, down otherwise, within [grpo.entropy_coef_min, grpo.entropy_coef_max]; the bonus applies "
         "only while the last step's entropy was at most the target (not at the first step); the coefficient and that "
         "entropy are kept in checkpoints",
         {}, {}, {}, {}});
    add({"grpo.entropy_coef_min", T::Float, Value(0.0), "adaptive entropy control: the lowest coefficient", {}, {}, {}, {}});
    add({"grpo.entropy_coef_max", T::Float, Value(1.0), "adaptive entropy control: the highest coefficient", {}, {}, {}, {}});
    add({"grpo.entropy_coef_delta", T::Float, Value(0.005), "adaptive entropy control: the step of the coefficient",
         {}, 0.0, {}, {}});
    add({"grpo.entropy_target", T::Float, Value(0.2),
         "adaptive entropy control: the mean per-token entropy (nats) at or below which the bonus applies and grows "
         "(trl's default 0.2 hardly ever triggers: set it near the entropy the run logs early)",
         {}, 0.0, {}, {}});
    add({"grpo.num_iterations", T::Int, Value(std::int64_t{1}),
         "optimizer steps per generated batch (mu); old log-probs are computed once per batch", {}, 1.0, {}, {}});
    add({"grpo.steps_per_generation", T::Int, Value(std::int64_t{1}),
         "optimizer steps that share one generation round (trl's steps_per_generation / gradient_accumulation_steps: "
         "mgrl counts optimizer steps): a round samples steps_per_generation x train.batch_size prompts, shuffles "
         "their completions after the advantages (a seeded permutation of the whole round, the same on any rank "
         "count; trl shuffles each process's share), and trains one slice of train.batch_size x num_generations "
         "completions per step, num_iterations times over; the round's later steps use the old policy's log-probs "
         "(computed once per round), and dapo, cispo and vespo normalise by the round's tokens / "
         "steps_per_generation, as trl. The round's reward and length metrics are logged on each of its steps. "
         "Fewer, larger generations: faster on GPUs, more off-policy",
         {}, 1.0, 65536.0, {}});
    add({"grpo.mask_truncated_completions", T::Bool, Value(false),
         "truncated completions (no EOS within max_completion_length) get no loss", {}, {}, {}, {}});
    add({"grpo.balance", T::String, Value(std::string("tokens")),
         "how prompts (for generation) and completions (for training) are split over ranks: tokens balances the "
         "expected tokens of each rank (lengths seen in earlier rounds; the round's own lengths for training), none "
         "gives rank r the r-th block; the trained result does not depend on it",
         {"tokens", "none"}, {}, {}, {}});
    add({"grpo.importance_sampling_level", T::String, Value(std::string("token")),
         "importance ratio per token (GRPO) or per sequence (GSPO: the exp of the mean token log-ratio)",
         {"token", "sequence"}, {}, {}, {}});
    add({"dpo.loss_type", T::String, Value(std::string("sigmoid")),
         "DPO loss per pair, as trl names it: sigmoid (DPO), hinge (SLiC), ipo, robust (label_smoothing as the flip "
         "probability), sigmoid_norm (sigmoid on the per-token log-ratios), exo_pair (EXO; label_smoothing as its "
         "epsilon, e.g. 1e-3), nca_pair, bco_pair, sppo_hard, apo_zero, apo_down (APO), discopop (discopop_tau), "
         "aot or aot_unpaired (AOT: sorted log-ratios over each rank's micro-batch, as trl's over each device's, so "
         "the loss depends on the batch's split; label_smoothing applies)",
         {"sigmoid", "hinge", "ipo", "robust", "sigmoid_norm", "exo_pair", "nca_pair", "bco_pair", "sppo_hard",
          "apo_zero", "apo_down", "discopop", "aot", "aot_unpaired"},
         {}, {}, {}});
    add({"dpo.loss_mix", T::StringList, Value(std::vector<std::string>{}),
         "several loss types with weights, as trl's loss_type list with loss_weights: \"type:weight\" items (weight "
         "absent: 1), \"sft:w\" for the sft term; MPO is [\"sigmoid:0.8\", \"bco_pair:0.2\", \"sft:1\"]. Given, "
         "dpo.loss_type and dpo.sft_weight are not",
         {}, {}, {}, {}});
    add({"dpo.f_divergence_type", T::String, Value(std::string("reverse_kl")),
         "f-DPO's divergence (trl's f_divergence_type): reverse_kl (DPO), forward_kl, js_divergence or "
         "alpha_divergence (f_alpha_divergence_coef); not with the losses of each side (nca_pair, bco_pair, sppo_hard, "
         "apo_zero, apo_down)",
         {"reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"}, {}, {}, {}});
    add({"dpo.f_alpha_divergence_coef", T::Float, Value(0.5), "alpha_divergence: its alpha", {}, {}, {}, {}});
    add({"dpo.discopop_tau", T::Float, Value(0.05),
         "discopop: the temperature of the log-ratio modulation (the paper's 0.05)", {}, 0.0, {}, {}, true});
    add({"dpo.disable_dropout", T::Bool, Value(true),
         "turn LoRA dropout off in DPO, as trl's disable_dropout (default true) does: lora.dropout, or an adapter's "
         "lora_dropout, applies only when false", {}, {}, {}, {"dpo"}});
    add({"dpo.beta", T::Float, Value(0.1),
         "how far the policy may move from the reference (higher: less); ipo: the regulariser tau", {}, 1e-12, {},
         {}});
    add({"dpo.label_smoothing", T::Float, Value(0.0),
         "robust: the probability that a pair's preference is flipped, in [0, 0.5); exo_pair: its epsilon (> 0)", {},
         0.0, 0.5, {}});
    add({"dpo.sft_weight", T::Float, Value(0.0),
         "weight of trl's sft loss added to the pair loss (RPO): the mean negative log-prob of the chosen completions' "
         "tokens over the batch (trl: loss_type = [type, \"sft\"], loss_weights = [1, w]); 0: none", {}, 0.0, {}, {}});
    add({"dpo.ld_alpha", T::Float, Value(1.0),
         "LD-DPO: weight of the completion tokens beyond the shorter completion's length in the sequence log-probs; "
         "1: none (plain DPO)", {}, 0.0, 1.0, {}});
    add({"dpo.use_weighting", T::Bool, Value(false),
         "WPO (weighted preference optimisation, trl's use_weighting): each pair's loss times the product, over its "
         "chosen and rejected completions, of exp(the mean over the completion's tokens of log p - log sum_v p_v^2) "
         "under the policy (detached): off-policy pairs the policy finds unlikely weigh less; not with aot / "
         "aot_unpaired (as trl) nor an sft term",
         {}, {}, {}, {}});
    add({"dpo.max_length", T::Int, Value(std::int64_t{1024}),
         "longest sequence (prompt + completion) in tokens: longer ones keep their start; pairs whose prompt alone "
         "is this long are left out (as trl)", {}, 2.0, {}, {}});
    add({"dpo.precompute_ref_log_probs", T::Bool, Value(false),
         "compute the reference log-probs of every pair once before training instead of once per batch (always so "
         "with full fine-tuning or a starting lora.adapter, whose reference is the starting weights)", {}, {}, {},
         {}});
    // [distill] (docs/distill.md): trl's DistillationTrainer (trl 1.16) under its names and defaults.
    add({"distill.teacher", T::String, std::nullopt,
         "the teacher: a Hugging Face model directory (config.json, safetensors) of the student's vocabulary, any width "
         "or depth; frozen, in the student's dtype (NF4 projections: distill.teacher_quantize or a bitsandbytes 4-bit "
         "directory); sharded over the ranks with model.shard_base", {}, {}, {}, {"distill"}});
    add({"distill.teacher_quantize", T::String, Value(std::string("none")),
         "the teacher's projections quantized at load: none, or nf4 (4-bit NormalFloat in bitsandbytes' layout, as "
         "model.quantize: trl's teacher_model_init_kwargs with a BitsAndBytesConfig); a teacher directory that "
         "transformers saved in bitsandbytes 4-bit form is read as NF4 whatever this says",
         {"none", "nf4"}, {}, {}, {}});
    add({"distill.teacher_quantize_double", T::Bool, Value(false),
         "with distill.teacher_quantize = \"nf4\": double quantization of the teacher's absmax (as "
         "model.quantize_double)", {}, {}, {}, {}});
    add({"distill.beta", T::Float, Value(1.0),
         "the divergence: 0 forward KL(teacher || student), 1 reverse KL(student || teacher) (trl's default), between: "
         "the generalized JSD with the mixture (1 - beta) p_student + beta p_teacher", {}, 0.0, 1.0, {}});
    add({"distill.temperature", T::Float, Value(1.0),
         "sampling temperature of the student's completions, and of both models' distributions in the divergence (as "
         "trl)", {}, 1e-6, {}, {}});
    add({"distill.max_prompt_length", T::Int, Value(std::int64_t{512}),
         "longest prompt in tokens; longer prompts keep their last tokens", {}, 1.0, {}, {}});
    add({"distill.max_completion_length", T::Int, Value(std::int64_t{512}),
         "most tokens the student generates per completion (trl's default)", {}, 1.0, {}, {}});
    add({"distill.top_p", T::Float, Value(1.0), "nucleus sampling; 1: off", {}, 0.0, 1.0, {}});
    add({"distill.top_k", T::Int, Value(std::int64_t{0}), "sample among the k most likely tokens; 0: off", {}, 0.0,
         {}, {}});
    add({"distill.min_p", T::Float, Value(0.0), "drop tokens less likely than min_p times the most likely; 0: off",
         {}, 0.0, 1.0, {}});
    add({"distill.repetition_penalty", T::Float, Value(1.0),
         "trl's repetition_penalty in the student's sampling; 1: off", {}, 1e-6, {}, {}});
    add({"distill.stop", T::StringList, Value(std::vector<std::string>{}),
         "strings that end a completion (its tokens up to there are kept)", {}, {}, {}, {}});
    add_sync_ref("dpo");
    // [kto] (docs/kto.md): trl's KTOTrainer (trl 1.16) under its names and defaults.
    add({"kto.loss_type", T::String, Value(std::string("kto")),
         "kto (the KTO paper's loss, against a KL estimate from each example's prompt with another's completion) or "
         "apo_zero_unpaired (APO-zero, unpaired: no KL estimate and no KL sequences, a micro-batch of one allowed)",
         {"kto", "apo_zero_unpaired"}, {}, {}, {}});
    add({"kto.beta", T::Float, Value(0.1),
         "how far the policy may move from the reference (higher: less): the scale of the log-ratios in the sigmoids",
         {}, 1e-12, {}, {}});
    add({"kto.desirable_weight", T::Float, Value(1.0),
         "weight of the desirable examples' losses (trl: raise it, or lower undesirable_weight, when desirable examples "
         "are fewer, so that desirable_weight x their count / undesirable_weight x theirs lies in [1, 4/3])",
         {}, 0.0, {}, {}});
    add({"kto.undesirable_weight", T::Float, Value(1.0), "weight of the undesirable examples' losses", {}, 0.0, {}, {}});
    add_sync_ref("kto");
    add({"kto.max_length", T::Int, Value(std::int64_t{1024}),
         "longest sequence (prompt + completion, and prompt + KL completion) in tokens: longer ones keep their start; "
         "examples whose prompt alone is this long are left out (as trl)", {}, 2.0, {}, {}});
    add({"kto.disable_dropout", T::Bool, Value(true),
         "turn LoRA dropout off in KTO, as trl's disable_dropout (default true) does", {}, {}, {}, {"kto"}});
    // [ppo] (docs/ppo.md): trl's PPOTrainer (trl.experimental.ppo, trl 1.12.0) under its names and defaults.
    add({"ppo.max_prompt_length", T::Int, Value(std::int64_t{512}),
         "longest prompt in tokens; longer prompts keep their last tokens", {}, 1.0, {}, {}});
    add({"ppo.response_length", T::Int, Value(std::int64_t{53}),
         "most tokens generated per response; a response that stops (EOS) before it also gets a value at the state "
         "after its last token, where its score is placed", {}, 1.0, {}, {}});
    add({"ppo.temperature", T::Float, Value(0.7),
         "sampling temperature; the policy's and the reference's log-probs use the same temperature (as trl)", {},
         1e-6, {}, {}});
    add({"ppo.kl_coef", T::Float, Value(0.05),
         "weight of the per-token KL penalty in the rewards: r_t = -kl_coef * kl_t, plus the score at the last "
         "position; with ppo.kl_target > 0 the starting value of the adaptive coefficient", {}, 0.0, {}, {}});
    add({"ppo.kl_target", T::Float, Value(0.0),
         "target KL of the adaptive KL controller (Ziegler et al. 2019, trl 0.x's AdaptiveKLController): after each "
         "rollout batch kl_coef <- kl_coef * (1 + clip(KL / kl_target - 1, -0.2, 0.2) * train.batch_size / "
         "ppo.kl_horizon), KL the batch's mean summed per-token KL (objective/kl); 0: kl_coef stays fixed", {}, 0.0,
         {}, {}});
    add({"ppo.kl_horizon", T::Float, Value(10000.0),
         "horizon of the adaptive KL controller in sampled responses (trl 0.x's horizon): the larger, the slower "
         "kl_coef moves", {}, 1.0, {}, {}});
    add({"ppo.kl_estimator", T::String, Value(std::string("k1")),
         "per-token KL estimate against the reference (the adapter switched off): k1 = logp - ref_logp, k3 = "
         "exp(ref_logp - logp) - 1 - (ref_logp - logp)", {"k1", "k3"}, {}, {}, {}});
    add({"ppo.missing_eos_penalty", T::Float, Value(0.0),
         "subtracted from the score of a response that has no EOS (reached response_length); 0: none", {}, 0.0, {},
         {}});
    add({"ppo.whiten_rewards", T::Bool, Value(false),
         "whiten the per-token rewards over the batch (unit variance, mean kept) before GAE", {}, {}, {}, {}});
    add({"ppo.gamma", T::Float, Value(1.0), "discount factor of the returns", {}, 0.0, 1.0, {}});
    add({"ppo.lam", T::Float, Value(0.95), "GAE lambda (1: Monte Carlo returns minus values; 0: one-step TD)", {}, 0.0,
         1.0, {}});
    add({"ppo.cliprange", T::Float, Value(0.2),
         "policy ratios outside [1 - cliprange, 1 + cliprange] are clipped in the loss", {}, 0.0, {}, {}});
    add({"ppo.cliprange_value", T::Float, Value(0.2),
         "value predictions are clipped to the rollout's value +- cliprange_value in the value loss", {}, 0.0, {}, {}});
    add({"ppo.vf_coef", T::Float, Value(0.1), "weight of the value loss: loss = policy loss + vf_coef * value loss", {},
         0.0, {}, {}});
    add({"ppo.num_ppo_epochs", T::Int, Value(std::int64_t{4}),
         "passes over each rollout batch, each in a fresh random order of its sequences", {}, 1.0, {}, {}});
    add({"ppo.num_mini_batches", T::Int, Value(std::int64_t{1}),
         "mini-batches (optimizer steps) per pass; must divide the rollout batch (train.batch_size)", {}, 1.0, {},
         {}});
    add({"ppo.value_lr", T::Float, Value(0.0),
         "learning rate of the value head (a linear layer on the policy's last hidden state, AdamW of its own); 0: "
         "train.lr", {}, 0.0, {}, {}});
    add({"rollouts.every_steps", T::Int, Value(std::int64_t{1}),
         "write <log.dir>/rollouts/step_<8 digits>.h5 for the generation rounds whose steps reach a multiple of N (and "
         "the first and the last); 0: never", {}, 0.0, {}, {}});
    // [[reward]] tables (docs/rewards.md): one reward function each; the total reward is their weighted sum.
    add({"reward[].kind", T::String, std::nullopt, "answer_match, regex, overlong, code_exec or command",
         {"answer_match", "regex", "overlong", "code_exec", "command"}, {}, {}, {}});
    add({"reward[].name", T::String, Value(std::string("")), "name in logs and rollout files; empty: the kind", {}, {},
         {}, {}});
    add({"reward[].weight", T::Float, Value(1.0), "weight in the total reward", {}, {}, {}, {}});
    add({"reward[].extract", T::String, Value(std::string("last_number")),
         "answer_match: how the answer is taken from the completion: last_number, boxed (the last \\boxed{...}) or "
         "regex (the first capture group of pattern)", {"last_number", "boxed", "regex"}, {}, {}, {}});
    add({"reward[].pattern", T::String, Value(std::string("")),
         "regex: the pattern a completion must match; answer_match with extract = regex: a pattern with one capture "
         "group (ECMAScript syntax; '.' matches newlines too)", {}, {}, {}, {}});
    add({"reward[].full_match", T::Bool, Value(false), "regex: the whole completion must match (else: a match anywhere)",
         {}, {}, {}, {}});
    add({"reward[].match_start", T::Bool, Value(false),
         "regex: the match must start at the completion's start, as Python's re.match (open-r1's and trl's format "
         "rewards); without it, or full_match, '^' may match at any line's start (MULTILINE)", {}, {}, {}, {}});
    add({"reward[].column", T::String, Value(std::string("answer")),
         "answer_match: the data column holding the expected answer", {}, {}, {}, {}});
    add({"reward[].compare", T::String, Value(std::string("number")),
         "answer_match: compare as numbers (relative 1e-6) or as strings (whitespace-trimmed)", {"number", "string"},
         {}, {}, {}});
    add({"reward[].max_length", T::Int, Value(std::int64_t{0}),
         "overlong: the completion length (tokens) beyond which the penalty is -1 (DAPO's L_max)", {}, 0.0, {}, {}});
    add({"reward[].buffer_length", T::Int, Value(std::int64_t{0}),
         "overlong: the soft zone before max_length where the penalty grows linearly to -1 (DAPO's L_cache)", {},
         0.0, {}, {}});
    add({"reward[].block", T::String, Value(std::string("first")),
         "code_exec: which fenced code block of the completion runs", {"first", "last"}, {}, {}, {}});
    add({"reward[].tests_column", T::String, Value(std::string("tests")),
         "code_exec: the data column with the tests (a list of assert statements, as MBPP's test_list; checked: assert "
         "EXPR == LITERAL and assert math.isclose(EXPR, NUMBER), others count as failed)", {}, {}, {},
         {}});
    add({"reward[].setup_column", T::String, Value(std::string("test_setup_code")),
         "code_exec: an optional data column with code run before the tests", {}, {}, {}, {}});
    add({"reward[].mode", T::String, Value(std::string("fraction")),
         "code_exec: reward = fraction of tests passed, or all (1 if every test passes, else 0)", {"fraction", "all"},
         {}, {}, {}});
    add({"reward[].python", T::String, Value(std::string("python3")), "code_exec: the interpreter (a program name or path)",
         {}, {}, {}, {}});
    add({"reward[].on_error", T::String, Value(std::string("fail")),
         "command: what a failed run of the program does (an exit status, a signal, the timeout, output that is not "
         "one number a completion): fail ends the run with one line; null gives that batch's completions no value from "
         "this function (as a reward function returning None: GRPO leaves a completion no function scores out, with "
         "advantage 0; PPO refuses it), said with the count of failed batches; a program that cannot be started "
         "ends the run either way",
         {"fail", "null"}, {}, {}, {}});
    add({"reward[].timeout_s", T::Float, Value(0.0),
         "wall-clock limit in seconds: code_exec per completion, all its tests (0: 10 s), command per batch (0: 600 s)", {}, 0.0, 1e6,
         {}});
    add({"reward[].cpu_s", T::Int, Value(std::int64_t{5}), "code_exec: CPU seconds per test (one process each)", {}, 1.0, {}, {}});
    add({"reward[].memory_mb", T::Int, Value(std::int64_t{1024}), "code_exec: address space (MiB) per test", {},
         16.0, {}, {}});
    add({"reward[].processes", T::Int, Value(std::int64_t{64}), "code_exec: processes per test", {}, 1.0, {},
         {}});
    add({"reward[].file_mb", T::Int, Value(std::int64_t{16}), "code_exec: largest file it may write (MiB)", {}, 0.0,
         {}, {}});
    add({"reward[].max_output_kb", T::Int, Value(std::int64_t{1024}), "code_exec: output read per test (KiB)",
         {}, 1.0, {}, {}});
    add({"reward[].command", T::StringList, Value(std::vector<std::string>{}),
         "command: the program and its arguments (a string names a program; no shell); JSON lines in, one number "
         "per line out", {}, {}, {}, {}});
    add({"log.dir", T::String, Value(std::string("")),
         "run directory for metrics.jsonl, TensorBoard event files and job_summary.txt; empty: none", {}, {}, {},
         {}});
    add({"log.every_steps", T::Int, Value(std::int64_t{1}), "one metrics line every N steps", {}, 1.0, {}, {}});
    add({"log.level", T::String, Value(std::string("info")), "least severe messages printed: debug, info, warn or error",
         {"debug", "info", "warn", "error"}, {}, {}, {}});
    // Counts, lengths and sizes are C ints inside mgrl: a value past 2^31 - 1 wrapped there until 2026-11-28
    // (checkpoint.keep_last = 4294967297 kept 1 checkpoint and deleted the rest; a max_prompt_length of 2^31 crashed;
    // ppo.num_ppo_epochs = 2^32 divided by zero). Every integer key is bounded by it but the seeds and the step
    // counts, which are 64-bit throughout (train.max_steps = 10^12 with a stop_at_step plans a schedule).
    for (auto& k : s)
      if (k.type == T::Int && !k.max && k.name != "train.seed" && k.name != "generate.seed" &&
          k.name != "train.max_steps" && k.name != "train.stop_at_step")
        k.max = 2147483647.0;
    return s;
  }();
  return schema;
}

}  // namespace mgrl::io
