// mode_grpo.cpp: `mgrl grpo`: GRPO training (LoRA or full) of a Hugging Face model with the [[reward]] functions,
// data-parallel over ranks; rollouts sampled in the same process with the same weights.
#include <cstdio>
#include <memory>

#include "app/modes.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/comm.h"
#include "dist/device.h"
#include "dist/mpi_env.h"
#include "io/chat_template.h"
#include "io/config.h"
#include "io/hf_config.h"
#include "io/tokenizer.h"
#include "model/transformer.h"
#include "rl/grpo.h"
#include "rl/prompts.h"
#include "rl/rewards/rewards.h"
#include "train/checkpoint.h"
#include "train/comm_gatherer.h"
#include "train/run_log.h"

namespace mgrl::app {

int run_grpo(Context& ctx) {
  const auto& env = ctx.env;
  const auto& cfg = ctx.cfg;
  prepare_run_dirs(ctx, true);
  const bool random_init = cfg.get_string("model.init") == "random";
  const bool full = cfg.get_bool("train.full_finetune");

  // A bad reward configuration is an error before any model is loaded.
  std::unique_ptr<rl::Rewards> rewards;
  env.agree([&] { rewards = std::make_unique<rl::Rewards>(rl::Rewards::from_config(cfg)); });
  if (rewards->size() == 0) {
    env.agree([&] { throw UserError(cfg.file() + ": grpo needs at least one [[reward]] table (docs/rewards.md)"); });
  }

  RlInputs inputs;
  rl::GenerationOptions::Merge merge = rl::GenerationOptions::Merge::Off;
  env.agree([&] {
    inputs = load_rl_inputs(ctx, full, "grpo.max_prompt_length",
                            "grpo.max_completion_length");
    check_reward_data(*rewards, inputs, cfg);
    if (!full) merge = merge_lora_option(cfg, inputs.model, ctx.device.backend == dist::Backend::Cuda);
    for (const auto& s : cfg.get_strings("grpo.stop"))
      if (s.empty()) throw UserError("key 'grpo.stop': an empty stop string would end every completion at once");
    if (cfg.get_bool("grpo.sync_ref_model")) {  // TR-DPO: a reference to move
      if (cfg.get_float("grpo.beta") == 0)
        throw UserError("key 'grpo.sync_ref_model' with grpo.beta = 0: without the KL term there is no reference "
                        "policy to move (trl refuses the pair too): set grpo.beta > 0, or leave sync_ref_model out");
      if (cfg.get_string("grpo.reference") == "base" && !cfg.get_string("lora.adapter").empty())
        throw UserError("key 'grpo.sync_ref_model' with grpo.reference = \"base\" and a lora.adapter: the reference "
                        "mixed into is a copy of the trainable weights, which start as that adapter, not the base: "
                        "set grpo.reference = \"initial\"");
    }
    // Sampling that keeps the most likely token alone makes the completions of a prompt the same: their rewards are
    // equal, their advantages 0, and nothing is learned (exit 0, every step, until 2026-11-28).
    std::string narrow;
    if (cfg.get_int("grpo.top_k") == 1) narrow = "grpo.top_k = 1";
    else if (cfg.get_float("grpo.top_p") <= 0) narrow = "grpo.top_p = 0";
    else if (cfg.get_float("grpo.min_p") >= 1) narrow = "grpo.min_p = 1";
    if (!narrow.empty())
      throw UserError(narrow + " samples the most likely token only: the " +
                      std::to_string(cfg.get_int("grpo.num_generations")) + " completions of a prompt " +
                      "(grpo.num_generations) would be the same, their advantages 0, and GRPO would learn nothing");
    const std::int64_t batch = cfg.get_int("train.batch_size"), group = cfg.get_int("grpo.num_generations");
    check_batch_fits(inputs.model, "train.batch_size", batch,
                     static_cast<double>(batch) * static_cast<double>(group) / env.size() /
                         static_cast<double>(cfg.get_int("train.grad_accum")),
                     static_cast<double>(inputs.longest), "lower it or grpo.num_generations, or raise train.grad_accum");
  });
  const io::ModelConfig& mc = inputs.model;
  std::unique_ptr<io::Tokenizer>& tok = inputs.tokenizer;
  std::vector<rl::PromptRow>& train_data = inputs.train;
  std::vector<rl::PromptRow>& eval_data = inputs.eval;

  TrainingModel tm = build_training_model(ctx, mc, full);
  model::Transformer& net = *tm.net;
  const train::LossScaling& scaling = tm.scaling;
  const std::uint64_t seed = tm.seed;
  const bool fresh = tm.fresh_adapter;

  rl::GrpoOptions o;
  // A generation round of train.batch_size x grpo.steps_per_generation prompts serves steps_per_generation x
  // num_iterations steps (trl's repeat sampler counts them).
  const std::int64_t spg = cfg.get_int("grpo.steps_per_generation");
  o.max_steps = run_steps(cfg, train_data.size(), cfg.get_int("train.batch_size") * spg,
                          spg * cfg.get_int("grpo.num_iterations"), "prompts", true);
  o.max_nonfinite_steps = static_cast<int>(cfg.get_int("train.max_nonfinite_steps"));
  o.stop_at_step = cfg.get_int("train.stop_at_step");
  o.batch_prompts = static_cast<int>(cfg.get_int("train.batch_size"));
  o.grad_accum = static_cast<int>(cfg.get_int("train.grad_accum"));
  o.optim = optimizer_options(cfg, o.max_steps, scaling);
  o.checkpoint = checkpoint_options(cfg, ctx.device);
  warn_if_no_learning_rate(cfg);
  o.num_generations = static_cast<int>(cfg.get_int("grpo.num_generations"));
  o.max_completion_length = static_cast<int>(cfg.get_int("grpo.max_completion_length"));
  o.sampling.temperature = static_cast<float>(cfg.get_float("grpo.temperature"));
  o.sampling.top_p = static_cast<float>(cfg.get_float("grpo.top_p"));
  o.sampling.top_k = static_cast<int>(cfg.get_int("grpo.top_k"));
  o.sampling.min_p = static_cast<float>(cfg.get_float("grpo.min_p"));
  o.repetition_penalty = static_cast<float>(cfg.get_float("grpo.repetition_penalty"));
  o.stop = cfg.get_strings("grpo.stop");
  o.cache = cache_settings(cfg, merge, net);
  o.loss.loss_type = cfg.get_string("grpo.loss_type");
  o.loss.beta = cfg.get_float("grpo.beta");
  o.loss.epsilon = cfg.get_float("grpo.epsilon");
  o.loss.epsilon_high = cfg.get_float("grpo.epsilon_high") > 0 ? cfg.get_float("grpo.epsilon_high") : o.loss.epsilon;
  if (o.loss.loss_type != "cispo" && o.loss.loss_type != "sapo" && o.loss.loss_type != "vespo")
    o.loss.delta = cfg.get_float("grpo.delta");  // clipped losses
  if (o.loss.loss_type == "sapo") {
    o.loss.sapo_temperature_pos = cfg.get_float("grpo.sapo_temperature_pos");
    o.loss.sapo_temperature_neg = cfg.get_float("grpo.sapo_temperature_neg");
  }
  if (o.loss.loss_type == "vespo") {
    o.loss.vespo_k_pos = cfg.get_float("grpo.vespo_k_pos");
    o.loss.vespo_lambda_pos = cfg.get_float("grpo.vespo_lambda_pos");
    o.loss.vespo_k_neg = cfg.get_float("grpo.vespo_k_neg");
    o.loss.vespo_lambda_neg = cfg.get_float("grpo.vespo_lambda_neg");
  }
  o.multi_objective_aggregation = cfg.get_string("grpo.multi_objective_aggregation");
  o.loss.off_policy_threshold = cfg.get_float("grpo.off_policy_mask_threshold");
  o.top_entropy_quantile = cfg.get_float("grpo.top_entropy_quantile");
  o.entropy_coef = cfg.get_float("grpo.entropy_coef");
  o.adaptive_entropy = cfg.get_bool("grpo.use_adaptive_entropy");
  o.entropy_coef_min = cfg.get_float("grpo.entropy_coef_min");
  o.entropy_coef_max = cfg.get_float("grpo.entropy_coef_max");
  o.entropy_coef_delta = cfg.get_float("grpo.entropy_coef_delta");
  o.entropy_target = cfg.get_float("grpo.entropy_target");
  if (o.adaptive_entropy && o.entropy_coef_min > o.entropy_coef_max)
    env.agree([&] { throw UserError("key 'grpo.entropy_coef_min' (" + std::to_string(o.entropy_coef_min) +
                                    ") is above grpo.entropy_coef_max (" + std::to_string(o.entropy_coef_max) + ")"); });
  o.loss.sequence_level = cfg.get_string("grpo.importance_sampling_level") == "sequence";
  if (o.loss.beta > 0) o.loss.kl_bias_correction = cfg.get_bool("grpo.kl_bias_correction");  // a KL term only
  o.loss.max_completion_length = o.max_completion_length;
  // trl's RLOOTrainer (grpo.loss_type = rloo): its own advantages and loss, so GRPO's options of either are refused;
  // its options qualify rloo only.
  if (o.loss.loss_type == "rloo") {
    for (const char* key : {"grpo.scale_rewards", "grpo.multi_objective_aggregation", "grpo.importance_sampling_level",
                            "grpo.delta", "grpo.off_policy_mask_threshold", "grpo.kl_bias_correction",
                            "grpo.top_entropy_quantile", "grpo.entropy_coef", "grpo.use_adaptive_entropy",
                            "grpo.entropy_coef_min", "grpo.entropy_coef_max", "grpo.entropy_coef_delta",
                            "grpo.entropy_target"})
      if (given_for_this_mode(cfg, key)) {
        const io::Origin at = cfg.origin(key);
        const std::string where = at.kind == io::Origin::File ? cfg.file() + ":" + std::to_string(at.line)
                                                              : std::string("the command line");
        env.agree([&] {
          throw UserError(std::string("key '") + key + "' (" + where + ") does not apply to grpo.loss_type = \"rloo\" "
                          "(trl's RLOOTrainer: leave-one-out advantages, the KL in the rewards, one clipped ratio per "
                          "completion); leave it out, or choose another grpo.loss_type");
        });
      }
    o.normalize_advantages = cfg.get_bool("grpo.normalize_advantages");
    o.reward_clip_min = cfg.get_float("grpo.reward_clip_min");
    o.reward_clip_max = cfg.get_float("grpo.reward_clip_max");
    if (!(o.reward_clip_min <= o.reward_clip_max))
      env.agree([&] {
        throw UserError("key 'grpo.reward_clip_min' (" + std::to_string(o.reward_clip_min) +
                        ") is above grpo.reward_clip_max (" + std::to_string(o.reward_clip_max) + ")");
      });
    o.entropy_coef = 0.0;
    o.adaptive_entropy = false;
    o.top_entropy_quantile = 1.0;
    o.loss.sequence_level = false;
    o.loss.kl_bias_correction = false;
    o.loss.delta = 0.0;
    o.loss.off_policy_threshold = 0.0;
  } else {
    for (const char* key : {"grpo.normalize_advantages", "grpo.reward_clip_min", "grpo.reward_clip_max"})
      if (given_for_this_mode(cfg, key))
        log::warn_once(std::string(key) + " is ignored: it qualifies grpo.loss_type = \"rloo\", which is not set");
  }
  o.scale_rewards = cfg.get_string("grpo.scale_rewards");
  o.num_iterations = static_cast<int>(cfg.get_int("grpo.num_iterations"));
  o.steps_per_generation = static_cast<int>(spg);
  o.mask_truncated = cfg.get_bool("grpo.mask_truncated_completions");
  o.reference = cfg.get_string("grpo.reference");
  o.ref_sync = ref_sync_option(cfg, "grpo.");
  o.balance = cfg.get_string("grpo.balance");
  o.seed = seed;
  o.shuffle = cfg.get_bool("data.shuffle");
  o.log_every = static_cast<int>(cfg.get_int("log.every_steps"));
  o.eval_every = static_cast<int>(cfg.get_int("eval.every_steps"));
  o.eval_max_new_tokens = static_cast<int>(cfg.get_int("eval.max_new_tokens"));
  o.pass_k = static_cast<int>(cfg.get_int("eval.pass_k"));
  o.num_samples = static_cast<int>(cfg.get_int("eval.num_samples"));
  o.accuracy_reward = cfg.get_string("eval.accuracy_reward");
  o.rollouts_every = static_cast<int>(cfg.get_int("rollouts.every_steps"));
  o.log_dir = cfg.get_string("log.dir");
  o.config_text = cfg.to_toml();
  o.threads = std::max(1, ctx.device.cpu_threads);
  o.gpu_peak_tflops = gpu_peak_tflops(ctx.device);
  if (o.num_samples > 0 && o.pass_k > o.num_samples)
    env.agree([&] { throw UserError("eval.pass_k (" + std::to_string(o.pass_k) + ") must not exceed eval.num_samples (" +
                                    std::to_string(o.num_samples) + ")"); });
  {
    // The planned passes over the prompts (a generation round serves num_iterations steps), so that a typo in
    // train.max_steps or train.batch_size shows at once.
    const double epochs = static_cast<double>(o.max_steps) * static_cast<double>(o.batch_prompts) /
                          static_cast<double>(std::max(1, o.num_iterations)) /
                          static_cast<double>(std::max<std::size_t>(1, train_data.size()));
    const std::string sync_text = o.ref_sync.on() ? ", reference " + ref_sync_text(o.ref_sync) : "";
    char line[520];
    std::snprintf(line, sizeof(line),
                  "grpo: %s %s, %zu prompts, %zu held-out, %s on %d rank%s; %d prompts x %d completions per step, "
                  "loss %s, beta %g%s, %zu reward function%s; %lld steps = %.3g epochs%s",
                  random_init ? "random-init" : "pretrained", io::model_name(mc).c_str(), train_data.size(),
                  eval_data.size(), full ? "full fine-tuning" : "LoRA", env.size(), env.size() == 1 ? "" : "s",
                  o.batch_prompts, o.num_generations, o.loss.loss_type.c_str(), o.loss.beta,
                  sync_text.c_str(), rewards->size(),
                  rewards->size() == 1 ? "" : "s", static_cast<long long>(o.max_steps), epochs,
                  o.steps_per_generation > 1 ? ("; one generation round per " + std::to_string(o.steps_per_generation) +
                                                " steps (" + std::to_string(o.batch_prompts * o.steps_per_generation) +
                                                " prompts)").c_str()
                                             : "");
    log::info(line);
  }
  // Rollout files are written as checkpoints are (a temporary, then a rename): a killed run's leftovers go.
  if (env.rank() == 0 && !o.log_dir.empty()) train::remove_stale_temporaries(o.log_dir + "/rollouts");
  std::unique_ptr<rl::GrpoTrainer> trainer;
  env.agree([&] {
    trainer = std::make_unique<rl::GrpoTrainer>(env, ctx.comm, net, *tok, *rewards, std::move(train_data),
                                                std::move(eval_data), o, fresh && !full);
  });
  say_rl_notes(inputs);
  say_unused_keys(ctx);  // the configuration is read: what it did not read changes nothing
  trainer->run();
  return 0;
}

}  // namespace mgrl::app
