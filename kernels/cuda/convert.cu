// convert.cu: elementwise conversion between f32 and the storage dtype (for uploads and downloads).
#include "kernels/cuda/convert.cuh"

namespace mgrl::kernels::cuda {
namespace {

template <class S>
__global__ void f32_to_storage_kernel(S* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) dst[i] = from_f32<S>(src[i]);
}

template <class S>
__global__ void storage_to_f32_kernel(float* dst, const S* src, std::int64_t n) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) dst[i] = to_f32(src[i]);
}

}  // namespace

void f32_to_storage(const Ctx& c, void* dst, const float* src, std::int64_t n) {
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    f32_to_storage_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(static_cast<S*>(dst), src, n);
    CUDA_CHECK_LAUNCH();
  });
}

void storage_to_f32(const Ctx& c, float* dst, const void* src, std::int64_t n) {
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    storage_to_f32_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(dst, static_cast<const S*>(src), n);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mgrl::kernels::cuda
