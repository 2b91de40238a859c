// optimizer.h: the update of a training step, shared by SFT and GRPO: a step whose gradients are not finite is
// skipped on every rank together (every rank sees the same reduced gradients); fp16 storage gets dynamic loss
// scaling (halve on overflow, double after 1000 good steps); global-norm clipping; AdamW (torch's decoupled
// rule, fp32 moments) at the learning rate of the schedule.
#pragma once
#include <cstdint>

#include "kernels/ops.h"
#include "train/checkpoint.h"
#include "train/schedule.h"
#include "train/trainable.h"

namespace mgrl::train {

struct OptimizerOptions {
  kernels::Ops::AdamW adamw;  // lr comes from the schedule
  Schedule schedule;
  double max_grad_norm = 1.0;  // 0: no clipping
};

class Optimizer {
 public:
  Optimizer(kernels::Ops& ops, const Trainable& tr, OptimizerOptions opts);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // The factor the loss weights are multiplied by this step (the fp16 loss scale; 1 otherwise).
  double loss_scale(const TrainState& st) const;
  // One update from the reduced gradients whose global norm (loss scale divided out) is `norm`, of a step whose
  // reduced loss is `loss`. Advances st.step (and st.skipped_steps / the loss scaler). Returns false when the step
  // was skipped because the loss or the gradient norm is not finite (the weights and moments are left as they were).
  bool step(TrainState& st, double norm, double loss);
  double lr(const TrainState& st) const { return opts_.schedule.at(st.step); }
  float* exp_avg() const { return m_; }
  float* exp_avg_sq() const { return v_; }
  const Trainable& trainable() const { return tr_; }

 private:
  kernels::Ops& ops_;
  Trainable tr_;
  OptimizerOptions opts_;
  float* m_ = nullptr;
  float* v_ = nullptr;
};

}  // namespace mgrl::train
