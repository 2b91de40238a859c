// dpo.h: the direct preference optimisation loop (trl's DPOTrainer): each step takes a global batch of preference
// pairs split over ranks and micro-batches; the reference's sequence log-probs come from the same model with the
// adapter switched off (one no-grad pass per micro-batch, before the policy's) or were computed once before
// training (full fine-tuning, a starting adapter, or dpo.precompute_ref_log_probs); the loss is the mean over the
// global batch of the per-pair loss, its gradient reaches every completion token through the backward's per-token
// weights; then the SFT machinery: gradient allreduce, clipping, AdamW, checkpoints with exact resume, metrics with
// trl's names, and a held-out evaluation (preference accuracy, loss, optionally greedy exact-match accuracy).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/mpi_env.h"
#include "model/transformer.h"
#include "train/checkpointer.h"
#include "train/data.h"
#include "train/divergence.h"
#include "train/dpo_data.h"
#include "train/dpo_loss.h"
#include "train/grad_sync.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/trainable.h"

namespace mgrl::train {

struct DpoOptions {
  DpoLossOptions loss;  // loss.type Kto: KTO examples (load_kto), each micro-batch's KL estimate before its loss
  double ld_alpha = 1.0;  // LD-DPO: weight of completion tokens beyond the shorter completion's length; 1: off
  // The reference's log-probs: false: the adapter switched off, once per micro-batch; true: computed for every pair
  // before training with the starting weights (what full fine-tuning and a starting adapter need).
  bool precompute_ref = false;
  // The starting trainable weights are the base model's function (a fresh adapter, B = 0): the reference is the base
  // (train::reference_identity, which checkpoints keep).
  bool initial_is_base = false;
  // The reference is the starting weights held as a frozen copy of the trainable ones, swapped in for the reference
  // pass: KTO from a starting adapter or with full fine-tuning (no adapter to switch off; the KL sequences are paired
  // per micro-batch, so their reference cannot be scored before training), and any run whose reference moves.
  bool frozen_reference = false;
  // TR-DPO (dpo/kto.sync_ref_model): the frozen reference mixed with the policy; needs frozen_reference and not
  // precompute_ref.
  RefSync ref_sync;
  // KTO: the sequences' length cap (kto.max_length).
  // kto.loss_type: true "kto" (the KL estimate from the KL sequences), false "apo_zero_unpaired" (trl: no KL estimate,
  // 0 in the loss and the logs; no KL sequences: kto_example puts a placeholder of one unscored token in their slot).
  bool kto_kl = true;
  int kto_max_length = 1024;
  std::int64_t max_steps = 100;
  std::int64_t stop_at_step = 0;
  int global_batch = 8;  // pairs per optimizer step over all ranks
  int grad_accum = 1;
  double max_grad_norm = 1.0;
  LossScaling scaling;  // dynamic loss scaling (fp16 storage, or train.loss_scaling)
  kernels::Ops::AdamW adamw;
  Schedule schedule;
  std::uint64_t seed = 0;
  bool shuffle = true;  // data.shuffle: each epoch in a seeded random order; false: the data's order
  int log_every = 1;
  int eval_every = 0;
  int eval_batch = 16;  // pairs per scoring pass
  // Held-out greedy exact-match accuracy of the chosen completions (the app layer generates). Collective.
  std::function<double(const std::vector<Example>&)> accuracy;
  CheckpointOptions checkpoint;
  int max_nonfinite_steps = 25;
  std::string log_dir;
};

// The figures of a set of pairs, summed (divide by pairs for trl's means).
struct DpoSums {
  double pairs = 0, loss = 0, reward_chosen = 0, reward_rejected = 0, accuracy = 0, margin = 0, logp_chosen = 0,
         logp_rejected = 0;
  double logp_accuracy = 0;  // mgrl's addition: the policy's own preference, chosen log-prob > rejected log-prob
  double sft_nll = 0, chosen_tokens = 0;  // -sum of the chosen completions' token log-probs, and their count
  // trl's token metrics (training forwards only: dpo_token_metrics): entropy sums over the completion tokens of both
  // sequences, the chosen tokens predicted as the most likely one, the mean logits' sums of each side, and the counts.
  double entropy = 0, completion_tokens = 0, top1_chosen = 0, logits_chosen = 0, logits_rejected = 0,
         chosen_count = 0, rejected_count = 0;
  // KTO (`mgrl kto`): the desirable and undesirable examples counted (rewards/chosen and logps/chosen are sums over the
  // desirable ones, .../rejected over the undesirable ones), and the KL estimates of the micro-batches (rank 0's).
  double kto_desirable = 0, kto_undesirable = 0, kto_kl = 0, kto_kl_count = 0;
  bool kto() const { return kto_desirable + kto_undesirable > 0; }
  // The loss: the mean pair loss, plus sft_weight x the chosen tokens' mean negative log-prob.
  double total_loss(double sft_weight) const;
  void add(const DpoPairIn& in, const DpoPairOut& out);
  void allreduce(const dist::MpiEnv& env);
  void merge(const DpoSums& o);  // adds o's sums (a log window of several steps)
};

// The pieces of a DPO micro-batch (the trainer's, and the fixture test's against trl):
// the packed batch of some pairs (chosen, rejected, chosen, ...) and each row's weight in its sequence's log-prob
// (0 on prompt rows, 1 on completion rows; ld_alpha beyond the shorter completion's length);
model::Batch dpo_batch(const std::vector<const PreferencePair*>& mb, double ld_alpha, std::vector<float>* token_weight);
// the sequence log-prob of each packed sequence from the per-token log-probs lp (packed as the batch);
std::vector<double> dpo_sequence_logps(const model::Batch& b, const std::vector<float>& token_weight, const float* lp);
// the pairs' losses (added to sums) and the backward's per-token weights w (its loss is -sum_i w_i logp_i) for the
// loss pair_factor x sum of the per-pair losses + sft_factor x sum of the chosen completion tokens' -logp; lp holds
// the policy's per-token log-probs, pol and ref the policy's and the reference's sequence log-probs.
// pair_weights (optional, one per pair): each pair's loss and derivatives multiplied by it (WPO).
void dpo_loss_weights(const DpoLossOptions& o, const std::vector<const PreferencePair*>& mb, const model::Batch& b,
                      const std::vector<float>& token_weight, const float* lp, const std::vector<double>& pol,
                      const std::vector<double>& ref, double pair_factor, double sft_factor, std::vector<float>* w,
                      DpoSums* sums, const std::vector<double>* pair_weights = nullptr);
// WPO's pair weights (trl's use_weighting, Zhou et al. 2024 Eq. 2) from the policy's per-token log-probs lp and the
// same pass's TokenStats (log sum p^2): for each sequence exp(the mean over its completion tokens of logp -
// log sum_v p_v^2), a pair's weight the product of its chosen's and rejected's.
std::vector<double> wpo_weights(const std::vector<const PreferencePair*>& mb, const model::Batch& b, const float* lp,
                                const model::TokenStats& ts);
// KTO's estimate of the KL of a global micro-batch is max(0, the sum of this over its ranks / its examples): the sum
// over this rank's examples of the policy's minus the reference's KL-sequence log-prob (pol, ref as
// dpo_sequence_logps: each example's completion, then its KL sequence). trl's, detached.
double kto_kl_sum(const std::vector<double>& pol, const std::vector<double>& ref);
// KTO's KL pairing within a block [mb_begin, mb_end) of slots of `global` (data indices): a training step's global
// micro-batch, or a block of the held-out file. The partner of slot s: the slot before it (the first takes the
// last's: trl's rotation, on the examples that are trained together), or the nearest before that holding another
// example; s itself only in a block of one example.
std::size_t kto_partner(const std::vector<std::size_t>& global, std::size_t mb_begin, std::size_t mb_end, std::size_t s);
// The example at slot s with its KL sequence: its prompt followed by its partner's completion, cut to max_length.
// Without the KL estimate (kl false: apo_zero_unpaired) the KL sequence's slot holds kto_no_kl_sequence's placeholder.
PreferencePair kto_example(const std::vector<PreferencePair>& data, const std::vector<std::size_t>& global,
                           std::size_t mb_begin, std::size_t mb_end, std::size_t s, int max_length, bool kl = true);
// The KL sequence's placeholder: the example's first token alone, before its prompt ends (or, with no prompt, at
// position 0, which predicts nothing): no token of it is scored, its log-prob is 0 under every policy, its pass one
// token.
void kto_no_kl_sequence(PreferencePair& x);
// The KL sequences of KTO examples alone (their rejected), scored from their prompt's end, the dropout key of the one
// of global slot first + k 2 (first + k) + 1 (as in DPO's packing, where it is the rejected).
model::Batch kto_kl_batch(const std::vector<PreferencePair>& mb, std::size_t first);
// kto_example for one rank's share [begin, end) of a global micro-batch [mb_begin, mb_end).
std::vector<PreferencePair> kto_micro_batch(const std::vector<PreferencePair>& data, const std::vector<std::size_t>& global,
                                            std::size_t mb_begin, std::size_t mb_end, std::size_t begin, std::size_t end,
                                            int max_length, bool kl = true);
// Adds trl's token metrics of a training forward of dpo_batch(mb) (its TokenStats) to sums (KTO: the completions'
// tokens only, by label).
void dpo_token_metrics(const std::vector<const PreferencePair*>& mb, const model::Batch& b, const model::TokenStats& ts,
                       DpoSums* sums);
// Completion tokens of the chosen sequences of some pairs.
double chosen_tokens(const std::vector<const PreferencePair*>& pairs);

struct DpoResult {
  std::int64_t steps = 0, skipped = 0;
  double final_loss = 0, eval_loss = -1, eval_preference_accuracy = -1, eval_accuracy = -1, seconds = 0;
};

class DpoTrainer {
 public:
  DpoTrainer(const dist::MpiEnv& env, dist::Comm& comm, model::Transformer& model, std::vector<PreferencePair> train,
             std::vector<PreferencePair> eval, DpoOptions opts);
  ~DpoTrainer();
  DpoResult run();
  // The held-out figures (every rank); exact-match accuracy too when `accuracy` (else -1).
  DpoSums evaluate();
  const TrainState& state() const { return state_; }

 private:
  void precompute(std::vector<PreferencePair>& pairs);
  // The reference's sequence log-probs of a micro-batch: precomputed, or the adapter switched off.
  void reference(const std::vector<const PreferencePair*>& mb, const model::Batch& b, const std::vector<float>& tw,
                 std::vector<double>* ref);
  // The reference's per-token log-probs of a batch (not precomputed): the frozen copy swapped in, or the adapter off.
  void score_reference(const model::Batch& b, float* lp);
  double train_step(DpoSums* sums);
  // KTO: the log-prob of each KL sequence of a micro-batch (kto_kl_batch(mb)) under the reference, or under the
  // policy by a training-mode forward with no backward.
  std::vector<double> kto_kl_logps(const model::Batch& kb, const std::vector<PreferencePair>& mb, bool policy,
                                   std::uint64_t dropout);

  const dist::MpiEnv& env_;
  dist::Comm& comm_;
  model::Transformer& model_;
  std::vector<PreferencePair> train_, eval_;
  DpoOptions opts_;
  Sampler sampler_;
  Trainable tr_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::unique_ptr<DivergenceGuard> guard_;
  TrainState state_;
  StepOutcome last_outcome_ = StepOutcome::Updated;
  double last_norm_ = 0;
  std::int64_t last_tokens_ = 0;
  std::unique_ptr<FrozenCopy> frozen_;  // the frozen reference (frozen_reference), or none
};

}  // namespace mgrl::train
