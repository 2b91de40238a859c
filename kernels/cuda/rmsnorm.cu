// rmsnorm.cu: RMSNorm over the last dimension (HF Llama/Qwen semantics; per-head norms too) and its backward.
#include "kernels/cuda/rmsnorm.cuh"

namespace mgrl::kernels::cuda {
namespace {

// Rows of the dw reduction handled by one block (one fp32 atomicAdd per column per block).
constexpr int kDwRowsPerBlock = 128;

// Threads for a block that walks one row of `dim` elements: dim rounded up to a warp, at most kThreads.
int row_threads(int dim) { return std::min(kThreads, std::max(32, (dim + 31) / 32 * 32)); }

// One block per row: sum of squares (fp32, block reduction), rstd, then out = (x * rstd) * w.
// out may alias x: the reduction's barriers separate every read of pass 1 from the writes of pass 2, and pass 2
// reads and writes element i in the same thread.
template <class S>
__global__ void rmsnorm_forward_kernel(S* out, float* rstd, const S* x, const S* w, int dim, float eps, float off) {
  const std::int64_t row = blockIdx.x;
  const S* xr = x + row * dim;
  S* o = out + row * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = to_f32(xr[i]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float s = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) rstd[row] = s;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = from_f32<S>((to_f32(xr[i]) * s) * (to_f32(w[i]) + off));
}

// One block per row: dot = sum(dout * w * x), then dx = rstd * dout * w - rstd^3 / dim * dot * x.
template <class S>
__global__ void rmsnorm_backward_dx_kernel(S* dx, const S* dout, const S* x, const S* w, const float* rstd, int dim,
                                           bool accumulate, float off) {
  const std::int64_t row = blockIdx.x;
  const S* xr = x + row * dim;
  const S* g = dout + row * dim;
  S* d = dx + row * dim;
  const float s = rstd[row];
  float dot = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dot += to_f32(g[i]) * (to_f32(w[i]) + off) * to_f32(xr[i]);
  dot = block_sum(dot);
  const float cc = dot * s * s * s / static_cast<float>(dim);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = s * to_f32(g[i]) * (to_f32(w[i]) + off) - cc * to_f32(xr[i]);
    d[i] = from_f32<S>(accumulate ? to_f32(d[i]) + v : v);
  }
}

// dw[i] += sum_r dout[r, i] * x[r, i] * rstd[r]. grid.x: chunks of kDwRowsPerBlock rows, grid.y: column tiles of
// blockDim.x; each thread sums its column over the chunk's rows in fp32, then one atomicAdd.
template <class S>
__global__ void rmsnorm_backward_dw_kernel(float* dw, const S* dout, const S* x, const float* rstd, int rows,
                                           int dim) {
  const int i = blockIdx.y * blockDim.x + threadIdx.x;
  if (i >= dim) return;
  const int r0 = blockIdx.x * kDwRowsPerBlock;
  const int r1 = min(rows, r0 + kDwRowsPerBlock);
  float acc = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const std::int64_t k = static_cast<std::int64_t>(r) * dim + i;
    acc += to_f32(dout[k]) * to_f32(x[k]) * rstd[r];
  }
  atomicAdd(dw + i, acc);
}

}  // namespace

void rmsnorm_forward(const Ctx& c, void* out, float* rstd, const void* x, const void* w, int rows, int dim,
                     float eps, bool unit_offset) {
  if (rows <= 0 || dim <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    rmsnorm_forward_kernel<S><<<rows, row_threads(dim), 0, c.stream>>>(
        static_cast<S*>(out), rstd, static_cast<const S*>(x), static_cast<const S*>(w), dim, eps,
        unit_offset ? 1.0f : 0.0f);
    CUDA_CHECK_LAUNCH();
  });
}

void rmsnorm_backward(const Ctx& c, void* dx, float* dw, const void* dout, const void* x, const void* w,
                      const float* rstd, int rows, int dim, bool accumulate, bool unit_offset) {
  if (rows <= 0 || dim <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    if (dw) {
      const dim3 grid((rows + kDwRowsPerBlock - 1) / kDwRowsPerBlock, (dim + kThreads - 1) / kThreads);
      rmsnorm_backward_dw_kernel<S><<<grid, kThreads, 0, c.stream>>>(dw, static_cast<const S*>(dout),
                                                                      static_cast<const S*>(x), rstd, rows, dim);
      CUDA_CHECK_LAUNCH();
    }
    if (dx) {
      rmsnorm_backward_dx_kernel<S><<<rows, row_threads(dim), 0, c.stream>>>(
          static_cast<S*>(dx), static_cast<const S*>(dout), static_cast<const S*>(x), static_cast<const S*>(w), rstd,
          dim, accumulate, unit_offset ? 1.0f : 0.0f);
      CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace mgrl::kernels::cuda
