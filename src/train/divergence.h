// divergence.h: what a training run does about steps whose loss or gradient norm is not finite: the optimizer
// skips them (the weights do not change), periodic checkpoints are not written while they last (so that they cannot
// push intact ones out under checkpoint.keep_last), and after train.max_nonfinite_steps of them in a row the run
// stops with exit 2, naming the last checkpoint it wrote or resumed from.
#pragma once
#include <cstdint>
#include <string>

#include "dist/mpi_env.h"

namespace mgrl::train {

class DivergenceGuard {
 public:
  // max_consecutive: 0 never stops the run.
  DivergenceGuard(const dist::MpiEnv& env, int max_consecutive) : env_(env), max_(max_consecutive) {}
  // After each optimizer step (collective: `updated` is the same on every rank, as the reduced loss and gradient
  // norm are). When the step was skipped and it makes max_consecutive in a row, every rank ends with one line and
  // exit 2 (dist::JobFailed); last_checkpoint: the newest checkpoint of this run (written or resumed), "" if none.
  void after_step(bool updated, std::int64_t step, const std::string& last_checkpoint);
  // The last step was skipped for a non-finite loss or gradient norm.
  bool diverging() const { return streak_ > 0; }

 private:
  const dist::MpiEnv& env_;
  int max_;
  int streak_ = 0;
  std::int64_t first_ = 0;  // the first skipped step of the current streak
};

}  // namespace mgrl::train
