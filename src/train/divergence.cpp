// divergence.cpp: the stop after consecutive non-finite steps (divergence.h).
#include "train/divergence.h"

#include "core/error.h"

namespace mgrl::train {

void DivergenceGuard::after_step(bool updated, std::int64_t step, const std::string& last_checkpoint) {
  if (updated) {
    streak_ = 0;
    return;
  }
  if (streak_++ == 0) first_ = step;
  if (max_ <= 0 || streak_ < max_) return;
  env_.agree([&] {
    throw UserError("steps " + std::to_string(first_) + " to " + std::to_string(step) + ": " +
                    std::to_string(streak_) + " steps in a row had a non-finite loss or gradient norm " +
                    "(train.max_nonfinite_steps = " + std::to_string(max_) + "): the run diverged and stops (lower " +
                    "train.lr?); " +
                    (last_checkpoint.empty() ? std::string("no checkpoint was written before it")
                                             : "the last checkpoint before it: " + last_checkpoint));
  });
}

}  // namespace mgrl::train
