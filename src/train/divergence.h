// divergence.h: what a training run does about steps that diverged (a non-finite loss; gradients that are not
// finite without loss scaling, or at its minimum scale): the optimizer skips them (the weights do not change),
// periodic checkpoints are not written while they last (so that they cannot push intact ones out under
// checkpoint.keep_last), and after train.max_nonfinite_steps of them in a row the run stops with exit 2, naming the
// last checkpoint it wrote or resumed from. A loss scaler's overflow (skipped, scale halved: normal in fp16) is
// neither: it does not count toward the streak and does not end it.
#pragma once
#include <cstdint>
#include <string>

#include "dist/mpi_env.h"
#include "train/optimizer.h"

namespace mgrl::train {

class DivergenceGuard {
 public:
  // max_consecutive: 0 never stops the run. loss_scaling: the run scales its loss (the message says so).
  DivergenceGuard(const dist::MpiEnv& env, int max_consecutive, bool loss_scaling = false)
      : env_(env), max_(max_consecutive), scaling_(loss_scaling) {}
  // After each optimizer step (collective: the outcome is the same on every rank, as the reduced loss and gradient
  // norm are). When the step diverged and it makes max_consecutive in a row, every rank ends with one line and
  // exit 2 (dist::JobFailed); last_checkpoint: the newest checkpoint of this run (written or resumed), "" if none.
  void after_step(StepOutcome outcome, std::int64_t step, const std::string& last_checkpoint);
  // The steps since the last update include a diverged one.
  bool diverging() const { return streak_ > 0; }

 private:
  const dist::MpiEnv& env_;
  int max_;
  bool scaling_;
  int streak_ = 0;
  std::int64_t first_ = 0;  // the first diverged step of the current streak
};

}  // namespace mgrl::train
