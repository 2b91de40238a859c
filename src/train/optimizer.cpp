// optimizer.cpp: loss scaling, the non-finite skip, clipping and AdamW.
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "io/safetensors.h"

namespace mgrl::train {
namespace {

bool power_of_two(double x) {
  int e = 0;
  return x > 0 && std::isfinite(x) && std::frexp(x, &e) == 0.5;
}

std::string number(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

}  // namespace

LossScaling loss_scaling_of(const std::string& mode, DType storage, double init, double min,
                            std::int64_t growth_interval) {
  LossScaling s;
  s.enabled = mode == "dynamic" || (mode == "auto" && storage == DType::F16);
  if (!power_of_two(init) || init > kMaxLossScale)
    throw UserError("train.loss_scale_init = " + number(init) +
                    ": must be a power of two (..., 0.5, 1, 2, ...) no larger than 16777216 (2^24), so that "
                    "scaling the loss is exact");
  if (!power_of_two(min) || min > init)
    throw UserError("train.loss_scale_min = " + number(min) + ": must be a power of two no larger than "
                    "train.loss_scale_init (" + number(init) + ")");
  s.init = init;
  s.min = min;
  s.growth_interval = growth_interval;
  return s;
}

Optimizer::Optimizer(kernels::Ops& ops, const Trainable& tr, OptimizerOptions opts)
    : ops_(ops), tr_(tr), opts_(std::move(opts)) {
  m_ = static_cast<float*>(ops_.alloc(tr_.n * sizeof(float)));
  v_ = static_cast<float*>(ops_.alloc(tr_.n * sizeof(float)));
  // Until 2026-11-28 every trainable value decayed: in full fine-tuning the norm weights and biases too (transformers'
  // Trainer leaves them out). Values no tensor names (none today) decay, as before.
  std::vector<std::pair<std::size_t, std::size_t>> keep;  // [offset, end) of the tensors without decay
  for (const auto& t : tr_.tensors)
    if (!decays(t.name)) keep.push_back({t.offset, t.offset + static_cast<std::size_t>(io::shape_numel(t.shape))});
  std::sort(keep.begin(), keep.end());
  std::size_t at = 0;
  const auto add = [this](std::size_t from, std::size_t to, bool decay) {
    if (to <= from) return;
    if (!ranges_.empty() && ranges_.back().decay == decay && ranges_.back().offset + ranges_.back().n == from)
      ranges_.back().n += to - from;
    else
      ranges_.push_back({from, to - from, decay});
  };
  for (const auto& [from, to] : keep) {
    add(at, from, true);
    add(std::max(at, from), to, false);
    at = std::max(at, to);
  }
  add(at, tr_.n, true);
}

Optimizer::~Optimizer() {
  ops_.release(m_);
  ops_.release(v_);
}

void Optimizer::start(TrainState& st) const {
  st.loss_scale = opts_.scaling.enabled ? opts_.scaling.init : 1.0;
  st.scaler_good_steps = 0;
}

std::string Optimizer::resumed(TrainState& st) const {
  const LossScaling& s = opts_.scaling;
  if (!s.enabled) {
    if (st.loss_scale == 1.0 && st.scaler_good_steps == 0) return "";
    st.loss_scale = 1.0;
    st.scaler_good_steps = 0;
    return "loss scaling is off in this run: the checkpoint's loss scale is not used";
  }
  // A run without scaling wrote scale 1 and never overflowed; a scaled run reaches 1 (below init) only by overflows.
  if ((st.loss_scale == 1.0 && st.overflow_steps == 0 && s.init != 1.0) || !power_of_two(st.loss_scale)) {
    st.loss_scale = s.init;
    st.scaler_good_steps = 0;
    return "the checkpoint has no loss scale of its own: loss scaling starts at train.loss_scale_init = " +
           number(s.init);
  }
  if (st.loss_scale < s.min || st.loss_scale > kMaxLossScale) {
    st.loss_scale = std::clamp(st.loss_scale, s.min, kMaxLossScale);
    return "the checkpoint's loss scale is outside [train.loss_scale_min, 2^24]: it continues at " +
           number(st.loss_scale);
  }
  return "";
}

StepOutcome Optimizer::step(TrainState& st, double norm, double loss) {
  const LossScaling& s = opts_.scaling;
  const double scale = loss_scale(st);
  if (!std::isfinite(norm) || !std::isfinite(loss)) {
    ++st.skipped_steps;
    ++st.step;
    st.scaler_good_steps = 0;
    // The loss is computed before scaling: a non-finite one is the model's doing, not the scale's. Gradients that
    // overflow at the smallest scale allowed would overflow without scaling too.
    if (!std::isfinite(loss) || !s.enabled || st.loss_scale <= s.min) return StepOutcome::Diverged;
    st.loss_scale = std::max(s.min, st.loss_scale / 2);
    ++st.overflow_steps;
    return StepOutcome::Overflow;
  }
  if (s.enabled && ++st.scaler_good_steps >= s.growth_interval) {
    st.loss_scale = std::min(kMaxLossScale, st.loss_scale * 2);
    st.scaler_good_steps = 0;
  }
  kernels::Ops::AdamW hp = opts_.adamw;
  hp.lr = static_cast<float>(lr(st));
  hp.step = st.step + 1 - st.skipped_steps;
  // The gradients are still multiplied by the loss scale: 1/scale is folded into the factor AdamW multiplies them
  // by (exact: a power of two). The clip compares the unscaled norm.
  const double clip = opts_.max_grad_norm > 0 && norm > opts_.max_grad_norm ? opts_.max_grad_norm / norm : 1.0;
  hp.grad_scale = static_cast<float>(clip / scale);
  if (hp.weight_decay == 0.0f) {
    ops_.adamw(tr_.params, tr_.grads, m_, v_, tr_.n, hp);
  } else {
    for (const Range& r : ranges_) {
      kernels::Ops::AdamW h = hp;
      if (!r.decay) h.weight_decay = 0.0f;
      ops_.adamw(tr_.params + r.offset, tr_.grads + r.offset, m_ + r.offset, v_ + r.offset, r.n, h);
    }
  }
  tr_.params_changed();
  ++st.step;
  return StepOutcome::Updated;
}

}  // namespace mgrl::train
