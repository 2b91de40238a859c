// ppo_loss.h: the PPO objective on the host, as trl's PPOTrainer computes it (trl.experimental.ppo, trl 1.12.0, the
// last trl that has one): a per-token KL penalty against the reference (k1 or k3; the coefficient fixed, or adapted
// between updates by ppo_adaptive_kl_coef as trl 0.x did), the sequence score at the last position (minus a missing-EOS
// penalty), optional reward whitening, GAE (gamma, lam), whitened advantages, the clipped policy loss and the clipped
// value loss (cliprange_value, vf_coef), with their gradients with respect to each token's new log-prob and each
// position's new value, and trl's metrics. Pure functions over per-sequence arrays; sums over a batch that spans ranks
// go through a caller-given reducer. Formulas and the differences from trl: docs/ppo.md.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mgrl::rl {

enum class KlEstimator { K1, K3 };

// "k1" or "k3" (UserError naming ppo.kl_estimator otherwise).
KlEstimator kl_estimator_from(const std::string& name);

struct PpoOptions {
  double gamma = 1.0;             // discount
  double lam = 0.95;              // GAE lambda
  double cliprange = 0.2;         // policy ratio clip
  double cliprange_value = 0.2;   // value prediction clip around the rollout's values
  double vf_coef = 0.1;           // weight of the value loss
  double kl_coef = 0.05;          // weight of the per-token KL penalty in the rewards
  KlEstimator kl_estimator = KlEstimator::K1;
  bool whiten_rewards = false;    // whiten the per-token rewards over the batch (no mean shift)
  double missing_eos_penalty = 0; // subtracted from the score of a response without EOS; 0: none
  int response_length = 53;       // most tokens generated per response (trl's response_length)
};

// Value positions of a response of n tokens: position t < n is the state before token t; a response that stopped
// before response_length also has position n, the state after its last token, where the score is placed (trl:
// sequence_length + 1 while it is inside the padded width). A response of response_length tokens has n.
int ppo_value_positions(int n, int response_length);

// The per-token KL estimate from the policy's and the reference's log-probs of the sampled token:
// k1 = logp - ref, k3 = exp(ref - logp) - 1 - (ref - logp) (http://joschu.net/blog/kl-approx.html).
double ppo_kl(KlEstimator e, double logp, double ref);

// The adaptive KL controller of Ziegler et al., "Fine-Tuning Language Models from Human Preferences"
// (arXiv:1909.08593), as trl 0.x's AdaptiveKLController updates it after each rollout batch: with
// e = clip(kl / target - 1, -0.2, 0.2), the next coefficient is coef * (1 + e * samples / horizon); kl is the batch's
// mean over responses of the summed per-token KL (objective/kl), samples the responses of the global batch.
// A non-finite kl leaves coef as it is (trl's would become NaN).
double ppo_adaptive_kl_coef(double coef, double kl, double target, double horizon, double samples);

// Sums over ranks in place (v[0..n)); an empty function: a batch in one process.
using SumReducer = std::function<void(double* v, int n)>;

// Whitening as trl's masked_whiten over all the given values of the batch: (x - mean) / sqrt(var + 1e-8), var the
// unbiased (count - 1) variance, plus the mean back when !shift_mean. Fewer than two values: var = 0 (trl: NaN).
struct Whitening {
  double mean = 0, var = 0;
  bool shift_mean = true;
  double apply(double x) const;
};

// One rollout sequence.
struct PpoSequence {
  // in
  std::vector<double> logp;    // the rollout policy's log-probs of the n response tokens (sampling temperature)
  std::vector<double> ref;     // the reference's log-probs of the same tokens (same temperature)
  std::vector<double> values;  // the value head at the rollout, ppo_value_positions(n) entries
  double score = 0;            // the sequence reward
  bool has_eos = true;         // the response contains EOS (else missing_eos_penalty applies)
  // out (ppo_advantages)
  double penalised_score = 0;     // score - missing_eos_penalty when !has_eos
  std::vector<double> kl;         // n: the estimator per token
  std::vector<double> rewards;    // value positions: -kl_coef * kl, + penalised_score at the last (whitened if asked)
  std::vector<double> returns;    // value positions: GAE advantage + value
  std::vector<double> advantages; // n: GAE advantages whitened over the batch's response tokens
  int n() const { return static_cast<int>(logp.size()); }
};

// Rewards, GAE and whitening for a whole batch (all sequences of this rank; `reduce` makes the whitening statistics
// those of the global batch). GAE: delta_t = r_t + gamma V_{t+1} - V_t (V = 0 past the last value position),
// A_t = delta_t + gamma lam A_{t+1}, returns_t = A_t + V_t; advantages = whiten(A_t, t < n).
void ppo_advantages(const PpoOptions& o, std::vector<PpoSequence>& batch, const SumReducer& reduce = {});

// What one mini-batch's loss is made of, summed over its sequences (and, by the caller, over ranks).
struct PpoTerms {
  double pg_sum = 0, pg_tokens = 0, pg_clipped = 0;  // sum_t max(-A r, -A clip(r)); tokens; clipped side larger
  double vf_sum = 0, vf_tokens = 0, vf_clipped = 0;  // sum_t max((v - R)^2, (v_clip - R)^2); positions; clipped
  double logdiff_sq = 0;                             // sum_t (logp_new - logp_old)^2
  double ratio_sum = 0;                              // sum_t exp(logp_new - logp_old)
  double sequences = 0;
  static constexpr int kCount = 9;
  double* data() { return &pg_sum; }
  void add(const PpoTerms& t);
};

// One sequence of a mini-batch under the current policy: new_logp (n) and new_values (value positions). Writes
// d(pg_sum)/d new_logp[t] into d_logp and d(vf_sum)/d new_values[t] into d_values (either may be null); the
// mini-batch's loss gradient is these times ppo_loss()'s logp_scale and value_scale. torch's conventions at ties
// (max: half to each side; clamp: the gradient passes at the bounds) are kept.
PpoTerms ppo_sequence_terms(const PpoOptions& o, const PpoSequence& s, const double* new_logp,
                            const double* new_values, double* d_logp, double* d_values);

// A mini-batch's loss from its summed terms: pg_loss = pg_sum / pg_tokens, vf_loss = 0.5 vf_sum / vf_tokens,
// loss = pg_loss + vf_coef vf_loss, and the per-mini-batch figures trl logs: clip fractions, approxkl =
// 0.5 mean (logp_new - logp_old)^2 and the mean ratio, both over sequences x response_length positions as trl's
// padded tensors are when a response reaches response_length (padding: difference 0, ratio 1).
struct PpoLoss {
  double loss = 0, pg_loss = 0, vf_loss = 0;
  double pg_clipfrac = 0, vf_clipfrac = 0, approxkl = 0, ratio_mean = 0;
  double logp_scale = 0, value_scale = 0;  // d loss / d new_logp = d_logp * logp_scale; values likewise
};
PpoLoss ppo_loss(const PpoOptions& o, const PpoTerms& t);

// Per-rollout sums behind trl's objective/* metrics (divide by sequences; summed over ranks by the caller).
struct PpoRolloutSums {
  double sequences = 0, kl = 0, neg_logp = 0, non_score_reward = 0, score = 0, eos = 0;
  static constexpr int kCount = 6;
  double* data() { return &sequences; }
};
PpoRolloutSums ppo_rollout_sums(const PpoOptions& o, const std::vector<PpoSequence>& batch);

// trl's metric names and values for one update from the rollout sums (global) and every mini-batch's loss:
// objective/kl, objective/entropy, objective/non_score_reward, objective/rlhf_reward, objective/scores,
// policy/approxkl_avg, policy/clipfrac_avg, loss/policy_avg, loss/value_avg, val/clipfrac_avg, val/ratio,
// val/ratio_var (unbiased variance of the mini-batch mean ratios), val/num_eos_tokens.
std::vector<std::pair<std::string, double>> ppo_metrics(const PpoRolloutSums& r, const std::vector<PpoLoss>& mb);

}  // namespace mgrl::rl
