// ops_factory.cpp: the op backend (kernels::Ops) that matches a rank's device.
#include "app/modes.h"
#include "dist/device.h"
#include "kernels/ops.h"
#if MGRL_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mgrl::app {

std::unique_ptr<kernels::Ops> make_ops(const dist::Device& device) {
#if MGRL_WITH_CUDA
  if (device.backend == dist::Backend::Cuda) return kernels::make_cuda_ops(device.gpu.index);
#else
  (void)device;
#endif
  return kernels::make_cpu_ops();
}

}  // namespace mgrl::app
