// ppo.h: the PPO training loop (trl's PPOTrainer semantics, docs/ppo.md). One update: the global batch of prompts is
// split over ranks in blocks; each rank samples one response per prompt with the current policy (the generator, as
// GRPO), scores it with the [[reward]] functions, and scores the rollouts (policy and reference log-probs, the value
// head's values); rewards, GAE and whitening over the global batch; then num_ppo_epochs passes over the batch in a
// seeded order shared by all ranks, num_mini_batches optimizer steps each, every rank training the sequences of the
// mini-batch it holds; with ppo.kl_target the KL coefficient adapts after each update (from global statistics, so
// every rank agrees). Checkpoints are written at update boundaries only (value head and KL coefficient in their JSON).
// On a sharded base (model.shard_base) every rank runs the same model passes: generation in lockstep, one scoring
// pass per rank (equal blocks), one pass per mini-batch (zero-weight where a rank holds none of it).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/mpi_env.h"
#include "io/tokenizer.h"
#include "model/transformer.h"
#include "rl/generator.h"
#include "rl/ppo_loss.h"
#include "rl/ppo_step.h"
#include "rl/prompts.h"
#include "rl/rewards/rewards.h"
#include "rl/value_head.h"
#include "train/checkpointer.h"
#include "train/data.h"
#include "train/divergence.h"
#include "train/grad_sync.h"
#include "train/optimizer.h"

namespace mgrl::rl {

struct PpoTrainOptions {
  train::OptimizerOptions optim;
  train::CheckpointOptions checkpoint;
  int max_nonfinite_steps = 25;
  std::int64_t max_steps = 4;     // optimizer steps (a multiple of num_ppo_epochs x num_mini_batches)
  std::int64_t stop_at_step = 0;  // 0: none (else a multiple of the same)
  int batch_prompts = 8;          // rollouts per update over all ranks
  PpoOptions ppo;                 // ppo.kl_coef: the fixed coefficient, or the adaptive one's start
  double kl_target = 0;           // > 0: the adaptive KL controller's target (ppo_adaptive_kl_coef)
  double kl_horizon = 10000;      // its horizon in responses
  int num_ppo_epochs = 4, num_mini_batches = 1;
  double value_lr = 0;            // 0: the policy's learning rate
  kernels::Ops::Sampling sampling;
  CacheSettings cache;  // generate.*
  std::uint64_t seed = 0;
  bool shuffle = true;  // data.shuffle: each epoch in a seeded random order; false: the data's order
  int rollouts_every = 1;
  std::string log_dir;
  std::string config_text;
  int threads = 1;
  int log_every = 1;
  int eval_every = 0;           // eval.every_steps (optimizer steps; at the end of the update that reaches one)
  int eval_max_new_tokens = 32;
  std::string accuracy_reward;  // eval.accuracy_reward; "": the first answer_match or code_exec reward
};

// Held-out figures of greedy completions: mean total reward, and the accuracy (the accuracy reward at 1).
struct PpoEval {
  double mean_reward = -1, accuracy = -1;
  std::size_t prompts = 0;
};

class PpoTrainer {
 public:
  PpoTrainer(const dist::MpiEnv& env, dist::Comm& comm, model::Transformer& model, const io::Tokenizer& tok,
             const Rewards& rewards, std::vector<PromptRow> train, std::vector<PromptRow> eval, PpoTrainOptions opts);
  ~PpoTrainer();
  // Runs to max_steps (or stop_at_step); returns the optimizer steps done in all.
  std::int64_t run();
  PpoEval evaluate();  // collective

 private:
  int steps_per_update() const { return opts_.num_ppo_epochs * opts_.num_mini_batches; }
  void update(nlohmann::json* metrics);
  void write_rollouts(const std::vector<PpoSample>& local, const std::vector<std::int64_t>& prompt_index,
                      const std::vector<std::vector<double>>& rewards_fn, const std::vector<std::string>& finish,
                      std::int64_t step);
  // Warns once when 5 updates in a row had every response of the global batch score alike (no_signal_*).
  void say_if_no_signal(const std::vector<PpoSample>& local, const std::vector<std::string>& finish,
                        std::int64_t first_step);

  const dist::MpiEnv& env_;
  dist::Comm& comm_;
  model::Transformer& model_;
  const io::Tokenizer& tok_;
  const Rewards& rewards_;
  std::vector<PromptRow> train_, eval_;
  PpoTrainOptions opts_;
  int accuracy_fn_ = -1;
  train::Sampler sampler_;
  train::Trainable tr_;
  std::unique_ptr<train::Optimizer> opt_;
  std::unique_ptr<train::GradSync> sync_;
  std::unique_ptr<train::Checkpointer> ckpt_;
  std::unique_ptr<train::DivergenceGuard> guard_;
  std::unique_ptr<ValueHead> vh_;
  train::TrainState state_;
  double kl_coef_ = 0;       // the KL coefficient of the next rollout batch (state: in the checkpoint's JSON)
  float* vh_buf_ = nullptr;  // backend memory for the value head's gradient allreduce
  int no_signal_updates_ = 0;
  std::int64_t no_signal_since_ = 0;
  bool no_signal_said_ = false;
};

}  // namespace mgrl::rl
