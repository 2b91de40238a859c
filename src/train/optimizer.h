// optimizer.h: the update of a training step, shared by SFT and GRPO: dynamic loss scaling (fp16 storage, or asked
// for), a step whose gradients or loss are not finite skipped on every rank together (every rank sees the same
// reduced values), global-norm clipping of the unscaled gradients, AdamW (torch's decoupled rule, fp32 moments) at
// the learning rate of the schedule.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "train/checkpoint.h"
#include "train/schedule.h"
#include "train/trainable.h"

namespace mgrl::train {

// Dynamic loss scaling: the loss weights are multiplied by the scale before the backward and the gradients divided
// by it before they are used (clipping, the non-finite check, AdamW). A step whose gradients are not finite while
// the scale is above `min` is an overflow: skipped, the scale halved; `growth_interval` clean steps in a row double
// it (up to kMaxLossScale). Factors 2 and 1/2 keep the scale a power of two, so that scaling and unscaling are exact
// in floating point unless something overflows (f32: a run with scaling trains bit for bit the weights of one
// without).
struct LossScaling {
  bool enabled = false;
  double init = 65536;                 // a power of two
  double min = 1;                      // a power of two <= init: overflows at this scale are divergence
  std::int64_t growth_interval = 2000;  // clean steps in a row that double the scale
};
constexpr double kMaxLossScale = 16777216;  // 2^24: the scale never grows beyond it

// The loss_scaling of train.loss_scaling ("auto", "dynamic", "off") for a backend storing `storage`: auto is dynamic
// exactly when storage is fp16. UserError naming the key when init or min is not a power of two or min > init.
LossScaling loss_scaling_of(const std::string& mode, DType storage, double init, double min,
                            std::int64_t growth_interval);

struct OptimizerOptions {
  kernels::Ops::AdamW adamw;  // lr comes from the schedule
  Schedule schedule;
  double max_grad_norm = 1.0;  // 0: no clipping
  LossScaling scaling;
};

// What a step did.
enum class StepOutcome {
  Updated,   // the weights changed
  Overflow,  // the gradients were not finite at a loss scale above the minimum: skipped, scale halved (normal in fp16)
  Diverged,  // the loss was not finite, or the gradients were without loss scaling or at its minimum: skipped
};

class Optimizer {
 public:
  Optimizer(kernels::Ops& ops, const Trainable& tr, OptimizerOptions opts);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // The loss scale of a fresh run (before a resume overwrites the state): st.loss_scale = init (1 without scaling).
  void start(TrainState& st) const;
  // After a resume: a checkpoint of a run without loss scaling (scale 1, no overflow ever) continues at init when
  // scaling is on; with scaling off the scale is 1. Returns a line saying what changed, "" when nothing did.
  std::string resumed(TrainState& st) const;
  bool scaling() const { return opts_.scaling.enabled; }
  // The factor the loss weights are multiplied by this step (the loss scale; 1 without scaling).
  double loss_scale(const TrainState& st) const { return opts_.scaling.enabled ? st.loss_scale : 1.0; }
  // One update from the reduced gradients whose global norm, loss scale divided out, is `norm` (the same on every
  // rank: agreed_norm), of a step whose reduced loss is `loss`. Advances st.step, st.skipped_steps and
  // st.overflow_steps and the scaler. A skipped step leaves the weights and moments as they were.
  StepOutcome step(TrainState& st, double norm, double loss);
  // The schedule advances with the updates made, not with the steps: a skipped step (an overflow, a non-finite
  // loss) leaves it where it was, as transformers' Trainer steps its scheduler only when the optimizer ran (until
  // 2026-11-28 each skipped step moved the schedule on: a warm-up of 10 steps with 3 fp16 overflows warmed up in 7).
  std::int64_t schedule_step(const TrainState& st) const { return st.step - st.skipped_steps; }
  double lr(const TrainState& st) const { return opts_.schedule.at(schedule_step(st)); }
  double lr_factor(const TrainState& st) const { return opts_.schedule.factor(schedule_step(st)); }  // Schedule::factor
  float* exp_avg() const { return m_; }
  float* exp_avg_sq() const { return v_; }
  const Trainable& trainable() const { return tr_; }

 private:
  kernels::Ops& ops_;
  Trainable tr_;
  OptimizerOptions opts_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  // The trainable buffer as ranges that do or do not take weight decay (decays()): one range for LoRA; for full
  // fine-tuning the norm weights and biases are ranges of their own. One AdamW call per range.
  struct Range {
    std::size_t offset, n;
    bool decay;
  };
  std::vector<Range> ranges_;
};

}  // namespace mgrl::train
