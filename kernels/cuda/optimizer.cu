// optimizer.cu: AdamW (elementwise, grid-stride), sum of squares (per-block double sums, one atomicAdd each) and the
// weighted sum of a step's loss (one block, deterministic).
#include "kernels/cuda/optimizer.cuh"

namespace mgrl::kernels::cuda {
namespace {

__global__ void sum_squares_kernel(double* out, const float* x, std::int64_t n) {
  __shared__ double part[kThreads];
  double s = 0;
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) s += static_cast<double>(x[i]) * x[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {  // blockDim.x == kThreads, a power of two
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

// One block of kThreads: thread t sums i = t, t + kThreads, ...; then a tree over the block, in a fixed order.
__global__ void weighted_sum_kernel(double* acc, const float* x, const float* w, std::int64_t n, double scale) {
  __shared__ double part[kThreads];
  double s = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(w[i]) * x[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k >>= 1) {
    if (static_cast<int>(threadIdx.x) < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) *acc += scale * part[0];
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::int64_t n, float decay, float beta1,
                             float beta2, float step_size, float bc2_sqrt, float eps, float grad_scale) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const float gi = g[i] * grad_scale;
    float pi = p[i] * decay;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    pi -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  }
}

}  // namespace

void sum_squares(const Ctx& c, double* out_device, const float* x, std::size_t n) {
  CUDA_CHECK(cudaMemsetAsync(out_device, 0, sizeof(double), c.stream));
  if (n == 0) return;
  const auto N = static_cast<std::int64_t>(n);
  sum_squares_kernel<<<grid_for(N), kThreads, 0, c.stream>>>(out_device, x, N);
  CUDA_CHECK_LAUNCH();
}

void weighted_sum_accumulate(const Ctx& c, double* acc_device, const float* x, const float* w, std::size_t n,
                             double scale) {
  if (n == 0) return;
  weighted_sum_kernel<<<1, kThreads, 0, c.stream>>>(acc_device, x, w, static_cast<std::int64_t>(n), scale);
  CUDA_CHECK_LAUNCH();
}

void adamw(const Ctx& c, float* params, const float* grads, float* m, float* v, std::size_t n, const Ops::AdamW& hp) {
  if (n == 0) return;
  // The same scalar arithmetic as the CPU reference (kernels/cpu/optimizer.cpp), in fp32.
  const float decay = 1.0f - hp.lr * hp.weight_decay;
  const float bc1 = 1.0f - std::pow(hp.beta1, static_cast<float>(hp.step));
  const float bc2 = 1.0f - std::pow(hp.beta2, static_cast<float>(hp.step));
  const auto N = static_cast<std::int64_t>(n);
  adamw_kernel<<<grid_for(N), kThreads, 0, c.stream>>>(params, grads, m, v, N, decay, hp.beta1, hp.beta2, hp.lr / bc1,
                                                        std::sqrt(bc2), hp.eps, hp.grad_scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mgrl::kernels::cuda
