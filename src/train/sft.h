// sft.h: the supervised fine-tuning loop: data-parallel steps (global batch split over ranks and
// micro-batches, loss = mean over the global batch's completion tokens), gradient allreduce, global-norm
// clipping, AdamW, learning-rate schedule, inf/NaN steps skipped on every rank together, held-out loss
// and exact-match accuracy, HDF5 checkpoints with exact resume, metrics (stdout line, progress line,
// metrics.jsonl, TensorBoard, job_summary.txt).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/mpi_env.h"
#include "io/tokenizer.h"
#include "model/transformer.h"
#include "train/checkpointer.h"
#include "train/checkpoint.h"
#include "train/checkpointer.h"
#include "train/divergence.h"
#include "train/grad_sync.h"
#include "train/optimizer.h"
#include "train/trainable.h"
#include "train/data.h"
#include "train/schedule.h"

namespace mgrl::train {

struct SftOptions {
  std::int64_t max_steps = 100;
  std::int64_t stop_at_step = 0;  // > 0: stop after this step (checkpoint written), schedule unchanged
  int global_batch = 8;  // sequences per optimizer step over all ranks
  int grad_accum = 1;    // micro-batches per rank per step
  double max_grad_norm = 1.0;  // 0: no clipping
  LossScaling scaling;         // enabled: dynamic loss scaling (train.loss_scaling)
  kernels::Ops::AdamW adamw;
  Schedule schedule;
  std::uint64_t seed = 0;
  bool shuffle = true;  // data.shuffle: each epoch in a seeded random order; false: the data's order
  int log_every = 1;
  int eval_every = 0;  // 0: only at the end
  int eval_batch = 16;
  // Held-out accuracy in [0, 1] of the given examples, computed by the caller (the app layer generates;
  // train sits below rl). Collective: called on every rank. Empty: no accuracy.
  std::function<double(const std::vector<Example>&)> accuracy;
  CheckpointOptions checkpoint;
  int max_nonfinite_steps = 25;  // consecutive steps with a non-finite loss or gradient norm that stop the run; 0 never
  std::string log_dir;
  double gpu_peak_tflops = 0;  // for MFU; 0 unknown
  // train.packing: the examples packed into rows of up to this many tokens (train.max_seq_len, or the model's
  // positions when fewer), train.batch_size rows a step, as trl's packing = True; 0: a row per example.
  int pack_capacity = 0;
  // train.loss_type = "dft" (trl's SFTConfig.loss_type): each loss token's weight times its probability under the
  // model, taken as a constant (DFT, arXiv 2508.05629): loss and gradient -p log p and -p d(log p). The step runs the
  // forward, reads the log-probs back and then the backward (never the fused LM head pass).
  bool dft = false;
  float neftune_alpha = 0;  // train.neftune_noise_alpha: NEFTune's embedding noise in training forwards; 0 none
};

// The rows a step's batch is drawn from: one per example, or with pack_capacity > 0 the examples packed into rows of
// up to that many tokens (pack_bfd), each row a list of example indices.
std::vector<std::vector<std::size_t>> sft_rows(const std::vector<Example>& examples, int pack_capacity);

struct SftResult {
  std::int64_t steps = 0, skipped = 0, overflows = 0, checkpoints = 0;
  double final_loss = 0, final_eval_loss = -1, best_eval_loss = -1, eval_accuracy = -1, seconds = 0;
  double tokens_per_second = 0;
};

class SftTrainer {
 public:
  // rows: sft_rows(train, opts.pack_capacity) (the caller counts them for train.num_epochs: packed once).
  SftTrainer(const dist::MpiEnv& env, dist::Comm& comm, model::Transformer& model, const io::Tokenizer& tok,
             std::vector<Example> train, std::vector<Example> eval, std::vector<std::vector<std::size_t>> rows,
             SftOptions opts);
  ~SftTrainer();
  SftResult run();
  // Held-out loss (mean over completion tokens, all ranks) and, optionally, the accuracy callback's value.
  std::pair<double, double> evaluate(bool accuracy);
  const TrainState& state() const { return state_; }
  std::size_t rows() const { return rows_.size(); }  // rows of the training data (examples, or packed rows)

 private:
  double train_step();

  const dist::MpiEnv& env_;
  dist::Comm& comm_;
  model::Transformer& model_;
  const io::Tokenizer& tok_;
  std::vector<Example> train_, eval_;
  SftOptions opts_;
  // The rows a batch is made of (train.batch_size counts them): one example each, or with train.packing the
  // examples packed into rows of up to opts_.pack_capacity tokens (pack_bfd).
  std::vector<std::vector<std::size_t>> rows_;
  Sampler sampler_;
  Trainable tr_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::unique_ptr<DivergenceGuard> guard_;
  StepOutcome last_outcome_ = StepOutcome::Updated;  // of the last step
  TrainState state_;
  double last_norm_ = 0;
  // trl's token metrics of the last step: the mean entropy of the model's distribution and the share of tokens it
  // predicts as its most likely one, over the step's loss tokens (every rank's).
  double last_entropy_ = 0, last_accuracy_ = 0;
  double eval_entropy_ = 0, eval_token_accuracy_ = 0;  // the same over the held-out set's loss tokens (evaluate)
  std::int64_t last_tokens_all_ = 0;  // every token of the last step's global batch
  std::vector<float> lp_;       // train.loss_type = dft: a micro-batch's log-probs on the host
  double* loss_acc_ = nullptr;  // the step's loss, entropy and accuracy sums (and dft's scratch), on the device
  std::size_t peak_gpu_ = 0;
};

}  // namespace mgrl::train
