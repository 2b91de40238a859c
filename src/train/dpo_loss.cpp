// dpo_loss.cpp: the DPO per-pair losses and their derivatives (formulas: docs/dpo.md).
#include "train/dpo_loss.h"

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
  throw UserError("dpo.loss_type: unknown loss '" + name + "' (sigmoid, hinge, ipo, robust or sigmoid_norm)");
}

const char* dpo_loss_name(DpoLossType t) {
  switch (t) {
    case DpoLossType::Sigmoid: return "sigmoid";
    case DpoLossType::Hinge: return "hinge";
    case DpoLossType::Ipo: return "ipo";
    case DpoLossType::Robust: return "robust";
    case DpoLossType::SigmoidNorm: return "sigmoid_norm";
  }
  return "?";
}

DpoPairOut dpo_pair_loss(const DpoLossOptions& o, const DpoPairIn& p) {
  DpoPairOut r;
  const double b = o.beta;
  const double lc = p.chosen - p.ref_chosen, lr = p.rejected - p.ref_rejected;  // the log-ratios
  r.reward_chosen = b * lc;
  r.reward_rejected = b * lr;
  const double d = lc - lr;  // trl's delta_score (reverse KL)
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
    case DpoLossType::Ipo:
    case DpoLossType::SigmoidNorm: {
      // The log-ratios per completion token: delta = lc / n_c - lr / n_r.
      const double nc = std::max(1, p.chosen_tokens), nr = std::max(1, p.rejected_tokens);
      const double delta = lc / nc - lr / nr;
      double dl = 0;  // d loss / d delta
      if (o.type == DpoLossType::Ipo) {
        const double u = delta - 1.0 / (2.0 * b);
        r.loss = u * u;
        dl = 2.0 * u;
      } else {
        r.loss = -log_sigmoid(b * delta);
        dl = -b * sigmoid(-b * delta);
      }
      r.d_chosen = dl / nc;
      r.d_rejected = -dl / nr;
      return r;
    }
  }
  r.d_chosen = dd;
  r.d_rejected = -dd;
  return r;
}

}  // namespace mgrl::train
