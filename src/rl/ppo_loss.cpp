// ppo_loss.cpp: PPO rewards, GAE, whitening, the clipped policy and value losses with their gradients, metrics.
#include "rl/ppo_loss.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mgrl::rl {
namespace {

void reduce_sums(const SumReducer& reduce, double* v, int n) {
  if (reduce) reduce(v, n);
}

// Mean and unbiased variance of the values picked by `each` over the batch (two passes, each reduced over ranks),
// as trl's masked_mean / masked_var.
template <class Each>
Whitening batch_whitening(const SumReducer& reduce, bool shift_mean, Each each) {
  double s[2] = {0, 0};  // sum, count
  each([&](double x) {
    s[0] += x;
    s[1] += 1;
  });
  reduce_sums(reduce, s, 2);
  Whitening w;
  w.shift_mean = shift_mean;
  w.mean = s[1] > 0 ? s[0] / s[1] : 0.0;
  double c = 0;
  each([&](double x) { c += (x - w.mean) * (x - w.mean); });
  reduce_sums(reduce, &c, 1);
  // trl: masked_mean(centered^2) * (count / (count - 1)), the Bessel factor an integer division that torch does in
  // float32 (a relative difference below 6e-8 from the exact factor, kept so that the fixtures agree to 1e-9).
  const float bessel = static_cast<float>(s[1]) / static_cast<float>(s[1] - 1);
  w.var = s[1] > 1 ? c / s[1] * static_cast<double>(bessel) : 0.0;
  return w;
}

// d max(a, b) with torch's tie rule: the gradient goes to the larger side, half to each at a tie.
double max_grad(double a, double b, double da, double db) {
  if (a > b) return da;
  if (b > a) return db;
  return 0.5 * (da + db);
}

}  // namespace

KlEstimator kl_estimator_from(const std::string& name) {
  if (name == "k1") return KlEstimator::K1;
  if (name == "k3") return KlEstimator::K3;
  throw UserError("ppo.kl_estimator: '" + name + "' is not k1 or k3");
}

int ppo_value_positions(int n, int response_length) { return n < response_length ? n + 1 : n; }

double ppo_adaptive_kl_coef(double coef, double kl, double target, double horizon, double samples) {
  if (!std::isfinite(kl)) return coef;
  const double e = std::clamp(kl / target - 1.0, -0.2, 0.2);
  return coef * (1.0 + e * samples / horizon);
}

double ppo_kl(KlEstimator e, double logp, double ref) {
  const double logr = ref - logp;
  return e == KlEstimator::K1 ? -logr : std::expm1(logr) - logr;
}

double Whitening::apply(double x) const {
  double w = (x - mean) / std::sqrt(var + 1e-8);
  if (!shift_mean) w += mean;
  return w;
}

void ppo_advantages(const PpoOptions& o, std::vector<PpoSequence>& batch, const SumReducer& reduce) {
  for (auto& s : batch) {
    const int n = s.n(), nv = ppo_value_positions(n, o.response_length);
    MGRL_CHECK(static_cast<int>(s.ref.size()) == n && static_cast<int>(s.values.size()) == nv && n >= 1,
               "ppo: a sequence's log-probs, reference and values do not fit its length");
    s.penalised_score = s.score - (s.has_eos ? 0.0 : o.missing_eos_penalty);
    s.kl.resize(static_cast<std::size_t>(n));
    s.rewards.assign(static_cast<std::size_t>(nv), 0.0);
    for (int t = 0; t < n; ++t) {
      s.kl[static_cast<std::size_t>(t)] = ppo_kl(o.kl_estimator, s.logp[static_cast<std::size_t>(t)],
                                                 s.ref[static_cast<std::size_t>(t)]);
      s.rewards[static_cast<std::size_t>(t)] = -o.kl_coef * s.kl[static_cast<std::size_t>(t)];
    }
    s.rewards[static_cast<std::size_t>(nv - 1)] += s.penalised_score;
  }
  if (o.whiten_rewards) {
    const Whitening w = batch_whitening(reduce, false, [&](auto f) {
      for (const auto& s : batch)
        for (double r : s.rewards) f(r);
    });
    for (auto& s : batch)
      for (double& r : s.rewards) r = w.apply(r);
  }
  for (auto& s : batch) {
    const int nv = static_cast<int>(s.rewards.size());
    s.returns.assign(static_cast<std::size_t>(nv), 0.0);
    double last = 0;
    for (int t = nv - 1; t >= 0; --t) {
      const double next = t + 1 < nv ? s.values[static_cast<std::size_t>(t + 1)] : 0.0;
      const double delta = s.rewards[static_cast<std::size_t>(t)] + o.gamma * next - s.values[static_cast<std::size_t>(t)];
      last = delta + o.gamma * o.lam * last;
      s.returns[static_cast<std::size_t>(t)] = last;  // the raw advantage for now
    }
  }
  const Whitening w = batch_whitening(reduce, true, [&](auto f) {
    for (const auto& s : batch)
      for (int t = 0; t < s.n(); ++t) f(s.returns[static_cast<std::size_t>(t)]);
  });
  for (auto& s : batch) {
    s.advantages.resize(static_cast<std::size_t>(s.n()));
    for (int t = 0; t < s.n(); ++t) s.advantages[static_cast<std::size_t>(t)] = w.apply(s.returns[static_cast<std::size_t>(t)]);
    for (std::size_t t = 0; t < s.returns.size(); ++t) s.returns[t] += s.values[t];
  }
}

void PpoTerms::add(const PpoTerms& t) {
  const double* src = &t.pg_sum;
  double* dst = data();
  for (int i = 0; i < kCount; ++i) dst[i] += src[i];
}

PpoTerms ppo_sequence_terms(const PpoOptions& o, const PpoSequence& s, const double* new_logp,
                            const double* new_values, double* d_logp, double* d_values) {
  PpoTerms out;
  out.sequences = 1;
  const int n = s.n(), nv = static_cast<int>(s.values.size());
  MGRL_CHECK(static_cast<int>(s.advantages.size()) == n && static_cast<int>(s.returns.size()) == nv,
             "ppo: sequence terms before ppo_advantages");
  const double lo = 1.0 - o.cliprange, hi = 1.0 + o.cliprange;
  for (int t = 0; t < n; ++t) {
    const std::size_t i = static_cast<std::size_t>(t);
    const double A = s.advantages[i], diff = new_logp[t] - s.logp[i], ratio = std::exp(diff);
    const double clipped = std::min(std::max(ratio, lo), hi);
    const double l1 = -A * ratio, l2 = -A * clipped;
    out.pg_sum += std::max(l1, l2);
    out.pg_tokens += 1;
    if (l2 > l1) out.pg_clipped += 1;
    out.logdiff_sq += diff * diff;
    out.ratio_sum += ratio;
    if (d_logp) {
      const double d1 = -A * ratio, d2 = (ratio >= lo && ratio <= hi) ? -A * ratio : 0.0;
      d_logp[t] = max_grad(l1, l2, d1, d2);
    }
  }
  for (int t = 0; t < nv; ++t) {
    const std::size_t i = static_cast<std::size_t>(t);
    const double v = new_values[t], R = s.returns[i];
    const double vlo = s.values[i] - o.cliprange_value, vhi = s.values[i] + o.cliprange_value;
    const double vc = std::min(std::max(v, vlo), vhi);
    const double e1 = (v - R) * (v - R), e2 = (vc - R) * (vc - R);
    out.vf_sum += std::max(e1, e2);
    out.vf_tokens += 1;
    if (e2 > e1) out.vf_clipped += 1;
    if (d_values) {
      const double d1 = 2 * (v - R), d2 = (v >= vlo && v <= vhi) ? 2 * (vc - R) : 0.0;
      d_values[t] = max_grad(e1, e2, d1, d2);
    }
  }
  return out;
}

PpoLoss ppo_loss(const PpoOptions& o, const PpoTerms& t) {
  PpoLoss l;
  const double pg_n = std::max(1.0, t.pg_tokens), vf_n = std::max(1.0, t.vf_tokens);
  l.pg_loss = t.pg_sum / pg_n;
  l.vf_loss = 0.5 * t.vf_sum / vf_n;
  l.loss = l.pg_loss + o.vf_coef * l.vf_loss;
  l.pg_clipfrac = t.pg_clipped / pg_n;
  l.vf_clipfrac = t.vf_clipped / vf_n;
  const double padded = std::max(1.0, t.sequences * o.response_length);
  l.approxkl = 0.5 * t.logdiff_sq / padded;
  l.ratio_mean = (t.ratio_sum + (padded - t.pg_tokens)) / padded;
  l.logp_scale = 1.0 / pg_n;
  l.value_scale = o.vf_coef * 0.5 / vf_n;
  return l;
}

PpoRolloutSums ppo_rollout_sums(const PpoOptions& o, const std::vector<PpoSequence>& batch) {
  PpoRolloutSums r;
  for (const auto& s : batch) {
    r.sequences += 1;
    for (int t = 0; t < s.n(); ++t) {
      r.kl += s.kl[static_cast<std::size_t>(t)];
      r.neg_logp -= s.logp[static_cast<std::size_t>(t)];
      r.non_score_reward -= o.kl_coef * s.kl[static_cast<std::size_t>(t)];
    }
    r.score += s.penalised_score;
    r.eos += s.has_eos ? 1 : 0;
  }
  return r;
}

std::vector<std::pair<std::string, double>> ppo_metrics(const PpoRolloutSums& r, const std::vector<PpoLoss>& mb) {
  const double n = std::max(1.0, r.sequences);
  const double m = std::max<double>(1.0, static_cast<double>(mb.size()));
  double approxkl = 0, clipfrac = 0, pg = 0, vf = 0, vclip = 0, ratio = 0;
  for (const auto& l : mb) {
    approxkl += l.approxkl;
    clipfrac += l.pg_clipfrac;
    pg += l.pg_loss;
    vf += l.vf_loss;
    vclip += l.vf_clipfrac;
    ratio += l.ratio_mean;
  }
  ratio /= m;
  double ratio_var = 0;
  for (const auto& l : mb) ratio_var += (l.ratio_mean - ratio) * (l.ratio_mean - ratio);
  ratio_var = mb.size() > 1 ? ratio_var / (static_cast<double>(mb.size()) - 1) : 0.0;
  return {{"objective/kl", r.kl / n},
          {"objective/entropy", r.neg_logp / n},
          {"objective/non_score_reward", r.non_score_reward / n},
          {"objective/rlhf_reward", (r.non_score_reward + r.score) / n},
          {"objective/scores", r.score / n},
          {"policy/approxkl_avg", approxkl / m},
          {"policy/clipfrac_avg", clipfrac / m},
          {"loss/policy_avg", pg / m},
          {"loss/value_avg", vf / m},
          {"val/clipfrac_avg", vclip / m},
          {"val/ratio", ratio},
          {"val/ratio_var", ratio_var},
          {"val/num_eos_tokens", r.eos}};
}

}  // namespace mgrl::rl
