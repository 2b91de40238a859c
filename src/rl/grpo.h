// grpo.h: the GRPO training loop: per step, the global batch of prompts is split over ranks; each rank samples
// G completions per prompt with the current policy (the generator: one prefill per prompt, KV prefix shared),
// scores them with the reward functions on the host, and all ranks compute group-relative advantages from the
// gathered rewards; old-policy log-probs (a round serving several steps) and reference log-probs (beta > 0: the
// adapter switched off, or swapped for a frozen copy of the starting adapter) come from the model's no-grad scoring
// pass; then steps_per_generation x num_iterations optimizer steps of the clipped policy loss (+ beta KL), each on
// its slice of that round, normalised over the global batch, with the shared gradient sync, optimizer, checkpoints
// and run log of src/train.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dist/comm.h"
#include "dist/mpi_env.h"
#include "io/tokenizer.h"
#include "model/transformer.h"
#include "rl/generator.h"
#include "rl/grpo_loss.h"
#include "rl/prompts.h"
#include "rl/rewards/rewards.h"
#include "rl/rollout.h"
#include "train/checkpointer.h"
#include "train/data.h"
#include "train/divergence.h"
#include "train/grad_sync.h"
#include "train/optimizer.h"
#include "train/run_log.h"
#include "train/trainable.h"

namespace mgrl::rl {

struct GrpoOptions {
  double top_entropy_quantile = 1.0;  // trl's: < 1 keeps the policy loss on the highest-entropy tokens only
  // trl's entropy bonus: loss -= coef x the mean entropy of each micro-batch's completion tokens (those the policy
  // loss covers) / grad_accum; adaptive (Skywork-OR1): coef moves by delta each step, up while the step's entropy is
  // at most target, down otherwise, within [min, max], and applies only while the last step's entropy was at most
  // target.
  double entropy_coef = 0.0;
  bool adaptive_entropy = false;
  double entropy_coef_min = 0.0, entropy_coef_max = 1.0, entropy_coef_delta = 0.005, entropy_target = 0.2;
  bool entropy_bonus() const { return entropy_coef != 0.0 || adaptive_entropy; }
  train::OptimizerOptions optim;
  train::CheckpointOptions checkpoint;
  int max_nonfinite_steps = 25;  // consecutive steps with a non-finite loss or gradient norm that stop the run; 0 never
  std::int64_t max_steps = 100;
  std::int64_t stop_at_step = 0;
  int batch_prompts = 8;  // prompts per generation round over all ranks
  int grad_accum = 1;     // micro-batches per rank per optimizer step
  int num_generations = 8;
  int max_completion_length = 512;
  kernels::Ops::Sampling sampling;
  float repetition_penalty = 1.0f;  // grpo.repetition_penalty (GenerationOptions): the rollouts' and pass@k's
  std::vector<std::string> stop;
  CacheSettings cache;  // generate.*
  GrpoLossOptions loss;
  std::string scale_rewards = "group";
  // loss.loss_type = rloo (trl's RLOOTrainer): the leave-one-out advantages normalised over the round
  // (grpo.normalize_advantages), and the rewards clipped to [reward_clip_min, reward_clip_max] first.
  bool normalize_advantages = false;
  double reward_clip_min = -std::numeric_limits<double>::infinity();
  double reward_clip_max = std::numeric_limits<double>::infinity();
  // sum_then_normalize: the advantages of the weighted sum of the rewards (scale_rewards); normalize_then_sum: each
  // reward normalised in its group first (GDPO, normalize_then_sum_advantages).
  std::string multi_objective_aggregation = "sum_then_normalize";
  int num_iterations = 1;
  // Optimizer steps per generation round (trl's steps_per_generation / gradient_accumulation_steps): a round samples
  // steps_per_generation x batch_prompts prompts, its completions are shuffled (a seeded permutation, the same on any
  // rank count, as trl's shuffle_sequence_dict) and cut into that many slices, one per step, num_iterations times over.
  int steps_per_generation = 1;
  bool mask_truncated = false;
  std::string reference = "initial";  // initial | base
  // TR-DPO (grpo.sync_ref_model; beta > 0): the reference, then a copy of the trainable weights, mixed with the policy.
  train::RefSync ref_sync;
  std::string balance = "tokens";     // tokens | none: how prompts and completions are split over ranks
  std::uint64_t seed = 0;
  bool shuffle = true;  // data.shuffle: each epoch in a seeded random order; false: the data's order
  int log_every = 1;
  int eval_every = 0;
  int eval_max_new_tokens = 32;
  int pass_k = 0, num_samples = 0;
  std::string accuracy_reward;
  int rollouts_every = 1;
  std::string log_dir;
  std::string config_text;
  int threads = 1;
  double gpu_peak_tflops = 0;
};

struct EvalResult {
  double mean_reward = -1, accuracy = -1, pass_k = -1;
  std::size_t prompts = 0;
  // Greedy completions whose accuracy reward has no value (null: a judge that failed with on_error = "null", a
  // reward program printing null): counted as not correct, and said (eval_unjudged).
  long long unjudged = 0;
};

struct GrpoResult {
  std::int64_t steps = 0, skipped = 0, overflows = 0;
  EvalResult first_eval, last_eval;
  double seconds = 0;
};

class GrpoTrainer {
 public:
  // `initial_is_base`: the model's LoRA adapter starts fresh (B = 0), so the initial policy is the base model.
  GrpoTrainer(const dist::MpiEnv& env, dist::Comm& comm, model::Transformer& model, const io::Tokenizer& tok,
              const Rewards& rewards, std::vector<PromptRow> train, std::vector<PromptRow> eval, GrpoOptions opts,
              bool initial_is_base);
  ~GrpoTrainer();
  GrpoResult run();
  // Mean reward, accuracy of greedy completions and pass@k on the held-out prompts (collective).
  EvalResult evaluate();

 private:
  struct Round;
  void new_round();
  void resume_round(const std::string& extra);
  // How the round's advantages are computed (kept with a round in checkpoints; a resume under another is refused).
  std::string advantages_kind() const;
  // Steps one generation round serves (steps_per_generation x num_iterations), and whether a step trains on a policy
  // that may have moved since the round was sampled (so that the old policy's log-probs are needed).
  int steps_per_round() const { return opts_.steps_per_generation * opts_.num_iterations; }
  bool off_policy_steps() const { return steps_per_round() > 1; }
  // The KL term in the loss (beta > 0 except rloo), or in rloo's advantages (its rewards' penalty: every completion
  // scored by the old policy and the reference before the advantages).
  bool kl_in_loss() const { return opts_.loss.beta > 0 && opts_.loss.loss_type != "rloo"; }
  bool rloo_kl() const { return opts_.loss.beta > 0 && opts_.loss.loss_type == "rloo"; }
  // Cuts the round's completions (every rank's, in slot order) into its slices and keeps this rank's share of each;
  // returns the cost of every completion in slot order (training_split's) and the split of each slice (slot numbers).
  void slice_round(const std::vector<Rollout>& all, std::vector<double>* cost,
                   std::vector<std::vector<std::size_t>>* rank_slots);
  void score_round(bool old_policy, bool reference);
  double train_step(nlohmann::json* metrics);
  std::vector<RewardSample> samples_of(const std::vector<Rollout>& rs) const;
  // The batch of local rollouts `idx` (prompt + completion each) and their prompt lengths.
  model::Batch batch_of(const std::vector<std::size_t>& idx, std::vector<int>* prompt_lens) const;
  // Local rollouts in [begin, end) whose loss can be non-zero (see trains()); never empty when the range is not:
  // a rank must run every micro-batch's backward, whose gradient buckets are collectives.
  std::vector<std::size_t> trained_in(std::size_t begin, std::size_t end) const;
  std::vector<double> all_ranks(double v) const;
  std::vector<std::vector<std::size_t>> generation_split(const std::vector<std::size_t>& indices) const;
  std::vector<std::vector<std::size_t>> training_split(const std::vector<Rollout>& all, std::vector<double>* cost) const;

  const dist::MpiEnv& env_;
  dist::Comm& comm_;
  model::Transformer& model_;
  const io::Tokenizer& tok_;
  const Rewards& rewards_;
  std::vector<PromptRow> train_, eval_;
  GrpoOptions opts_;
  bool initial_is_base_;
  train::Sampler sampler_;
  train::Trainable tr_;
  std::unique_ptr<train::Optimizer> opt_;
  std::unique_ptr<train::GradSync> sync_;
  std::unique_ptr<train::Checkpointer> ckpt_;
  std::unique_ptr<train::DivergenceGuard> guard_;
  train::StepOutcome last_outcome_ = train::StepOutcome::Updated;  // of the last step
  train::TrainState state_;
  std::unique_ptr<train::FrozenCopy> frozen_;  // the starting trainable weights (reference = initial), or none
  std::unique_ptr<Round> round_;
  std::size_t slice_ = 0;  // the round's slice that batch_of and trained_in read (this step's)
  train::PhaseTimes phases_, total_phases_;
  double last_norm_ = 0;
  std::int64_t generated_tokens_ = 0, trained_tokens_ = 0;
  int accuracy_fn_ = -1;
  // Mean completion length of each prompt (data file line) when last generated, and over all completions so far.
  std::unordered_map<std::int64_t, double> seen_length_;
  double seen_sum_ = 0;
  std::int64_t seen_count_ = 0;
  // Straggler wait of every rank over the run (s): at the end of generation + rewards, and in training.
  std::vector<double> wait_rollout_, wait_training_;
  kernels::PhaseSeconds phases_seen_{};  // the backend's phase times at the end of the previous step
  double imbalance_sum_[2] = {0, 0};  // generation, training: sums over rounds of max / mean tokens
  int rounds_ = 0;
  // Generation rounds in a row in which no completion had a learning signal (say_if_no_signal).
  int no_signal_rounds_ = 0;
  std::int64_t no_signal_since_ = 0;
  bool no_signal_said_ = false;
  bool unscorable_said_ = false;  // say_if_unscorable
  // The entropy bonus's coefficient (adaptive: moved each step) and the last step's mean entropy (+inf before any).
  double entropy_coef_ = 0.0, last_world_entropy_ = 0.0;
  void say_if_no_signal(const std::vector<Rollout>& all, std::int64_t first_step);
  void say_if_unscorable(const std::vector<Rollout>& all, std::int64_t first_step);
};

}  // namespace mgrl::rl
