// value_head.cpp: the PPO value head's forward, backward, AdamW step and checkpoint state.
#include "rl/value_head.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/optimizer.h"

namespace mgrl::rl {

ValueHead::ValueHead(int hidden)
    : hidden_(hidden),
      param_(static_cast<std::size_t>(hidden) + 1, 0.0f),
      m_(param_.size(), 0.0f),
      v_(param_.size(), 0.0f),
      grad_(param_.size(), 0.0) {
  MGRL_CHECK(hidden > 0, "value head of no width");
}

void ValueHead::forward(const float* h, int rows, double* v) const {
  const std::size_t H = static_cast<std::size_t>(hidden_);
  for (int r = 0; r < rows; ++r) {
    const float* x = h + static_cast<std::size_t>(r) * H;
    double s = param_[H];
    for (std::size_t i = 0; i < H; ++i) s += static_cast<double>(param_[i]) * x[i];
    v[r] = s;
  }
}

void ValueHead::backward(const float* h, int rows, const double* dv, float* dh) {
  const std::size_t H = static_cast<std::size_t>(hidden_);
  for (int r = 0; r < rows; ++r) {
    const float* x = h + static_cast<std::size_t>(r) * H;
    for (std::size_t i = 0; i < H; ++i) grad_[i] += dv[r] * x[i];
    grad_[H] += dv[r];
    if (dh)
      for (std::size_t i = 0; i < H; ++i)
        dh[static_cast<std::size_t>(r) * H + i] = static_cast<float>(dv[r] * param_[i]);
  }
}

void ValueHead::zero_grad() { std::fill(grad_.begin(), grad_.end(), 0.0); }

double ValueHead::grad_norm_squared() const {
  double s = 0;
  for (double g : grad_) s += g * g;
  return s;
}

void ValueHead::step(const kernels::Ops::AdamW& hp) {
  std::vector<float> g(grad_.begin(), grad_.end());
  // The weights take weight decay, the bias not (as train::decays; until 2026-11-28 the bias decayed too).
  const std::size_t w = param_.size() - 1;
  kernels::cpu::adamw(param_.data(), g.data(), m_.data(), v_.data(), w, hp);
  kernels::Ops::AdamW no_decay = hp;
  no_decay.weight_decay = 0.0f;
  kernels::cpu::adamw(param_.data() + w, g.data() + w, m_.data() + w, v_.data() + w, 1, no_decay);
}

bool ValueHead::finite() const {
  for (const std::vector<float>* x : {&param_, &m_, &v_})
    for (const float f : *x)
      if (!std::isfinite(f)) return false;
  return true;
}

nlohmann::json ValueHead::state() const {
  return {{"hidden", hidden_}, {"params", param_}, {"exp_avg", m_}, {"exp_avg_sq", v_}};
}

void ValueHead::restore(const nlohmann::json& st) {
  try {
    if (st.at("hidden").get<int>() != hidden_)
      throw UserError("the checkpoint's value head has width " + std::to_string(st.at("hidden").get<int>()) +
                      ", this model's hidden size is " + std::to_string(hidden_));
    auto p = st.at("params").get<std::vector<float>>(), m = st.at("exp_avg").get<std::vector<float>>(),
         v = st.at("exp_avg_sq").get<std::vector<float>>();
    if (p.size() != param_.size() || m.size() != param_.size() || v.size() != param_.size())
      throw UserError("the checkpoint's value head has " + std::to_string(p.size()) + " parameters, expected " +
                      std::to_string(param_.size()));
    param_ = std::move(p);
    m_ = std::move(m);
    v_ = std::move(v);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(std::string("the checkpoint's value head state is unreadable: ") + e.what());
  }
}

}  // namespace mgrl::rl
