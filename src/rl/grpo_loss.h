// grpo_loss.h: the GRPO objective on the host, as TRL's GRPOTrainer (1.16) defines it: group-relative
// advantages (scale_rewards group | batch | none), the clipped importance-ratio loss per token or per sequence
// (GSPO), the k3 KL estimator against a reference (optionally multiplied by the ratio), and the loss types grpo |
// bnpo | dr_grpo | dapo | luspo (clipped, optionally two-sided: delta) and cispo | sapo | vespo, each with its
// normalisation; and trl's RLOOTrainer (rloo: leave-one-out advantages with the KL in the rewards, one clipped ratio of
// summed log-probs per completion). The loss is a function of each completion token's log-prob, so
// its gradient is computed here per token and handed to the model's backward as per-token weights. Formulas:
// docs/grpo.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mgrl::rl {

// torch.nanmean: the mean of the values that are not NaN (NaN when there are none); trl's nanstd: the unbiased std
// of the values that are not NaN (NaN for fewer than two).
double nan_mean(const double* x, std::size_t n);
double nan_std(const double* x, std::size_t n);

// Advantages of N = groups * G rewards laid out group by group (completion i belongs to group i / G):
// A_i = r_i - mean(group), divided by (std + 1e-4) where std is the unbiased (n - 1) standard deviation of the
// group (group) or of the whole batch (batch); none: not divided. group_std (optional) gets each group's std.
// A NaN reward (an unscorable completion: Rewards::total) is left out of the means and stds (torch.nanmean, trl's
// nanstd: NaN for fewer than two values) and gets advantage 0, as does any advantage that comes out NaN (trl's
// nan_to_num).
std::vector<double> group_advantages(const std::vector<double>& rewards, int G, const std::string& scale_rewards,
                                     std::vector<double>* group_std = nullptr);
// multi_objective_aggregation = normalize_then_sum (GDPO; TRL's): each reward function's values normalised within
// their group, (r_k - mean) / (std + 1e-4), summed with the weights, then the sums normalised over the whole batch
// the same way (scale_rewards is not used). per_func [N][K] (NaN: the function gave no value, left out of the means,
// stds and sums); *sums gets the weighted sums (NaN where every function gave none, advantage 0 there).
std::vector<double> normalize_then_sum_advantages(const std::vector<std::vector<double>>& per_func,
                                                  const std::vector<double>& weights, int G,
                                                  std::vector<double>* sums = nullptr);

// trl's RLOOTrainer (1.16): each completion's reward (the weighted sum; NaN: unscorable) clipped to [clip_min,
// clip_max], minus beta x kl[i] (the sum over its loss tokens of the old policy's log-prob minus the reference's: the KL
// as a reward penalty, k1), then its leave-one-out advantage A_i = r_i - the mean of the other scorable rewards of its
// group (nansum / (scorable - 1)); normalize: then (A - mean) / (std + 1e-4) over the whole batch (nan-aware, unbiased
// std). NaN advantages (unscorable, or alone scorable in its group; G = 1) become 0. group_std (optional) gets each
// group's nan-aware std of the penalised rewards (trl's frac_reward_zero_std).
std::vector<double> rloo_advantages(const std::vector<double>& rewards, const std::vector<double>& kl, int G,
                                    double beta, bool normalize, double clip_min, double clip_max,
                                    std::vector<double>* group_std = nullptr);

struct GrpoLossOptions {
  // grpo | bnpo | dr_grpo | dapo | luspo | cispo | sapo | vespo | rloo (trl's RLOOTrainer: the ratio of the summed
  // log-probs of the sequence, clipped, per completion, mean over completions; the KL is in the advantages, not here)
  std::string loss_type = "dapo";
  double beta = 0.0;
  // Clipped losses: the ratio clipped to [1 - epsilon, 1 + epsilon_high]; cispo: the ratio's weight capped at
  // epsilon_high itself (CISPO's epsilon_max, as TRL).
  double epsilon = 0.2, epsilon_high = 0.2;
  double delta = 0;  // > 0: two-sided clipping of the clipped losses (INTELLECT-2): the unclipped ratio capped at delta
  double sapo_temperature_pos = 1.0, sapo_temperature_neg = 1.05;  // sapo's soft gate, advantage > 0 / <= 0
  // vespo's gamma weighting of the sequence ratio, advantage >= 0 / < 0 (trl's vespo_k_pos, ...)
  double vespo_k_pos = 2.0, vespo_lambda_pos = 3.0, vespo_k_neg = 3.0, vespo_lambda_neg = 2.0;
  // > 0: off-policy sequence masking (DeepSeek-V3.2; trl's off_policy_mask_threshold): a completion with a negative
  // advantage whose mean (old - current) log-prob over its tokens exceeds this gets no policy loss (its KL stays).
  double off_policy_threshold = 0;
  bool sequence_level = false;  // importance_sampling_level = sequence (GSPO)
  bool kl_bias_correction = false;
  int max_completion_length = 512;
};

// One completion of n tokens. logp: the current policy's log-probs (at the sampling temperature); old: the
// old policy's (nullptr: the current ones, detached, so the ratio is 1); ref: the reference's (needed when
// beta > 0); mask: 1 for tokens in the loss (0 for all of a masked truncated completion).
struct SequenceIn {
  int n = 0;
  const float* logp = nullptr;
  const float* old = nullptr;
  const float* ref = nullptr;
  const float* mask = nullptr;
  // trl's top_entropy_quantile (optional): 1 on the tokens whose entropy reaches the batch's quantile, 0 elsewhere; it
  // multiplies the policy term of each token (not its KL term, nor the normaliser's token count).
  const float* entropy_mask = nullptr;
  double advantage = 0;
};

// torch.quantile(values, q) (linear interpolation between the sorted values); values not empty.
double quantile_linear(std::vector<double> values, double q);

// S = sum_t mask_t * loss_t of one completion, dS/dlogp_t, and what the step metrics count.
struct SequenceTerms {
  double sum = 0;             // S
  double tokens = 0;          // sum of the mask
  double kl_sum = 0;          // sum_t mask_t * kl_t (the estimator as it enters the loss; rloo: logp - ref, k1)
  // Mask tokens with ratio < 1 - epsilon and advantage < 0 (clipped losses), and with ratio > 1 + epsilon_high (cispo:
  // epsilon_high) and advantage > 0; at the sequence level 1 or 0 for the completion (TRL counts sequences there).
  double clipped_low = 0;
  double clipped_high = 0;
  double ratio_sum = 0;       // sum_t mask_t * ratio_t
  bool off_policy_masked = false;  // the policy term dropped (off_policy_threshold)
  double phi = 0;                  // vespo: the sequence's gamma weight (trl logs its mean: vespo/phi_seq_mean)
};
// rloo: S is the completion's loss -min(c A, clip(c) A), c = exp(sum_t mask_t (logp_t - old_t)), whatever its length
// (a completion without loss tokens: -A, no gradient, as trl's mean counts it).
SequenceTerms sequence_loss(const GrpoLossOptions& o, const SequenceIn& s, double* grad);

// The factor c_i with loss = sum_i c_i * S_i for completion i, given its mask-token count, the number of
// completions in the step's (global) batch, the mask tokens of its global micro-batch and of the whole generation
// round, the number of micro-batches (gradient accumulation) and the optimizer steps the round is cut into
// (grpo.steps_per_generation; 1: the round is the step's batch):
//   grpo:    1 / (N * max(1, tokens_i))            (mean over completions of their token mean)
//   bnpo:    1 / (accum * max(1, tokens of its micro-batch))
//   dr_grpo: 1 / (N * max_completion_length)
//   dapo, cispo, vespo: steps / max(1, tokens of the round)   (trl: num_items_in_batch of the generation batch,
//                                                              times gradient_accumulation_steps / steps_per_generation)
//   sapo:    as grpo
//   luspo:   1 / N                                    (mean over completions of their token sum)
//   rloo:    1 / N                                    (mean over completions of their sequence loss)
double sequence_weight(const GrpoLossOptions& o, double tokens_i, std::int64_t n_completions, double micro_tokens,
                       double round_tokens, int accum, int steps_per_generation = 1);

// pass@k from n samples of which c are correct (the unbiased estimator 1 - C(n-c, k) / C(n, k)).
double pass_at_k(int n, int c, int k);

}  // namespace mgrl::rl
