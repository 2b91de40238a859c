// divergence.cpp: the stop after consecutive diverged steps (divergence.h).
#include "train/divergence.h"

#include "core/error.h"

namespace mgrl::train {

void DivergenceGuard::after_step(StepOutcome outcome, std::int64_t step, const std::string& last_checkpoint) {
  if (outcome == StepOutcome::Updated) {
    streak_ = 0;
    return;
  }
  if (outcome == StepOutcome::Overflow) return;  // the scaler's business: halved, tried again
  if (streak_++ == 0) first_ = step;
  if (max_ <= 0 || streak_ < max_) return;
  env_.agree([&] {
    throw UserError("steps " + std::to_string(first_) + " to " + std::to_string(step) + ": " +
                    std::to_string(streak_) + " steps in a row had a non-finite loss or gradient norm " +
                    (scaling_ ? "(with loss scaling: a non-finite loss, or gradients that overflow even at "
                                "train.loss_scale_min) "
                              : "") +
                    "(train.max_nonfinite_steps = " + std::to_string(max_) + "): the run diverged and stops (lower " +
                    "train.lr?); " +
                    (last_checkpoint.empty() ? std::string("no checkpoint was written before it")
                                             : "the last checkpoint before it: " + last_checkpoint));
  });
}

}  // namespace mgrl::train
