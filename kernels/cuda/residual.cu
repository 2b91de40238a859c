// residual.cu: the residual connection x += y in place (elementwise, fp32 add, one rounding).
#include "kernels/cuda/residual.cuh"

namespace mgrl::kernels::cuda {
namespace {

template <class S>
__global__ void residual_kernel(S* x, const S* y, std::int64_t n) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) x[i] = from_f32<S>(to_f32(x[i]) + to_f32(y[i]));
}

}  // namespace

void residual_forward(const Ctx& c, void* x, const void* y, std::int64_t n) {
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    residual_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(static_cast<S*>(x), static_cast<const S*>(y), n);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mgrl::kernels::cuda
