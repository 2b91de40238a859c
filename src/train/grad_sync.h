// grad_sync.h: the gradient reduction of a data-parallel step, shared by SFT and GRPO: gradients zeroed at the
// start of a step, each layer's LoRA gradients allreduced (summed) over ranks as soon as the backward of the
// step's last micro-batch finishes them (one bucket per layer; asynchronous on NCCL, overlapping the layers still
// to come), or the whole buffer at once when the layers do not split it cleanly (full fine-tuning), then the global
// gradient norm, identical on every rank. The gradients are those of the scaled loss: finish() divides the scale out
// of the norm, the optimizer out of the gradients it reads.
#pragma once
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "dist/comm.h"
#include "dist/mpi_env.h"
#include "model/transformer.h"
#include "train/trainable.h"

namespace mgrl::train {

class GradSync {
 public:
  GradSync(dist::Comm& comm, model::Transformer& model, const Trainable& tr);
  void zero();
  // The backward's layer_done callback for one micro-batch; last = the step's last micro-batch, whose layers are
  // reduced as the backward finishes them. Empty when nothing is to be done.
  std::function<void(int)> hook(bool last);
  // Completes the reduction (every rank then holds the sum over ranks) and returns the global L2 norm of the
  // summed gradients divided by `scale` (the loss scale); non-finite when any gradient is.
  double finish(double scale);
  bool bucketed() const { return !layer_ranges_.empty(); }
  // Tests (MGRL_FAULT_INJECT=grad_overflow, core/fault.h): this step, write +inf into one gradient element of this
  // rank before it is reduced (the first bucket reduced, or the first element of the whole buffer), as an fp16
  // overflow in this rank's backward would.
  // after_reduction: into this rank's reduced gradients only (MGRL_FAULT_INJECT=grad_overflow_local): its norm alone is
  // not finite, and agreed_norm must make every rank skip.
  void inject_overflow(bool on, bool after_reduction = false) {
    overflow_ = on && !after_reduction;
    overflow_local_ = on && after_reduction;
  }
  void* stream() const { return stream_; }

 private:
  dist::Comm& comm_;
  model::Transformer& model_;
  Trainable tr_;
  void* stream_ = nullptr;  // the compute stream (CUDA), for ordering the allreduces after the backward
  std::vector<std::pair<std::size_t, std::size_t>> layer_ranges_;  // gradient bucket of each layer
  bool overflow_ = false, overflow_local_ = false;
  void overflow_at(std::size_t i);
};

// The gradient norm every rank acts on: +inf on every rank when it is not finite on some rank, else `norm`. The
// reduced gradients are the same on every rank, so their norms agree; this makes the skip of an overflowing step a
// collective decision all the same (one allreduce of an int). Collective.
double agreed_norm(const dist::MpiEnv& env, double norm);

}  // namespace mgrl::train
