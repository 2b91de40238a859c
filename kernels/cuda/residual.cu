// residual.cu: the residual connection, x += y in place or out = a + b (elementwise, fp32 add, one rounding).
#include "kernels/cuda/residual.cuh"

namespace mgrl::kernels::cuda {
namespace {

template <class S>
__global__ void residual_kernel(S* x, const S* y, std::int64_t n) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) x[i] = from_f32<S>(to_f32(x[i]) + to_f32(y[i]));
}

template <class S>
__global__ void residual_add_kernel(S* out, const S* a, const S* b, std::int64_t n) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) out[i] = from_f32<S>(to_f32(a[i]) + to_f32(b[i]));
}

// Eight elements (16 bytes) per thread and step: n8 = n / 8 groups.
template <class S>
struct alignas(16) Pack8 {
  S v[8];
};
template <class S>
__global__ void residual_add8_kernel(Pack8<S>* out, const Pack8<S>* a, const Pack8<S>* b, std::int64_t n8) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  for (std::int64_t i = gs_begin(); i < n8; i += gs_stride()) {
    const Pack8<S> x = a[i], y = b[i];
    Pack8<S> z;
#pragma unroll
    for (int e = 0; e < 8; ++e) z.v[e] = from_f32<S>(to_f32(x.v[e]) + to_f32(y.v[e]));
    out[i] = z;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

}  // namespace

void residual_forward(const Ctx& c, void* x, const void* y, std::int64_t n) {
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    residual_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(static_cast<S*>(x), static_cast<const S*>(y), n);
    CUDA_CHECK_LAUNCH();
  });
}

void residual_add(const Ctx& c, void* out, const void* a, const void* b, std::int64_t n) {
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    if (n % 8 == 0 && aligned16(out) && aligned16(a) && aligned16(b)) {
      launch(pdl_enabled(), residual_add8_kernel<S>, grid_for(n / 8), kThreads, 0, c.stream,
             static_cast<Pack8<S>*>(out), static_cast<const Pack8<S>*>(a), static_cast<const Pack8<S>*>(b), n / 8);
    } else {
      launch(pdl_enabled(), residual_add_kernel<S>, grid_for(n), kThreads, 0, c.stream, static_cast<S*>(out),
             static_cast<const S*>(a), static_cast<const S*>(b), n);
    }
  });
}

}  // namespace mgrl::kernels::cuda
