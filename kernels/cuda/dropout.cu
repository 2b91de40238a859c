// dropout.cu: inverted dropout with the counter-based mask of kernels::dropout_keep (ops.h), elementwise.
#include "kernels/cuda/dropout.cuh"

#include "kernels/ops.h"

namespace mgrl::kernels::cuda {
namespace {

// One thread per element, grid-stride; the row's stream is random_bits(seed, row_keys[t]). keep_scale = 1 / (1 - p)
// is computed once on the host in fp32, as the CPU backend does; the product x * keep_scale is fp32, then rounded to
// the storage dtype.
template <class S>
__global__ void dropout_kernel(S* out, const S* x, std::int64_t n, int cols, float p, float keep_scale,
                               std::uint64_t seed, const std::uint64_t* row_keys) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const std::int64_t t = i / cols, j = i - t * cols;
    const bool keep = kernels::dropout_keep(random_bits(seed, row_keys[t]), static_cast<std::uint64_t>(j), p);
    out[i] = from_f32<S>(keep ? to_f32(x[i]) * keep_scale : 0.0f);
  }
}

template <class S>
__global__ void add_uniform_noise_kernel(S* x, std::int64_t n, int cols, const float* row_scale, std::uint64_t seed,
                                         const std::uint64_t* row_keys) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const std::int64_t t = i / cols, j = i - t * cols;
    const float u = kernels::noise_uniform(random_bits(seed, row_keys[t]), static_cast<std::uint64_t>(j));
    x[i] = from_f32<S>(to_f32(x[i]) + row_scale[t] * u);
  }
}

}  // namespace

void add_uniform_noise(const Ctx& c, void* x, int rows, int cols, const float* row_scale, std::uint64_t seed,
                       const std::uint64_t* row_keys) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    add_uniform_noise_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(static_cast<S*>(x), n, cols, row_scale, seed,
                                                                         row_keys);
    CUDA_CHECK_LAUNCH();
  });
}

void dropout(const Ctx& c, void* out, const void* x, int rows, int cols, float p, std::uint64_t seed,
             const std::uint64_t* row_keys) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
  if (n <= 0) return;
  const float keep_scale = 1.0f / (1.0f - p);
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    dropout_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(static_cast<S*>(out), static_cast<const S*>(x), n, cols,
                                                              p, keep_scale, seed, row_keys);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mgrl::kernels::cuda
