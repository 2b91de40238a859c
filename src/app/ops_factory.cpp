// ops_factory.cpp: the op backend (kernels::Ops) that matches a rank's device.
#include "app/modes.h"
#include "core/error.h"
#include "dist/device.h"
#include "kernels/ops.h"

namespace mgrl::app {

std::unique_ptr<kernels::Ops> make_ops(const dist::Device& device) {
  if (device.backend == dist::Backend::Cpu) return kernels::make_cpu_ops();
  throw UserError("the model has no CUDA backend in this build yet; use --runtime.backend=cpu");
}

}  // namespace mgrl::app
