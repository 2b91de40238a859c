// mode_ppo.cpp: `mgrl ppo`: PPO training (LoRA or full) of a Hugging Face model with a value head on its last hidden
// state and the [[reward]] functions, data-parallel over ranks; rollouts sampled in the same process.
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
#include "rl/ppo.h"
#include "rl/prompts.h"
#include "rl/rewards/rewards.h"
#include "train/checkpoint.h"
#include "train/comm_gatherer.h"

namespace mgrl::app {

int run_ppo(Context& ctx) {
  const auto& env = ctx.env;
  const auto& cfg = ctx.cfg;
  prepare_run_dirs(ctx, true);
  const bool random_init = cfg.get_string("model.init") == "random";
  const bool full = cfg.get_bool("train.full_finetune");

  std::unique_ptr<rl::Rewards> rewards;
  env.agree([&] { rewards = std::make_unique<rl::Rewards>(rl::Rewards::from_config(cfg)); });
  if (rewards->size() == 0)
    env.agree([&] { throw UserError(cfg.file() + ": ppo needs at least one [[reward]] table (docs/rewards.md)"); });

  if (cfg.get_int("train.grad_accum") != 1)
    env.agree([&] {
      throw UserError("ppo does not use train.grad_accum (each rank trains its share of a mini-batch in one pass; "
                      "ppo.num_mini_batches sets the optimizer steps): leave it at 1");
    });

  RlInputs inputs;
  rl::GenerationOptions::Merge merge = rl::GenerationOptions::Merge::Off;
  env.agree([&] {
    inputs = load_rl_inputs(ctx, full, "ppo.max_prompt_length", "ppo.response_length");
    check_reward_data(*rewards, inputs, cfg);
    if (!full) merge = merge_lora_option(cfg, inputs.model, ctx.device.backend == dist::Backend::Cuda);
    const std::int64_t batch = cfg.get_int("train.batch_size");
    check_batch_fits(inputs.model, "train.batch_size", batch, static_cast<double>(batch) / env.size(),
                     static_cast<double>(inputs.longest), "lower it or ppo.response_length");
  });
  const io::ModelConfig& mc = inputs.model;
  std::unique_ptr<io::Tokenizer>& tok = inputs.tokenizer;
  std::vector<rl::PromptRow>& train_data = inputs.train;
  std::vector<rl::PromptRow>& eval_data = inputs.eval;

  // model.shard_base: each rank holds 1/P of the decoder layers and gathers a layer through the communicator before
  // it runs; the value head reads the policy's own final hidden state, so there is no second base to shard.
  TrainingModel tm = build_training_model(ctx, mc, full);
  model::Transformer& net = *tm.net;
  const train::LossScaling& scaling = tm.scaling;
  const std::uint64_t seed = tm.seed;

  rl::PpoTrainOptions o;
  // An update of train.batch_size prompts is ppo.num_ppo_epochs x ppo.num_mini_batches optimizer steps.
  o.max_steps = run_steps(cfg, train_data.size(), cfg.get_int("train.batch_size"),
                          cfg.get_int("ppo.num_ppo_epochs") * cfg.get_int("ppo.num_mini_batches"), "prompts");
  o.max_nonfinite_steps = static_cast<int>(cfg.get_int("train.max_nonfinite_steps"));
  o.stop_at_step = cfg.get_int("train.stop_at_step");
  o.batch_prompts = static_cast<int>(cfg.get_int("train.batch_size"));
  o.optim = optimizer_options(cfg, o.max_steps, scaling);
  o.checkpoint = checkpoint_options(cfg, ctx.device);
  if (cfg.get_float("ppo.value_lr") == 0.0) warn_if_no_learning_rate(cfg);  // value_lr > 0: the value head trains
  o.ppo.gamma = cfg.get_float("ppo.gamma");
  o.ppo.lam = cfg.get_float("ppo.lam");
  o.ppo.cliprange = cfg.get_float("ppo.cliprange");
  o.ppo.cliprange_value = cfg.get_float("ppo.cliprange_value");
  o.ppo.vf_coef = cfg.get_float("ppo.vf_coef");
  o.ppo.kl_coef = cfg.get_float("ppo.kl_coef");
  o.kl_target = cfg.get_float("ppo.kl_target");
  o.kl_horizon = cfg.get_float("ppo.kl_horizon");
  o.ppo.kl_estimator = rl::kl_estimator_from(cfg.get_string("ppo.kl_estimator"));
  o.ppo.whiten_rewards = cfg.get_bool("ppo.whiten_rewards");
  o.ppo.missing_eos_penalty = cfg.get_float("ppo.missing_eos_penalty");
  o.ppo.response_length = static_cast<int>(cfg.get_int("ppo.response_length"));
  o.num_ppo_epochs = static_cast<int>(cfg.get_int("ppo.num_ppo_epochs"));
  o.num_mini_batches = static_cast<int>(cfg.get_int("ppo.num_mini_batches"));
  o.value_lr = cfg.get_float("ppo.value_lr");
  o.sampling.temperature = static_cast<float>(cfg.get_float("ppo.temperature"));
  o.cache = cache_settings(cfg, merge, net);
  o.seed = seed;
  o.shuffle = cfg.get_bool("data.shuffle");
  o.log_every = static_cast<int>(cfg.get_int("log.every_steps"));
  o.rollouts_every = static_cast<int>(cfg.get_int("rollouts.every_steps"));
  o.log_dir = cfg.get_string("log.dir");
  o.config_text = cfg.to_toml();
  o.threads = std::max(1, ctx.device.cpu_threads);
  o.eval_every = static_cast<int>(cfg.get_int("eval.every_steps"));
  o.eval_max_new_tokens = static_cast<int>(cfg.get_int("eval.max_new_tokens"));
  o.accuracy_reward = cfg.get_string("eval.accuracy_reward");
  for (const char* key : {"eval.pass_k", "eval.num_samples"})  // accepted and ignored until 2026-11-28
    if (cfg.get_int(key) > 0 && given_for_this_mode(cfg, key))
      env.agree([&] {
        throw UserError(std::string("key '") + key + "' is grpo's: ppo evaluates one greedy completion per held-out "
                        "prompt");
      });
  {
    char adaptive[96] = "";
    if (o.kl_target > 0)
      std::snprintf(adaptive, sizeof(adaptive), " (adaptive: target %g, horizon %g)", o.kl_target, o.kl_horizon);
    char line[480];
    std::snprintf(line, sizeof(line),
                  "ppo: %s %s, %zu prompts, %zu held-out, %s on %d rank%s; %d responses per rollout batch, %d epochs x %d "
                  "mini-batches, kl %s x %g%s, %zu reward function%s; %lld optimizer steps",
                  random_init ? "random-init" : "pretrained", io::model_name(mc).c_str(), train_data.size(),
                  eval_data.size(), full ? "full fine-tuning" : "LoRA", env.size(), env.size() == 1 ? "" : "s", o.batch_prompts,
                  o.num_ppo_epochs, o.num_mini_batches, cfg.get_string("ppo.kl_estimator").c_str(), o.ppo.kl_coef,
                  adaptive, rewards->size(), rewards->size() == 1 ? "" : "s", static_cast<long long>(o.max_steps));
    log::info(line);
  }
  if (env.rank() == 0 && !o.log_dir.empty()) train::remove_stale_temporaries(o.log_dir + "/rollouts");
  std::unique_ptr<rl::PpoTrainer> trainer;
  env.agree([&] {
    trainer = std::make_unique<rl::PpoTrainer>(env, ctx.comm, net, *tok, *rewards, std::move(train_data),
                                               std::move(eval_data), o);
  });
  say_rl_notes(inputs);
  say_unused_keys(ctx);  // the configuration is read: what it did not read changes nothing
  trainer->run();
  return 0;
}

}  // namespace mgrl::app
