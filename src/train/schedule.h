// schedule.h: learning-rate schedules (constant, linear, cosine, cosine with a floor) with linear warmup, as a pure function of
// the step, so that resuming needs no scheduler state beyond the step.
#pragma once
#include <cstdint>
#include <string>

namespace mgrl::train {

struct Schedule {
  // constant | constant_with_warmup | linear | cosine | cosine_with_min_lr, as transformers' schedules of those
  // names; "constant" takes no warmup (transformers' ignores it: mgrl refuses the pair, app/common.cpp).
  std::string kind = "constant";
  double lr = 1e-4;
  double min_lr_rate = 0;  // cosine_with_min_lr: the multiplier at the end
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
  // warmup_ratio * total_steps, rounded up (as transformers does), when warmup_steps is not given.
  static std::int64_t warmup_from_ratio(double ratio, std::int64_t total_steps);
  // Learning rate of optimizer step `step` (0-based): warmup rises linearly from lr / warmup (at step 0)
  // to lr; after warmup: constant, or linear / cosine decay to 0 (cosine_with_min_lr: to lr x min_lr_rate) at
  // total_steps.
  double at(std::int64_t step) const { return lr * factor(step); }
  // The schedule's multiplier of lr at that step, in [0, 1]: another learning rate following the same schedule (PPO's
  // value head) is that rate times it, also when lr is 0.
  double factor(std::int64_t step) const;
};

}  // namespace mgrl::train
