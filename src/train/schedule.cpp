// schedule.cpp: learning-rate schedules.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mgrl::train {

std::int64_t Schedule::warmup_from_ratio(double ratio, std::int64_t total_steps) {
  return static_cast<std::int64_t>(std::ceil(ratio * static_cast<double>(total_steps)));
}

double Schedule::factor(std::int64_t step) const {
  // As transformers' schedules (trl's): the multiplier at the step counter before the update (0-based), so the first
  // step of a warmup has lr 0. (mgrl used step + 1 in the warmup until 2026-11-29: its learning rates ran one step
  // ahead of trl's through the warmup, and the runs apart from the first step on.)
  if (step < warmup_steps) return static_cast<double>(step) / static_cast<double>(warmup_steps);
  const double span = static_cast<double>(std::max<std::int64_t>(1, total_steps - warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  if (kind == "constant" || kind == "constant_with_warmup") return 1.0;
  if (kind == "linear") return 1.0 - progress;
  if (kind == "cosine") return 0.5 * (1.0 + std::cos(M_PI * progress));
  // transformers' cosine_with_min_lr: the cosine lifted to end at min_lr_rate.
  if (kind == "cosine_with_min_lr") return 0.5 * (1.0 + std::cos(M_PI * progress)) * (1.0 - min_lr_rate) + min_lr_rate;
  throw UserError("unknown learning-rate schedule '" + kind +
                  "' (constant, constant_with_warmup, linear, cosine or cosine_with_min_lr)");
}

}  // namespace mgrl::train
