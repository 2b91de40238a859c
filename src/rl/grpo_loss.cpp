// grpo_loss.cpp: advantages, the clipped GRPO / GSPO loss with its per-token gradient, normalisers, pass@k.
#include "rl/grpo_loss.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mgrl::rl {
namespace {

// Unbiased standard deviation (n - 1), 0 for fewer than two values (as torch gives NaN there, TRL's callers
// never reach it with G >= 2).
double std_unbiased(const double* x, std::size_t n) {
  if (n < 2) return 0;
  double mean = 0;
  for (std::size_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<double>(n);
  double ss = 0;
  for (std::size_t i = 0; i < n; ++i) ss += (x[i] - mean) * (x[i] - mean);
  return std::sqrt(ss / static_cast<double>(n - 1));
}

}  // namespace

// torch.nanmean: the mean of the values that are not NaN (NaN when there are none).
double nan_mean(const double* x, std::size_t n) {
  double s = 0, k = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isnan(x[i])) s += x[i], k += 1;
  return k > 0 ? s / k : std::nan("");
}

// trl's nanstd: the unbiased std of the values that are not NaN (NaN for fewer than two).
double nan_std(const double* x, std::size_t n) {
  const double m = nan_mean(x, n);
  double ss = 0, k = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isnan(x[i])) ss += (x[i] - m) * (x[i] - m), k += 1;
  return k > 1 ? std::sqrt(ss / (k - 1)) : std::nan("");
}

std::vector<double> group_advantages(const std::vector<double>& rewards, int G, const std::string& scale,
                                     std::vector<double>* group_std) {
  MGRL_CHECK(G >= 1 && rewards.size() % static_cast<std::size_t>(G) == 0, "rewards do not form whole groups");
  const std::size_t N = rewards.size(), groups = N / static_cast<std::size_t>(G);
  bool unscorable = false;
  for (const double r : rewards) unscorable = unscorable || std::isnan(r);
  std::vector<double> adv(N);
  // Without NaN: the unbiased std, 0 for fewer than two values (G = 1); with NaN, trl's nanstd over the values there.
  const auto sd_of = [&](const double* x, std::size_t n) { return unscorable ? nan_std(x, n) : std_unbiased(x, n); };
  const double batch_std = sd_of(rewards.data(), N);
  if (group_std) group_std->assign(groups, 0.0);
  for (std::size_t g = 0; g < groups; ++g) {
    const double* r = rewards.data() + g * static_cast<std::size_t>(G);
    const double mean = nan_mean(r, static_cast<std::size_t>(G));
    const double gs = sd_of(r, static_cast<std::size_t>(G));
    if (group_std) (*group_std)[g] = gs;
    const double sd = scale == "group" ? gs : batch_std;
    for (int j = 0; j < G; ++j) {
      double a = r[j] - mean;
      if (scale != "none") a /= sd + 1e-4;
      adv[g * static_cast<std::size_t>(G) + static_cast<std::size_t>(j)] = std::isnan(a) ? 0.0 : a;
    }
  }
  return adv;
}

std::vector<double> normalize_then_sum_advantages(const std::vector<std::vector<double>>& per_func,
                                                  const std::vector<double>& weights, int G, std::vector<double>* sums) {
  const std::size_t N = per_func.size(), K = weights.size();
  MGRL_CHECK(G >= 1 && N % static_cast<std::size_t>(G) == 0, "rewards do not form whole groups");
  // Mean and unbiased std of the values that are there (NaN left out), as torch.nanmean and TRL's nanstd.
  const auto stats = [](const std::vector<double>& x, double* mean, double* sd) {
    *mean = nan_mean(x.data(), x.size());
    *sd = nan_std(x.data(), x.size());
  };
  std::vector<double> sum(N, 0.0);
  std::vector<bool> any(N, false);
  for (std::size_t g = 0; g < N / static_cast<std::size_t>(G); ++g)
    for (std::size_t k = 0; k < K; ++k) {
      std::vector<double> x;
      for (int j = 0; j < G; ++j) x.push_back(per_func[g * static_cast<std::size_t>(G) + static_cast<std::size_t>(j)][k]);
      double mean = 0, sd = 0;
      stats(x, &mean, &sd);
      if (G == 1) sd = 0;  // TRL: zeros for a single generation
      for (int j = 0; j < G; ++j) {
        const std::size_t i = g * static_cast<std::size_t>(G) + static_cast<std::size_t>(j);
        if (std::isnan(x[static_cast<std::size_t>(j)])) continue;  // a missing value: not scorable by this function
        any[i] = true;
        const double term = (x[static_cast<std::size_t>(j)] - mean) / (sd + 1e-4) * weights[k];
        if (!std::isnan(term)) sum[i] += term;  // nansum: a term of a group with one value (its std NaN) adds nothing
      }
    }
  for (std::size_t i = 0; i < N; ++i)
    if (!any[i]) sum[i] = std::nan("");
  double mean = 0, sd = 0;
  stats(sum, &mean, &sd);
  if (N < 2) sd = 0;
  std::vector<double> adv(N, 0.0);
  for (std::size_t i = 0; i < N; ++i) adv[i] = std::isnan(sum[i]) ? 0.0 : (sum[i] - mean) / (sd + 1e-4);
  if (sums) *sums = sum;
  return adv;
}

std::vector<double> rloo_advantages(const std::vector<double>& rewards, const std::vector<double>& kl, int G,
                                    double beta, bool normalize, double clip_min, double clip_max,
                                    std::vector<double>* group_std) {
  MGRL_CHECK(G >= 1 && rewards.size() % static_cast<std::size_t>(G) == 0 && kl.size() == rewards.size(),
             "rewards do not form whole groups");
  const std::size_t N = rewards.size(), groups = N / static_cast<std::size_t>(G);
  std::vector<double> r(N), adv(N);
  for (std::size_t i = 0; i < N; ++i) {
    r[i] = std::isnan(rewards[i]) ? rewards[i] : std::min(clip_max, std::max(clip_min, rewards[i]));
    if (beta != 0.0) r[i] -= beta * kl[i];
  }
  if (group_std) group_std->assign(groups, 0.0);
  for (std::size_t g = 0; g < groups; ++g) {
    const double* x = r.data() + g * static_cast<std::size_t>(G);
    double sum = 0, scorable = 0;
    for (int j = 0; j < G; ++j)
      if (!std::isnan(x[j])) sum += x[j], scorable += 1;
    if (group_std) (*group_std)[g] = G > 1 ? nan_std(x, static_cast<std::size_t>(G)) : 0.0;
    for (int j = 0; j < G; ++j)
      adv[g * static_cast<std::size_t>(G) + static_cast<std::size_t>(j)] =
          G > 1 ? x[j] - (sum - x[j]) / (scorable - 1) : 0.0;  // NaN: unscorable, or alone scorable
  }
  if (normalize) {
    const double mean = nan_mean(adv.data(), N), sd = nan_std(adv.data(), N);
    for (double& a : adv) a = (a - mean) / (sd + 1e-4);
  }
  for (double& a : adv)
    if (std::isnan(a)) a = 0.0;
  return adv;
}

namespace {

// trl's RLOOTrainer loss of one completion: -min(c A, clip(c) A) with c the ratio of its summed log-probs.
SequenceTerms rloo_sequence_loss(const GrpoLossOptions& o, const SequenceIn& s, double* grad) {
  SequenceTerms out;
  const double A = s.advantage, lo = 1.0 - o.epsilon, hi = 1.0 + o.epsilon_high;
  double lr = 0;
  for (int t = 0; t < s.n; ++t) {
    out.tokens += s.mask[t];
    lr += s.mask[t] * (s.old ? static_cast<double>(s.logp[t]) - s.old[t] : 0.0);
    if (s.ref) out.kl_sum += s.mask[t] * (static_cast<double>(s.logp[t]) - s.ref[t]);
  }
  const double c1 = std::exp(lr), c2 = std::min(std::max(c1, lo), hi);
  const bool second = c1 * A > c2 * A;
  out.sum = -std::min(c1 * A, c2 * A);
  // d(-min) / d c1: through the smaller branch where it is not clipped; d c1 / d logp_t = mask_t c1.
  const double d_lr = (second && c2 != c1 ? 0.0 : -A) * c1;
  for (int t = 0; t < s.n; ++t) grad[t] = s.mask[t] * d_lr;
  out.clipped_low = c1 < lo && A < 0 ? 1.0 : 0.0;
  out.clipped_high = c1 > hi && A > 0 ? 1.0 : 0.0;
  out.ratio_sum = out.tokens * c1;
  return out;
}

}  // namespace

SequenceTerms sequence_loss(const GrpoLossOptions& o, const SequenceIn& s, double* grad) {
  if (o.loss_type == "rloo") return rloo_sequence_loss(o, s, grad);
  SequenceTerms out;
  const double A = s.advantage, lo = 1.0 - o.epsilon, hi = 1.0 + o.epsilon_high;
  const bool cispo = o.loss_type == "cispo", sapo = o.loss_type == "sapo", vespo = o.loss_type == "vespo";
  for (int t = 0; t < s.n; ++t) out.tokens += s.mask[t];
  // VESPO's gamma weight of the sequence (trl's get_gamma_weights; a constant of the loss): w = the sequence's
  // importance ratio from the summed, clamped token log-ratios, phi(w) = e^lambda w^k e^(-lambda w) (phi(1) = 1),
  // k and lambda by the advantage's sign; a non-finite phi is 0.
  double phi = 0;
  if (vespo) {
    double lr = 0;
    for (int t = 0; t < s.n; ++t)
      lr += s.mask[t] * (s.old ? std::min(20.0, std::max(-20.0, static_cast<double>(s.logp[t]) - s.old[t])) : 0.0);
    const double log_w = std::min(20.0, std::max(std::log(1e-8), lr));
    const double k = A >= 0 ? o.vespo_k_pos : o.vespo_k_neg;
    const double lambda = std::max(1e-4, A >= 0 ? o.vespo_lambda_pos : o.vespo_lambda_neg);
    phi = std::exp(lambda + k * log_w - lambda * std::exp(log_w));
    if (!std::isfinite(phi)) phi = 0;
    out.phi = phi;
  }
  // The importance weight: exp(log-ratio) per token, or exp of the masked mean log-ratio of the sequence.
  double seq_ratio = 1.0;
  if (o.sequence_level) {
    double lr = 0;
    for (int t = 0; t < s.n; ++t) lr += s.mask[t] * (s.old ? static_cast<double>(s.logp[t]) - s.old[t] : 0.0);
    seq_ratio = std::exp(lr / std::max(1.0, out.tokens));
  }
  // Off-policy sequence masking: the mean forward KL of the old policy against the current one, over the tokens.
  if (o.off_policy_threshold > 0 && s.old && A < 0) {
    double kl = 0;
    for (int t = 0; t < s.n; ++t) kl += s.mask[t] * (static_cast<double>(s.old[t]) - s.logp[t]);
    out.off_policy_masked = kl / std::max(1.0, out.tokens) > o.off_policy_threshold;
  }
  const double keep = out.off_policy_masked ? 0.0 : 1.0;
  double d_seq = 0;  // dS / d(sequence log-ratio), sequence level
  for (int t = 0; t < s.n; ++t) {
    const double m = s.mask[t];
    const double c1 = o.sequence_level ? seq_ratio : (s.old ? std::exp(static_cast<double>(s.logp[t]) - s.old[t]) : 1.0);
    double loss = 0, d_c1 = 0, d_lp = 0;  // the policy term, d/d c1, d/d logp_t directly (plus the KL's, below)
    if (vespo) {
      // -phi A logp_t, phi held constant.
      loss = -phi * A * s.logp[t];
      d_lp = -phi * A;
    } else if (cispo) {
      // -sg(min(c1, epsilon_high)) A logp_t: a REINFORCE term weighted by the capped, detached ratio.
      const double w = std::min(c1, o.epsilon_high);
      loss = -w * A * s.logp[t];
      d_lp = -w * A;
      if (c1 > o.epsilon_high && A > 0) out.clipped_high += m;
    } else if (sapo) {
      // -sigmoid(tau (c1 - 1)) 4 / tau A: a soft gate in place of the clip.
      const double tau = A > 0 ? o.sapo_temperature_pos : o.sapo_temperature_neg;
      const double sg = 1.0 / (1.0 + std::exp(-tau * (c1 - 1.0)));
      loss = -sg * 4.0 / tau * A;
      d_c1 = -4.0 * A * sg * (1.0 - sg);
    } else {
      const double c2 = std::min(std::max(c1, lo), hi);
      // Two-sided clipping: the unclipped branch's ratio capped at delta (no gradient beyond it).
      const bool capped = o.delta > 0 && c1 > o.delta;
      const double c1d = capped ? o.delta : c1;
      // -min(c1d A, c2 A): the gradient flows through the smaller branch's ratio where it is not clipped (c1d: below
      // delta; c2: inside [lo, hi]; with delta the c2 branch can be the smaller one unclipped).
      const bool second = c1d * A > c2 * A;
      loss = -std::min(c1d * A, c2 * A);
      d_c1 = (second ? c2 != c1 : capped) ? 0.0 : -A;  // d(-min(...)) / d c1
      if (c1d < lo && A < 0) out.clipped_low += m;
      if (c1d > hi && A > 0) out.clipped_high += m;
    }
    // The policy term only (off-policy masking, the entropy mask): the KL below stays.
    const double k = keep * (s.entropy_mask ? static_cast<double>(s.entropy_mask[t]) : 1.0);
    loss *= k, d_c1 *= k, d_lp *= k;
    if (o.beta != 0.0) {
      const double delta = static_cast<double>(s.ref[t]) - s.logp[t];
      double kl = std::exp(delta) - delta - 1.0;
      double dkl = 1.0 - std::exp(delta);  // d kl / d logp_t
      if (o.kl_bias_correction) {
        d_c1 += o.beta * kl;  // d(beta * kl * c1) / d c1
        dkl *= c1;
        kl *= c1;
      }
      loss += o.beta * kl;
      d_lp += o.beta * dkl;
      out.kl_sum += m * kl;
    }
    out.sum += m * loss;
    out.ratio_sum += m * c1;
    if (o.sequence_level) {
      d_seq += m * d_c1 * c1;  // d c1 / d(sequence log-ratio) = c1
      grad[t] = m * d_lp;
    } else {
      // d c1 / d logp_t = c1 when the ratio is against a fixed old policy; with old = detached current logp,
      // c1 = exp(logp - stop_grad(logp)) = 1 still has derivative c1 = 1.
      grad[t] = m * (d_lp + d_c1 * c1);
    }
  }
  if (o.sequence_level) {
    const double inv = 1.0 / std::max(1.0, out.tokens);
    for (int t = 0; t < s.n; ++t) grad[t] += d_seq * s.mask[t] * inv;
    out.clipped_low = out.clipped_low > 0 ? 1.0 : 0.0;  // one ratio for the whole completion
    out.clipped_high = out.clipped_high > 0 ? 1.0 : 0.0;
  }
  return out;
}

double quantile_linear(std::vector<double> values, double q) {
  MGRL_CHECK(!values.empty(), "quantile of no values");
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (pos - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

double sequence_weight(const GrpoLossOptions& o, double tokens_i, std::int64_t n_completions, double micro_tokens,
                       double round_tokens, int accum, int steps_per_generation) {
  if (o.loss_type == "grpo" || o.loss_type == "sapo")
    return 1.0 / (static_cast<double>(n_completions) * std::max(1.0, tokens_i));
  if (o.loss_type == "luspo" || o.loss_type == "rloo") return 1.0 / static_cast<double>(n_completions);
  if (o.loss_type == "bnpo") return 1.0 / (static_cast<double>(accum) * std::max(1.0, micro_tokens));
  if (o.loss_type == "dr_grpo")
    return 1.0 / (static_cast<double>(n_completions) * static_cast<double>(o.max_completion_length));
  if (o.loss_type == "dapo" || o.loss_type == "cispo" || o.loss_type == "vespo")
    return static_cast<double>(steps_per_generation) / std::max(1.0, round_tokens);
  throw FatalError("unknown grpo.loss_type '" + o.loss_type + "'");
}

double pass_at_k(int n, int c, int k) {
  if (k <= 0 || n < k) return 0.0;
  if (n - c < k) return 1.0;
  // 1 - prod_{i = n-c+1}^{n} (1 - k / i)
  double p = 1.0;
  for (int i = n - c + 1; i <= n; ++i) p *= 1.0 - static_cast<double>(k) / i;
  return 1.0 - p;
}

}  // namespace mgrl::rl
