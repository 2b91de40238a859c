// linear.cu: dense layer y = x @ W^T (+ bias) on cuBLAS, and its backward (dx, f32 dW, f32 dbias).
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/linear.cuh"

namespace mgrl::kernels::cuda {
namespace {

// y[t, o] = bias[o] for every row t (the GEMM then adds x @ W^T with beta = 1, so y is rounded once).
template <class S>
__global__ void bias_broadcast_kernel(S* y, const S* bias, std::int64_t n, int out) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) y[i] = bias[i % out];
}

// dbias[o] += sum_t dy[t, o]: one thread per column o, a serial loop over the T rows (coalesced across threads).
template <class S>
__global__ void bias_grad_kernel(float* dbias, const S* dy, int T, int out) {
  for (std::int64_t o = gs_begin(); o < out; o += gs_stride()) {
    float s = 0.0f;
    for (int t = 0; t < T; ++t) s += to_f32(dy[static_cast<std::int64_t>(t) * out + o]);
    dbias[o] += s;
  }
}

}  // namespace

void linear_forward(const Ctx& c, void* y, const void* x, const void* W, const void* bias, int T, int in, int out) {
  if (T <= 0 || out <= 0) return;
  // With a bias: cuBLASLt adds it in the GEMM's epilogue when it has an algorithm for the shape (the same single
  // rounding as below, one pass over y less); otherwise the bias is broadcast into y and the GEMM adds with beta 1.
  if (bias && in > 0 && gemm_bias_rm(c.lt, c.stream, T, out, in, x, W, bias, y, c.st)) return;
  const std::int64_t n = static_cast<std::int64_t>(T) * out;
  float beta = 0.0f;
  if (bias) {
    dispatch(c.st, [&](auto tag) {
      using S = decltype(tag);
      bias_broadcast_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(static_cast<S*>(y),
                                                                         static_cast<const S*>(bias), n, out);
      CUDA_CHECK_LAUNCH();
    });
    beta = 1.0f;
  }
  if (in <= 0) {  // empty reduction: y = bias or 0
    if (!bias) CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<std::size_t>(n) * dtype_size(c.st), c.stream));
    return;
  }
  // y[T, out] (+)= x[T, in] @ W[out, in]^T
  gemm_rm(c.blas, false, true, T, out, in, 1.0f, x, c.st, in, W, c.st, in, beta, y, c.st, out);
}

void linear_backward(const Ctx& c, void* dx, float* dW, float* dbias, const void* dy, const void* x, const void* W,
                     int T, int in, int out, bool accumulate_dx) {
  if (T <= 0) return;
  if (dx && in > 0) {
    if (out > 0) {
      // dx[T, in] (+)= dy[T, out] @ W[out, in]
      gemm_rm(c.blas, false, false, T, in, out, 1.0f, dy, c.st, out, W, c.st, in, accumulate_dx ? 1.0f : 0.0f, dx,
              c.st, in);
    } else if (!accumulate_dx) {
      CUDA_CHECK(cudaMemsetAsync(dx, 0, static_cast<std::size_t>(T) * in * dtype_size(c.st), c.stream));
    }
  }
  if (dW) {
    // dW[out, in] += dy[T, out]^T @ x[T, in]   (f32 output, beta = 1)
    gemm_rm(c.blas, true, false, out, in, T, 1.0f, dy, c.st, out, x, c.st, in, 1.0f, dW, DType::F32, in);
  }
  if (dbias && out > 0) {
    dispatch(c.st, [&](auto tag) {
      using S = decltype(tag);
      bias_grad_kernel<S><<<grid_for(out), kThreads, 0, c.stream>>>(dbias, static_cast<const S*>(dy), T, out);
      CUDA_CHECK_LAUNCH();
    });
  }
}

}  // namespace mgrl::kernels::cuda
