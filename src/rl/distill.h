// distill.h: on-policy knowledge distillation (`mgrl distill`, trl's DistillationTrainer; Agarwal et al. 2024): each
// step the student samples a completion of each of the step's prompts, and learns to match the teacher's next-token
// distributions over those completions' tokens: the divergence (forward KL, reverse KL or the generalized JSD, beta)
// summed over the step's completion tokens and divided by their number (every rank's), at the sampling temperature.
// Data-parallel over ranks: a prompt's completion depends on the run seed, the step and its slot in the global batch
// only, so any rank count trains the same weights (up to floating-point reassociation). Checkpoints and resume,
// held-out divergence, the SFT trainer's logs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/mpi_env.h"
#include "io/tokenizer.h"
#include "model/transformer.h"
#include "rl/generator.h"
#include "rl/prompts.h"
#include "train/checkpointer.h"
#include "train/data.h"
#include "train/divergence.h"
#include "train/grad_sync.h"
#include "train/optimizer.h"
#include "train/trainable.h"

namespace mgrl::rl {

struct DistillOptions {
  std::int64_t max_steps = 100;
  std::int64_t stop_at_step = 0;  // > 0: stop after this step (checkpoint written), schedule unchanged
  int batch_prompts = 8;          // prompts (one completion each) per optimizer step over all ranks
  int grad_accum = 1;             // micro-batches per rank per step
  train::OptimizerOptions optim;
  train::CheckpointOptions checkpoint;
  int max_nonfinite_steps = 25;
  // The divergence: beta 0 forward KL(teacher || student), 1 reverse KL(student || teacher), between: the generalized
  // JSD with the mixture (1 - beta) p_student + beta p_teacher (trl's beta); both distributions at
  // sampling.temperature, which also samples the completions (trl's temperature).
  float beta = 1.0f;
  int max_completion_length = 512;
  kernels::Ops::Sampling sampling;
  float repetition_penalty = 1.0f;
  std::vector<std::string> stop;
  CacheSettings cache;  // generate.*
  std::uint64_t seed = 0;
  bool shuffle = true;
  int log_every = 1;
  int eval_every = 0;  // 0: only at the end (held-out prompts given)
  std::string log_dir;
  std::string config_text;
  double gpu_peak_tflops = 0;
};

struct DistillResult {
  std::int64_t steps = 0, skipped = 0, checkpoints = 0;
  double final_loss = 0, final_eval_loss = -1, seconds = 0;
};

class DistillTrainer {
 public:
  // student: trainable (LoRA or full fine-tuning); teacher: frozen, of the student's vocabulary (any width or depth).
  DistillTrainer(const dist::MpiEnv& env, dist::Comm& comm, model::Transformer& student, model::Transformer& teacher,
                 const io::Tokenizer& tok, std::vector<PromptRow> train, std::vector<PromptRow> eval,
                 DistillOptions opts);
  ~DistillTrainer();
  DistillResult run();
  // The held-out divergence (its completions sampled by the student with the eval seed) and the student's entropy,
  // means over their completion tokens (every rank's). Collective.
  std::pair<double, double> evaluate();

 private:
  // The step's prompts of this rank (its share of the global batch's slots) and their completions, sampled.
  struct Sampled {
    std::vector<std::vector<std::int32_t>> sequences;  // prompt + completion
    std::vector<int> prompt_len;
    std::vector<std::int64_t> slots;  // in the global batch
    std::vector<std::string> finish;
    std::int64_t completion_tokens = 0;
  };
  Sampled sample(const std::vector<PromptRow>& rows, const std::vector<std::size_t>& indices, std::size_t lo,
                 std::size_t hi, std::uint64_t seed);
  double train_step();
  // One micro-batch's packed batch and loss weights (inv for each completion token).
  model::Batch batch_of(const Sampled& s, std::size_t lo, std::size_t hi, double inv, std::vector<float>* w) const;

  const dist::MpiEnv& env_;
  dist::Comm& comm_;
  model::Transformer& model_;
  model::Transformer& teacher_;
  const io::Tokenizer& tok_;
  std::vector<PromptRow> train_, eval_;
  DistillOptions opts_;
  train::Sampler sampler_;
  train::Trainable tr_;
  std::unique_ptr<train::Optimizer> opt_;
  std::unique_ptr<train::GradSync> sync_;
  std::unique_ptr<train::Checkpointer> ckpt_;
  std::unique_ptr<train::DivergenceGuard> guard_;
  train::StepOutcome last_outcome_ = train::StepOutcome::Updated;
  train::TrainState state_;
  double* acc_ = nullptr;  // backend doubles: the loss and the entropy sums of a step
  double last_norm_ = 0, last_entropy_ = 0, last_gen_seconds_ = 0;
  std::int64_t last_tokens_ = 0;  // every token of the step's sequences (all ranks)
  // completion lengths of the last step (all ranks): mean, min, max, and the share cut at max_completion_length
  double len_mean_ = 0, len_min_ = 0, len_max_ = 0, clipped_ = 0;
};

}  // namespace mgrl::rl
