// value_head.h: PPO's value head: a linear layer [hidden -> 1] (weight and bias, f32) on the policy model's last
// hidden state (after the final norm), kept on the host and replicated on every rank, with its gradients (summed
// over ranks by the caller) and an AdamW of its own learning rate; its whole state travels in a checkpoint's JSON.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"

namespace mgrl::rl {

class ValueHead {
 public:
  // Weight and bias start at zero (every value 0 before training): deterministic, the same on every rank.
  explicit ValueHead(int hidden);

  int hidden() const { return hidden_; }
  // v[r] = w . h[r] + b for rows h[r * hidden .. (r + 1) * hidden), accumulated in double.
  void forward(const float* h, int rows, double* v) const;
  // Adds d loss / d w and d loss / d b for d loss / d v[r] = dv[r] to the gradients, and writes
  // d loss / d h[r][i] = dv[r] * w[i] into dh (if not null).
  void backward(const float* h, int rows, const double* dv, float* dh);

  // The gradients (hidden weights, then the bias) as one buffer the caller may sum over ranks in place.
  std::vector<double>& grads() { return grad_; }
  void zero_grad();
  double grad_norm_squared() const;
  // One AdamW step (hp.step is the 1-based step; hp.grad_scale multiplies the gradients first, e.g. for clipping).
  void step(const kernels::Ops::AdamW& hp);

  const std::vector<float>& params() const { return param_; }  // weights, then the bias
  bool finite() const;  // every parameter and moment finite
  nlohmann::json state() const;             // params and AdamW moments, exactly (floats as JSON numbers)
  void restore(const nlohmann::json& st);   // UserError when it does not fit this head

 private:
  int hidden_;
  std::vector<float> param_, m_, v_;
  std::vector<double> grad_;
};

}  // namespace mgrl::rl
