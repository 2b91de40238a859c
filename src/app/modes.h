// modes.h: what a mode receives, and the modes.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "rl/generator.h"
#include "rl/prompts.h"
#include "train/checkpointer.h"
#include "train/data.h"
#include "train/optimizer.h"

namespace mgrl::dist {
class MpiEnv;
class Comm;
struct Device;
}  // namespace mgrl::dist
namespace mgrl::io {
class Config;
class Tokenizer;
class ChatTemplate;
struct ModelConfig;
}
namespace mgrl::kernels {
class Ops;
}
namespace mgrl::train {
class CommGatherer;
}
namespace mgrl::model {
class Transformer;
struct LoraConfig;
struct ModelOptions;
}

namespace mgrl::app {

struct Context {
  dist::MpiEnv& env;
  const io::Config& cfg;
  const dist::Device& device;
  dist::Comm& comm;
};

// `mgrl info`: one line per rank (in rank order), then versions, build options, P2P matrix.
int run_info(Context& ctx);
// `mgrl score`: per-token log-probs of JSONL token sequences into an HDF5 file (docs/score.md).
int run_score(Context& ctx);
// `mgrl sft`: supervised fine-tuning (docs/sft.md).
int run_sft(Context& ctx);
// `mgrl grpo`: reinforcement learning with group-relative policy optimisation (docs/grpo.md).
int run_grpo(Context& ctx);
// `mgrl dpo`: direct preference optimisation on preference pairs (docs/dpo.md).
int run_dpo(Context& ctx);
// `mgrl ppo`: reinforcement learning with a value head and GAE, as trl's PPO trainer (docs/ppo.md).
int run_ppo(Context& ctx);
// `mgrl distill` (mode_distill.cpp): on-policy knowledge distillation from distill.teacher (rl/distill.h)
int run_distill(Context& ctx);
// `mgrl reward`: the [[reward]] functions on a JSONL of {prompt, completion, ...} lines, JSON lines out.
int run_reward(Context& ctx);
// `mgrl export`: a checkpoint as a PEFT adapter directory, optionally also merged into a full model.
int run_export(Context& ctx);
// `mgrl generate`: completions of JSONL prompts into a JSONL file (docs/generate.md).
int run_generate(Context& ctx);
// `mgrl plan`: the memory a rank of the configured run needs, by part, from the model's shape alone (docs/large-models.md).
int run_plan(dist::MpiEnv& env, const io::Config& cfg);
// `mgrl render`: the text, token ids and assistant mask of each {"messages"} line, JSON lines out (docs/sft.md).
int run_render(Context& ctx);

// The op backend for the rank's device, storing model.dtype (dist::storage_dtype: auto is bf16 when the job's oldest
// GPU is sm_80 or newer, fp16 before; the CPU backend is f32 and takes auto only). Collective: errors agreed on by
// all ranks.
std::unique_ptr<kernels::Ops> make_ops(const Context& ctx);
// The loss scaling of train.loss_scaling and its keys for a backend storing `storage`. Collective: a bad key is a
// one-line error agreed on by all ranks.
train::LossScaling loss_scaling(const Context& ctx, DType storage);
// Base weights from model_dir and, when adapter is not empty, that PEFT adapter; errors agreed on by all ranks.
// Then agree_on_inputs over input_files(ctx.cfg, adapter, false).
void load_model(const Context& ctx, model::Transformer& net, const std::string& model_dir, const std::string& adapter);
// The files a run reads besides the base weights, as ("what", path) (path "" when not used): data.input,
// chat.template, the tokenizer's tokenizer.json and tokenizer_config.json, the adapter's weights, and for training
// eval.input.
std::vector<std::pair<std::string, std::string>> input_files(const io::Config& cfg, const std::string& adapter,
                                                            bool training);
// Every rank loaded the same base weights and reads the same files: each rank's base-weight fingerprint
// (ModelDef::base_fingerprint) and a sampled fingerprint (size, checksum of up to 4 MiB of it) of each of `files`
// are compared with rank 0's; the first that differs is an agreed one-line error naming it and the rank's host.
// (A multi-node job whose nodes read their own copies trained apart in silence on a stale one until 2026-11-29.)
// Nothing to do on one rank.
void agree_on_inputs(const Context& ctx, const model::Transformer& net,
                     const std::vector<std::pair<std::string, std::string>>& files);
// One line on rank 0 when the base projections are NF4 (QLoRA): their bytes, the workspace's, the dense rest's.
void log_base_memory(model::Transformer& net);
// Peak dense bf16/fp16 tensor throughput (TFLOP/s) of GPUs whose name we recognise (for MFU); 0 when unknown.
double gpu_peak_tflops(const dist::Device& d);
// How {"messages"} become text and tokens (io/chat_template.h): the format named by format_key (auto: the model's
// template, or chat.template), with chat.template_kwargs.
io::ChatTemplate chat_template(const io::Config& cfg, const char* format_key, const io::Tokenizer& tok);
// The LoRA configuration of a run, as its adapter is written: lora.adapter's adapter_config.json when given (its
// lora_dropout unless lora.dropout is given), else the lora.* keys.
model::LoraConfig lora_config(const io::Config& cfg);
// What the run trains with: lora_config, with dropout 0 in DPO unless dpo.disable_dropout = false (trl's default).
model::LoraConfig training_lora_config(const io::Config& cfg);
// The model's options from model.recompute, model.quantize, model.quantize_double, model.shard_base,
// model.shard_base_keep and train.master_weights.
model::ModelOptions model_options(const io::Config& cfg, bool full_finetune);
// Adds the LoRA adapter to train: the PEFT adapter of lora.adapter when given (its config wins over lora.r,
// lora.alpha, lora.targets, lora.use_rslora), else a fresh one from the lora.* keys. Returns true when fresh
// (B = 0: the starting policy is the base model). Call inside env.agree.
bool setup_trainable_lora(const Context& ctx, model::Transformer& net, std::uint64_t seed);
// The model a training mode (sft, dpo, grpo, ppo) trains, built alike on every rank: the op backend of the rank's
// device (make_ops), the loss scaling for its storage, the gatherer of a sharded base (model.shard_base: 1/P of the
// decoder layers on each rank, a layer gathered through the communicator before it runs), the weights (model.path,
// or model.init = "random" from train.seed and model.init_std) and, unless full, the trainable adapter
// (setup_trainable_lora). Members are declared so that each outlives those after it. Collective; errors agreed on.
struct TrainingModel {
  std::unique_ptr<kernels::Ops> ops;
  train::LossScaling scaling;
  std::unique_ptr<train::CommGatherer> gatherer;
  std::unique_ptr<model::Transformer> net;
  std::uint64_t seed = 0;       // train.seed
  bool fresh_adapter = false;   // a fresh adapter (B = 0: the starting policy is the base model); false when full
};
TrainingModel build_training_model(const Context& ctx, const io::ModelConfig& mc, bool full);
// The keys given for this run that it has not read (io::Config::unread_given): they change nothing in this mode (another
// mode's key, one of a section this run has no use for). One warning on rank 0 naming each and where it was given
// ("run.toml:12", "the command line"), once per key; only keys given_for_this_mode; info and plan never say it. Called
// before the work of the modes that have long work (training, generation, scoring) and at the end of every run.
void say_unused_keys(const Context& ctx);
// A key given for this run: on the command line, or in an input file that names this mode or none (a file written for
// another mode, as `mgrl generate sft.toml`, holds that mode's keys by design).
bool given_for_this_mode(const io::Config& cfg, const std::string& key);
// The checkpoint keys of a training mode (checkpoint.dir, every_steps, keep_last, resume, allow_other_base), and what
// every checkpoint keeps to compare on resume: the configuration's text, the numeric setup of `device` (its thread
// count and BLAS, or its GPU) and the training data's fingerprint.
train::CheckpointOptions checkpoint_options(const io::Config& cfg, const dist::Device& device);
// One warning when train.lr = 0 (the weights would not change; PPO's value head alone may train then: ppo says it
// only without ppo.value_lr).
void warn_if_no_learning_rate(const io::Config& cfg);
// The keys SFT and DPO read alike into their options (train::SftOptions, train::DpoOptions): train.max_steps,
// max_nonfinite_steps, stop_at_step, batch_size, grad_accum, the optimizer's keys with `scaling`, the seed, log,
// eval and checkpoint keys (checkpoint_options).
template <class Options>
void read_supervised_keys(const io::Config& cfg, const dist::Device& device, const train::LossScaling& scaling,
                          std::uint64_t seed, std::int64_t max_steps, Options* o);
// The run's optimizer steps: train.max_steps, or with train.num_epochs (trl's num_train_epochs; refused beside a
// given train.max_steps) ceil(epochs x ceil(units / batch)) x steps_per_batch, as transformers counts them: units
// the training rows (examples, packed rows, pairs, prompts; `what` names them), steps_per_batch the optimizer steps a
// batch serves (PPO: its epochs x mini-batches). whole_batches (GRPO): trl's repeat sampler yields whole generation
// rounds only (a last partial one is dropped) and transformers rounds epochs x (their steps) up:
// ceil(epochs x floor(units / batch) x steps_per_batch).
std::int64_t run_steps(const io::Config& cfg, std::size_t units, std::int64_t batch, std::int64_t steps_per_batch,
                       const std::string& what, bool whole_batches = false);
// train.eos_token's id in tok (nullopt: the tokenizer's EOS); UserError naming the key when tok lacks it.
std::optional<std::int32_t> eos_token(const io::Config& cfg, const io::Tokenizer& tok);
// eval.accuracy of SFT and DPO: the share of held-out examples whose greedy completion (at most max_new_tokens,
// ending at the tokenizer's EOS) is the example's completion text. Each rank generates its contiguous share; on a
// sharded base (model.shard_base) every generation step gathers the layers collectively, so the ranks step in
// lockstep until all are done, one without an example too (more ranks than examples). Collective.
std::function<double(const std::vector<train::Example>&)> greedy_accuracy(const dist::MpiEnv& env,
                                                                          model::Transformer& net,
                                                                          const io::Tokenizer& tok,
                                                                          int max_new_tokens);
// UserError at start-up, before any training, when the longest held-out prompt (`longest_prompt` tokens, `where`
// naming it) plus eval.max_new_tokens exceeds the model's max_position_embeddings: the held-out generation would
// otherwise refuse it on the rank holding that prompt only, at the first evaluation with generation (for SFT and DPO
// the end of the run, before the final checkpoint).
void check_eval_generation_fits(const io::Config& cfg, const io::ModelConfig& mc, std::size_t longest_prompt,
                                const std::string& where);
// A token id of a data line's list of ids (`score`'s "tokens", `generate`'s "prompt_tokens"), read as written: a
// UserError "file:line: token 2.5 is not an integer id", or "... token 1e20 / -3 / 2^64-1 is not an id of the
// model's vocabulary (0..V-1)" (not another id after a conversion).
std::int32_t token_id(const nlohmann::json& v, std::int64_t vocab_size, const std::string& file, int line);
// [begin, end) of this rank's contiguous share of n items.
std::pair<std::size_t, std::size_t> shard(const dist::MpiEnv& env, std::size_t n);

// UserError naming config_json when the model's weights cannot fit the memory of this rank's device: 4 bytes a
// parameter on the CPU backend (16 with full fine-tuning: grads and two AdamW moments), 2 on a GPU.
// NF4 and model.shard_base (1/P of the decoder layers on each of the P ranks, plus two gathered) as configured;
// refuse_sharded_full_finetune first, for every training mode.
void refuse_sharded_full_finetune(const io::Config& cfg);
// mgrl distill's teacher: {its projections NF4 (distill.teacher_quantize = "nf4", or a bitsandbytes 4-bit
// directory), double-quantized (distill.teacher_quantize_double, or the directory's)}.
std::pair<bool, bool> teacher_nf4(const io::Config& cfg, const io::ModelConfig& tc);  // UserError: model.shard_base with train.full_finetune
// With full fine-tuning, a frozen copy of the starting weights and a swap buffer (8 bytes a parameter) when the mode
// keeps one as its reference (GRPO with grpo.beta > 0, KTO).
// teacher (mgrl distill, its config.json teacher_json): the student's check is then the teacher's, the teacher's
// weights (dense, as stored; sharded as the student's base) counted beside the student's.
void check_model_fits(const Context& ctx, const io::ModelConfig& mc, const std::string& config_json, bool full,
                      bool reference_copy = false, const io::ModelConfig* teacher = nullptr,
                      const std::string& teacher_json = "");
// Collective, at the start of a training mode (one agreement; UserError on every rank). Rank 0 creates log.dir and
// checkpoint.dir (when set) and checks that the run's files can be written there: metrics.jsonl and
// job_summary.txt regular files or absent, rollouts/ (rollouts: GRPO, PPO) a directory or absent and not the
// checkpoint.dir (before, a log.dir that could not hold them was found by rank 0 alone mid-run, or not at all).
// Then it takes an exclusive lock (flock) on <dir>/.mgrl.lock of each, held until the process ends, so that a
// second run in the same directories (a job requeued while the first still runs, two configurations given one
// directory) does not replace and prune the first one's checkpoints, rollouts and logs: it waits up to
// runtime.dir_lock_wait_s for the lock (the other ranks with it), then refuses to start naming the directory and the
// holder (pid, host, mode, start). The holder refreshes the lock file's time every 30 s; a lock not refreshed for
// 180 s (a dead node's, kept by a network file system) is taken over with a warning. Where the file system has no
// locks, a warning, and the run goes on.
void prepare_run_dirs(const Context& ctx, bool rollouts);

// UserError naming `key` when the output file `output` would replace one of the run's inputs: a file of
// `inputs` (pairs of key and path: data.input) or an existing file inside a directory of them (model.path,
// model.tokenizer, lora.adapter: config.json, the weights, tokenizer.json). Paths compared by what the file system
// says (links and relative paths resolved); empty paths are skipped; an output that is itself a link is allowed (it
// is replaced, not the file it points to).
void refuse_output_over_inputs(const std::string& key, const std::string& output,
                               const std::vector<std::pair<std::string, std::string>>& inputs);

// UserError naming `key` when `sequences` sequences of up to `tokens` tokens each, processed at once on one rank,
// cannot fit this machine's memory (a lower bound of what a step keeps per token: each layer's input and the
// logits): an absurd batch size is refused before anything is sized from it.
void check_batch_fits(const io::ModelConfig& mc, const std::string& key, std::int64_t value, double sequences,
                      double tokens, const std::string& advice);
// The optimizer keys (train.max_grad_norm, adam_*, weight_decay, schedule, lr, warmup_steps / warmup_ratio over
// max_steps) with the loss scaling chosen for this run: one reading for SFT, GRPO and DPO.
train::OptimizerOptions optimizer_options(const io::Config& cfg, std::int64_t max_steps, const train::LossScaling& scaling);
// What grpo and ppo read before any model is built, inside env.agree: the model's config (checked to fit this
// machine, 1/P of its layers when the base is sharded over P ranks), the tokenizer (no larger than the vocabulary),
// the prompts of data.input and eval.input (cut at prompt_key's length, through the chat template), and `longest`
// = prompt_key + completion_key, refused when it exceeds the model's max_position_embeddings.
struct RlInputs {
  io::ModelConfig model;
  std::unique_ptr<io::Tokenizer> tokenizer;
  std::vector<rl::PromptRow> train, eval;
  std::int64_t longest = 0;
  int max_completion = 0;       // the completion key's value (grpo.max_completion_length, ppo.response_length)
  std::string completion_key;
  // Warnings about the data (prompts cut, held-out completions shorter than the training ones, lines that cannot
  // earn a reward): said with say_rl_notes when every start-up check has passed, so that an error comes alone.
  std::vector<std::string> notes;
};
void say_rl_notes(const RlInputs& in);
// "FILE: N of M <what> are longer than <limit> tokens and <loss> (the longest has K): <advice>" for the rows of a data
// file that lost tokens (each row's `cut` tokens left out, `tokens` kept: train::Example, rl::PromptRow); "" when
// none did.
template <class Rows>
std::string cut_rows_note(const Rows& rows, const std::string& file, const std::string& what, const std::string& limit,
                          const std::string& loss, const std::string& advice) {
  std::size_t cut = 0, most = 0;
  for (const auto& r : rows)
    if (r.cut > 0) {
      ++cut;
      most = std::max(most, r.cut + r.tokens.size());
    }
  if (cut == 0) return "";
  return file + ": " + std::to_string(cut) + " of " + std::to_string(rows.size()) + " " + what + " are longer than " +
         limit + " tokens and " + loss + " (the longest has " + std::to_string(most) + "): " + advice;
}
// The rewards of an RL run and its prompt files against them (rl::Rewards::check_data): weights all 0, or a reward no
// line of a file can earn (naming the file, the line and the column), is an error; some such lines, a warning. Call
// inside env.agree.
void check_reward_data(const rl::Rewards& rewards, RlInputs& in, const io::Config& cfg);
RlInputs load_rl_inputs(const Context& ctx, bool full, const std::string& prompt_key,
                        const std::string& completion_key);
// model.tokenizer, or model.path when it is empty (a UserError naming model.tokenizer when both are: model.shape).
std::string tokenizer_dir(const io::Config& cfg);
// The model's shape: the built-in model.shape when set, else model.path/config.json; model.num_layers replaces its
// num_hidden_layers when not 0. *source names where it came from for messages (the config.json path, or
// "model.shape = \"NAME\""). UserError for an unknown shape (listing the known ones) or a bad config.json.
io::ModelConfig model_config(const io::Config& cfg, std::string* source = nullptr);
// model_config for a training mode (sft, grpo, dpo, ppo), which also refuses a model.shape or model.num_layers without
// model.init = "random" (there are no weights to load for them).
io::ModelConfig training_model_config(const io::Config& cfg, std::string* source);
// The keys of a mode that runs a model of model.path (generate, score): a UserError when model.shape or num_layers is
// set, or model.init = "random" is given for this mode (there is no random model to make); warn_lora_keys_ignored.
void check_inference_keys(const io::Config& cfg, const std::string& mode);
// A warning (once each, "KEY is ignored: <why>") for lora.r, alpha, targets and use_rslora (and lora.dropout with
// `dropout`) set where they shape nothing: beside an adapter (lora.adapter: its adapter_config.json sets them), in
// generate and score without one, in full fine-tuning.
void warn_lora_keys_ignored(const io::Config& cfg, const std::string& why, bool dropout);
// generate.merge_lora for the generations of generate, grpo and ppo: "off"; "on" (a UserError naming the key when
// the base is NF4, by model.quantize = "nf4" or a bitsandbytes 4-bit directory, or sharded, model.shard_base);
// "auto": IfMemory on the CUDA backend (cuda) with a dense, unsharded base, else off (also when the environment sets
// MGRL_MERGE_LORA=0). Call inside env.agree. mgrl plan reads it as the modes do.
rl::GenerationOptions::Merge merge_lora_option(const io::Config& cfg, const io::ModelConfig& mc, bool cuda);
// One line on rank 0 when the generations will sample from merged weights (m not Off and the model has an adapter):
// the projections merged and the copy's memory.
void log_merge_lora(rl::GenerationOptions::Merge m, model::Transformer& net);
// The generate.* keys of a training mode that samples, with merge_lora resolved (merge_lora_option), said once
// (log_merge_lora).
rl::CacheSettings cache_settings(const io::Config& cfg, rl::GenerationOptions::Merge merge, model::Transformer& net);
// TR-DPO's keys of a mode (section "dpo.", "kto." or "grpo."): <section>sync_ref_model's settings, or (off) none and
// a warning for each of ref_model_sync_steps and ref_model_mixup_alpha given without it.
train::RefSync ref_sync_option(const io::Config& cfg, const std::string& section);
// The start-up lines' words for it: "mixed with the policy every N steps (alpha A: TR-DPO)".
std::string ref_sync_text(const train::RefSync& s);

}  // namespace mgrl::app
