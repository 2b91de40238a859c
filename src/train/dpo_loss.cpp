// dpo_loss.cpp: the DPO per-pair losses and their derivatives (formulas: docs/dpo.md).
#include "train/dpo_loss.h"

#include <cstdio>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mgrl::train {
namespace {

// log(sigmoid(x)) without overflow: -softplus(-x).
double log_sigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::abs(x))); }
double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

}  // namespace

DpoLossType dpo_loss_type(const std::string& name) {
  if (name == "sigmoid") return DpoLossType::Sigmoid;
  if (name == "hinge") return DpoLossType::Hinge;
  if (name == "ipo") return DpoLossType::Ipo;
  if (name == "robust") return DpoLossType::Robust;
  if (name == "sigmoid_norm") return DpoLossType::SigmoidNorm;
  if (name == "exo_pair") return DpoLossType::ExoPair;
  if (name == "nca_pair") return DpoLossType::NcaPair;
  if (name == "bco_pair") return DpoLossType::BcoPair;
  if (name == "sppo_hard") return DpoLossType::SppoHard;
  if (name == "apo_zero") return DpoLossType::ApoZero;
  if (name == "apo_down") return DpoLossType::ApoDown;
  if (name == "discopop") return DpoLossType::DiscoPop;
  if (name == "aot") return DpoLossType::Aot;
  if (name == "aot_unpaired") return DpoLossType::AotUnpaired;
  throw UserError("dpo.loss_type: unknown loss '" + name + "' (sigmoid, hinge, ipo, robust, sigmoid_norm, exo_pair, "
                  "nca_pair, bco_pair, sppo_hard, apo_zero, apo_down, discopop, aot or aot_unpaired)");
}

std::vector<std::pair<DpoLossType, double>> dpo_loss_members(const DpoLossOptions& o) {
  if (o.mix.empty()) return {{o.type, 1.0}};
  return o.mix;
}

std::string dpo_loss_label(const DpoLossOptions& o) {
  if (o.mix.empty()) return dpo_loss_name(o.type);
  std::string out;
  char w[32];
  for (const auto& [t, weight] : o.mix) {
    std::snprintf(w, sizeof w, "%g ", weight);
    out += (out.empty() ? "" : " + ") + std::string(w) + dpo_loss_name(t);
  }
  return out;
}

const char* dpo_loss_name(DpoLossType t) {
  switch (t) {
    case DpoLossType::Sigmoid: return "sigmoid";
    case DpoLossType::Hinge: return "hinge";
    case DpoLossType::Ipo: return "ipo";
    case DpoLossType::Robust: return "robust";
    case DpoLossType::SigmoidNorm: return "sigmoid_norm";
    case DpoLossType::ExoPair: return "exo_pair";
    case DpoLossType::NcaPair: return "nca_pair";
    case DpoLossType::BcoPair: return "bco_pair";
    case DpoLossType::SppoHard: return "sppo_hard";
    case DpoLossType::ApoZero: return "apo_zero";
    case DpoLossType::ApoDown: return "apo_down";
    case DpoLossType::DiscoPop: return "discopop";
    case DpoLossType::Aot: return "aot";
    case DpoLossType::AotUnpaired: return "aot_unpaired";
    case DpoLossType::Kto: return "kto";
  }
  return "?";
}

bool dpo_loss_of_difference(DpoLossType t) {
  return !(t == DpoLossType::NcaPair || t == DpoLossType::BcoPair || t == DpoLossType::SppoHard ||
           t == DpoLossType::ApoZero || t == DpoLossType::ApoDown);
}

bool dpo_loss_is_batch(DpoLossType t) { return t == DpoLossType::Aot || t == DpoLossType::AotUnpaired; }

std::vector<DpoPairOut> dpo_batch_loss(const DpoLossOptions& o, const std::vector<DpoPairIn>& pairs) {
  MGRL_CHECK(dpo_loss_is_batch(o.type), "dpo_batch_loss: not a batch loss");
  const std::size_t n = pairs.size();
  const bool unpaired = o.type == DpoLossType::AotUnpaired;
  // aot: a = policy chosen - rejected, b = the reference's; aot_unpaired: a = chosen log-ratio, b = rejected log-ratio.
  std::vector<double> a(n), bv(n);
  for (std::size_t k = 0; k < n; ++k) {
    const DpoPairIn& p = pairs[k];
    a[k] = unpaired ? p.chosen - p.ref_chosen : p.chosen - p.rejected;
    bv[k] = unpaired ? p.rejected - p.ref_rejected : p.ref_chosen - p.ref_rejected;
  }
  std::vector<std::size_t> ia(n), ib(n);  // ascending orders (ties: by index, as a stable sort)
  for (std::size_t k = 0; k < n; ++k) ia[k] = ib[k] = k;
  std::stable_sort(ia.begin(), ia.end(), [&](std::size_t x, std::size_t y) { return a[x] < a[y]; });
  std::stable_sort(ib.begin(), ib.end(), [&](std::size_t x, std::size_t y) { return bv[x] < bv[y]; });
  std::vector<DpoPairOut> out(n);
  const double beta = o.beta, e = o.label_smoothing;
  for (std::size_t k = 0; k < n; ++k) {
    out[k].reward_chosen = beta * (pairs[k].chosen - pairs[k].ref_chosen);
    out[k].reward_rejected = beta * (pairs[k].rejected - pairs[k].ref_rejected);
  }
  for (std::size_t j = 0; j < n; ++j) {
    const double x = beta * (a[ia[j]] - bv[ib[j]]);
    out[j].loss = -log_sigmoid(x) * (1 - e) - log_sigmoid(-x) * e;
    const double dd = beta * (-sigmoid(-x) * (1 - e) + sigmoid(x) * e);  // d loss_j / d delta_j
    // delta_j's own terms: aot, +chosen -rejected of the pair at a's position j (b is the reference's); aot_unpaired,
    // +chosen of the pair at a's position j, -rejected of the pair at b's position j.
    out[ia[j]].d_chosen += dd;
    if (unpaired)
      out[ib[j]].d_rejected -= dd;
    else
      out[ia[j]].d_rejected -= dd;
  }
  return out;
}

DpoPairOut dpo_pair_loss(const DpoLossOptions& o, const DpoPairIn& p) {
  DpoPairOut r;
  const double b = o.beta;
  if (o.type == DpoLossType::Kto) {
    MGRL_CHECK(p.label == 0 || p.label == 1, "kto: an example without a label");
    const double lr = p.chosen - p.ref_chosen;
    const bool desirable = p.label == 1;
    const double w = desirable ? o.desirable_weight : o.undesirable_weight;
    const double z = desirable ? b * (lr - o.kto_kl) : b * (o.kto_kl - lr);
    const double sg = sigmoid(z);
    r.loss = w * (1.0 - sg);
    r.d_chosen = (desirable ? -1.0 : 1.0) * w * b * sg * (1.0 - sg);
    (desirable ? r.reward_chosen : r.reward_rejected) = b * lr;
    return r;
  }
  const double lc = p.chosen - p.ref_chosen, lr = p.rejected - p.ref_rejected;  // the log-ratios
  r.reward_chosen = b * lc;
  r.reward_rejected = b * lr;
  // The scores of the f-divergence and their derivatives (reverse KL: the log-ratios themselves).
  double sc = lc, sr = lr, fc = 1, fr = 1;
  if (o.f_divergence == "forward_kl") {
    fc = std::exp(-lc), fr = std::exp(-lr);
    sc = 1 - fc, sr = 1 - fr;
  } else if (o.f_divergence == "js_divergence") {
    sc = std::log(2.0) + log_sigmoid(lc), sr = std::log(2.0) + log_sigmoid(lr);
    fc = sigmoid(-lc), fr = sigmoid(-lr);
  } else if (o.f_divergence == "alpha_divergence" && std::fabs(o.f_alpha - 1.0) >= 1e-6) {
    const double a1 = o.f_alpha - 1.0;
    const auto f = [a1](double h, double* df) {
      const double t = a1 * h;
      *df = t > 80.0 ? 0.0 : std::exp(t);
      return (std::exp(std::min(t, 80.0)) - 1.0) / a1;
    };
    sc = f(lc, &fc), sr = f(lr, &fr);
  }
  MGRL_CHECK(o.f_divergence == "reverse_kl" || dpo_loss_of_difference(o.type), "dpo: f_divergence with a loss of each side");
  const double d = sc - sr;  // trl's delta_score
  double dd = 0;             // d loss / d delta
  switch (o.type) {
    case DpoLossType::Sigmoid:
      r.loss = -log_sigmoid(b * d);
      dd = -b * sigmoid(-b * d);
      break;
    case DpoLossType::Hinge:
      r.loss = std::max(0.0, 1.0 - b * d);
      dd = 1.0 - b * d > 0 ? -b : 0.0;  // torch's relu has gradient 0 at 0
      break;
    case DpoLossType::Robust: {
      const double e = o.label_smoothing;
      r.loss = (-(1 - e) * log_sigmoid(b * d) + e * log_sigmoid(-b * d)) / (1 - 2 * e);
      dd = (-(1 - e) * b * sigmoid(-b * d) - e * b * sigmoid(b * d)) / (1 - 2 * e);
      break;
    }
    case DpoLossType::ExoPair: {
      // EXO (pairwise): KL(softmax over {chosen, rejected} of beta * log-ratios || [1 - e, e]).
      const double e = o.label_smoothing, x = b * d;
      const double qw = sigmoid(x), ql = sigmoid(-x), lqw = log_sigmoid(x), lql = log_sigmoid(-x);
      const double gap = (lqw - std::log1p(-e)) - (lql - std::log(e));
      r.loss = qw * (lqw - std::log1p(-e)) + ql * (lql - std::log(e));
      dd = b * qw * ql * gap;
      break;
    }
    case DpoLossType::Aot:
    case DpoLossType::AotUnpaired:
      MGRL_CHECK(false, "dpo: AOT is a loss over the batch (dpo_batch_loss), not of one pair");
      break;
    case DpoLossType::Kto:  // above
      break;
    case DpoLossType::DiscoPop: {
      // DiscoPOP: the logistic and exponential losses of x = beta * delta blended by sigmoid(x / tau).
      const double x = b * d, tau = o.discopop_tau, m = sigmoid(x / tau), dm = m * (1 - m) / tau;
      r.loss = -log_sigmoid(x) * (1 - m) + std::exp(-x) * m;
      dd = b * (-sigmoid(-x) * (1 - m) + log_sigmoid(x) * dm - std::exp(-x) * m + std::exp(-x) * dm);
      break;
    }
    case DpoLossType::NcaPair:
    case DpoLossType::BcoPair:
    case DpoLossType::SppoHard:
    case DpoLossType::ApoZero:
    case DpoLossType::ApoDown: {
      // Losses of the two log-ratios on their own (not of their difference alone).
      const double cr = b * lc, rr = b * lr;
      if (o.type == DpoLossType::NcaPair) {
        r.loss = -log_sigmoid(cr) - 0.5 * log_sigmoid(-cr) - 0.5 * log_sigmoid(-rr);
        r.d_chosen = b * (-sigmoid(-cr) + 0.5 * sigmoid(cr));
        r.d_rejected = b * 0.5 * sigmoid(rr);
      } else if (o.type == DpoLossType::BcoPair) {
        r.loss = -log_sigmoid(cr) - log_sigmoid(-rr);
        r.d_chosen = -b * sigmoid(-cr);
        r.d_rejected = b * sigmoid(rr);
      } else if (o.type == DpoLossType::SppoHard) {  // the hard-probability SPPO: squared margins of +-1 / (2 beta)
        r.loss = (lc - 0.5 / b) * (lc - 0.5 / b) + (lr + 0.5 / b) * (lr + 0.5 / b);
        r.d_chosen = 2 * (lc - 0.5 / b);
        r.d_rejected = 2 * (lr + 0.5 / b);
      } else if (o.type == DpoLossType::ApoZero) {  // APO-zero: chosen up, rejected down
        r.loss = 1 - sigmoid(cr) + sigmoid(rr);
        r.d_chosen = -b * sigmoid(cr) * sigmoid(-cr);
        r.d_rejected = b * sigmoid(rr) * sigmoid(-rr);
      } else {  // APO-down: chosen down, rejected down more
        const double x = b * d;
        r.loss = sigmoid(cr) + 1 - sigmoid(x);
        r.d_chosen = b * sigmoid(cr) * sigmoid(-cr) - b * sigmoid(x) * sigmoid(-x);
        r.d_rejected = b * sigmoid(x) * sigmoid(-x);
      }
      return r;
    }
    case DpoLossType::Ipo:
    case DpoLossType::SigmoidNorm: {
      // The log-ratios per completion token: delta = lc / n_c - lr / n_r.
      const double nc = std::max(1, p.chosen_tokens), nr = std::max(1, p.rejected_tokens);
      const double delta = sc / nc - sr / nr;
      double dl = 0;  // d loss / d delta
      if (o.type == DpoLossType::Ipo) {
        const double u = delta - 1.0 / (2.0 * b);
        r.loss = u * u;
        dl = 2.0 * u;
      } else {
        r.loss = -log_sigmoid(b * delta);
        dl = -b * sigmoid(-b * delta);
      }
      r.d_chosen = dl * fc / nc;
      r.d_rejected = -dl * fr / nr;
      return r;
    }
  }
  r.d_chosen = dd * fc;
  r.d_rejected = -dd * fr;
  return r;
}

}  // namespace mgrl::train
