// rope.cu: rotary position embedding (HF rotate-half), in place, forward (rotation by +angle) and backward (-angle).
#include "kernels/cuda/rope.cuh"

#include <string>

namespace mgrl::kernels::cuda {
namespace {

// One thread per pair (t, h, j), j < head_dim / 2 (rope_rotate_pair, rope.cuh).
template <class S>
__global__ void rope_kernel(S* x, const std::int32_t* pos, const float* inv_freq, int T, int n_heads, int head_dim,
                            float sign) {
  const int half = head_dim / 2;
  const std::int64_t n = static_cast<std::int64_t>(T) * n_heads * half;
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const int j = static_cast<int>(i % half);
    const std::int64_t th = i / half;  // t * n_heads + h
    const std::int64_t t = th / n_heads;
    rope_rotate_pair(x + th * head_dim, j, half, pos[t], inv_freq, sign);
  }
}

void rope_rotate(const Ctx& c, void* x, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                 int head_dim, float sign) {
  MGRL_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope needs an even head_dim (got " + std::to_string(head_dim) + ")");
  const std::int64_t n = static_cast<std::int64_t>(T) * n_heads * (head_dim / 2);
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    rope_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(static_cast<S*>(x), pos, inv_freq, T, n_heads, head_dim,
                                                           sign);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void rope_forward(const Ctx& c, void* x, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                  int head_dim) {
  rope_rotate(c, x, pos, inv_freq, T, n_heads, head_dim, 1.0f);
}

void rope_backward(const Ctx& c, void* dx, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                   int head_dim) {
  rope_rotate(c, dx, pos, inv_freq, T, n_heads, head_dim, -1.0f);
}

}  // namespace mgrl::kernels::cuda
