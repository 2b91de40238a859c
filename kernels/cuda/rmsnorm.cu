// rmsnorm.cu: RMSNorm over the last dimension (HF Llama/Qwen semantics; per-head norms too), the residual add fused
// before it, and the backward.
#include "kernels/cuda/rmsnorm.cuh"

#include "core/env.h"
#include "kernels/cuda/residual.cuh"

namespace mgrl::kernels::cuda {
namespace {

// Rows of the dw reduction handled by one block (one fp32 atomicAdd per column per block).
constexpr int kDwRowsPerBlock = 128;

// Threads for a block that walks one row of `dim` elements: dim rounded up to a warp, at most kThreads.
int row_threads(int dim) { return std::min(kThreads, std::max(32, (dim + 31) / 32 * 32)); }

// ---- the kernels before row groups (MGRL_FUSED_NORM=0, and rows too long for a row group's registers) ----

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

// ---- row groups: tpr threads per row (a power of two, 1 to 512), each holding its share of the row in registers
// (at most kRowVecs vectors of VW elements: 16-byte loads when VW = 8) between the reduction and the writes.
// tpr <= 32: several rows per block, the reduction a shuffle within the row's lanes; tpr > 32: one row per block,
// blockDim.x = tpr, the reduction block_sum. Every element is read and written by the same thread, so an output may
// alias an input of the same row (each thread reads all of its elements before the reduction's barrier and writes
// them after it).
constexpr int kRowVecs = 4;

// VW consecutive elements, aligned to their size (VW = 8: one 16-byte load or store).
template <class S, int VW>
struct alignas(sizeof(S) * VW) Pack {
  S v[VW];
};

template <class S, int VW>
__device__ __forceinline__ void load_f32(float (&f)[VW], const S* p) {
  const Pack<S, VW> k = *reinterpret_cast<const Pack<S, VW>*>(p);
#pragma unroll
  for (int e = 0; e < VW; ++e) f[e] = to_f32(k.v[e]);
}

template <class S, int VW>
__device__ __forceinline__ void store_f32(S* p, const float (&f)[VW]) {
  Pack<S, VW> k;
#pragma unroll
  for (int e = 0; e < VW; ++e) k.v[e] = from_f32<S>(f[e]);
  *reinterpret_cast<Pack<S, VW>*>(p) = k;
}

// Sum over the tpr threads of a row (all threads of the block call it).
__device__ __forceinline__ float row_sum(float v, int tpr) {
  if (tpr > 32) return block_sum(v);
  for (int o = tpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// h = (x * rstd) * (w + off) with rstd = 1 / sqrt(mean(x^2) + eps); with kResidual, x = x_out = x_in + y first
// (rounded to S, as residual_forward, and normalised as stored). Without it x_in is x and x_out, y are unused.
template <class S, int VW, bool kResidual>
__global__ void __launch_bounds__(512) rownorm_forward_kernel(S* h, float* rstd, S* x_out, const S* x_in, const S* y,
                                                              const S* w, int rows, int dim, int tpr, float eps,
                                                              float off) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const int lane = static_cast<int>(threadIdx.x) % tpr, nvec = dim / VW;
  const bool live = row < rows;
  const std::int64_t base = row * dim;
  float v[kRowVecs][VW];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kRowVecs; ++j) {
    const int c = lane + j * tpr;
    if (live && c < nvec) {
      const std::int64_t o = base + static_cast<std::int64_t>(c) * VW;
      load_f32<S, VW>(v[j], x_in + o);
      if (kResidual) {
        float b[VW];
        load_f32<S, VW>(b, y + o);
#pragma unroll
        for (int e = 0; e < VW; ++e) v[j][e] = to_f32(from_f32<S>(v[j][e] + b[e]));
        store_f32<S, VW>(x_out + o, v[j]);
      }
#pragma unroll
      for (int e = 0; e < VW; ++e) ss += v[j][e] * v[j][e];
    }
  }
  ss = row_sum(ss, tpr);
  const float s = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  if (!live) return;
  if (lane == 0) rstd[row] = s;
#pragma unroll
  for (int j = 0; j < kRowVecs; ++j) {
    const int c = lane + j * tpr;
    if (c < nvec) {
      float wv[VW];
      load_f32<S, VW>(wv, w + static_cast<std::int64_t>(c) * VW);
#pragma unroll
      for (int e = 0; e < VW; ++e) wv[e] = (v[j][e] * s) * (wv[e] + off);
      store_f32<S, VW>(h + base + static_cast<std::int64_t>(c) * VW, wv);
    }
  }
}

// dx = rstd * dout * (w + off) - rstd^3 / dim * x * sum(dout * (w + off) * x), written or added.
template <class S, int VW>
__global__ void __launch_bounds__(512) rownorm_backward_dx_kernel(S* dx, const S* dout, const S* x, const S* w,
                                                                  const float* rstd, int rows, int dim, int tpr,
                                                                  bool accumulate, float off) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const int lane = static_cast<int>(threadIdx.x) % tpr, nvec = dim / VW;
  const bool live = row < rows;
  const std::int64_t base = row * dim;
  float xv[kRowVecs][VW], gv[kRowVecs][VW];
  float dot = 0.0f;
#pragma unroll
  for (int j = 0; j < kRowVecs; ++j) {
    const int c = lane + j * tpr;
    if (live && c < nvec) {
      const std::int64_t o = base + static_cast<std::int64_t>(c) * VW;
      float wv[VW];
      load_f32<S, VW>(xv[j], x + o);
      load_f32<S, VW>(gv[j], dout + o);
      load_f32<S, VW>(wv, w + static_cast<std::int64_t>(c) * VW);
#pragma unroll
      for (int e = 0; e < VW; ++e) dot += gv[j][e] * (wv[e] + off) * xv[j][e];
    }
  }
  dot = row_sum(dot, tpr);
  if (!live) return;
  const float s = rstd[row];
  const float cc = dot * s * s * s / static_cast<float>(dim);
#pragma unroll
  for (int j = 0; j < kRowVecs; ++j) {
    const int c = lane + j * tpr;
    if (c < nvec) {
      const std::int64_t o = base + static_cast<std::int64_t>(c) * VW;
      float wv[VW], d[VW];
      load_f32<S, VW>(wv, w + static_cast<std::int64_t>(c) * VW);
      if (accumulate) load_f32<S, VW>(d, dx + o);
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        const float t = s * gv[j][e] * (wv[e] + off) - cc * xv[j][e];
        d[e] = accumulate ? d[e] + t : t;
      }
      store_f32<S, VW>(dx + o, d);
    }
  }
}

// How a call runs on row groups: vw elements per load, tpr threads per row, threads per block, blocks. ok = false:
// the row does not fit kRowVecs vectors of 512 threads (dim > 16384, or > 2048 without 16-byte vectors: the kernels
// above take it).
struct RowPlan {
  bool ok = false;
  int vw = 1, tpr = 1, threads = 1;
  unsigned blocks = 1;
};

int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// vectors: whether every pointer is 16-byte aligned (with dim a multiple of 8, every row then is).
RowPlan row_plan(int rows, int dim, bool vectors) {
  RowPlan p;
  p.vw = vectors && dim % 8 == 0 ? 8 : 1;
  const int nvec = dim / p.vw;
  // One vector per thread up to a warp a row, then up to kRowVecs per thread before more threads.
  const int fill = pow2_at_least((nvec + kRowVecs - 1) / kRowVecs);
  p.tpr = std::min(pow2_at_least(nvec), std::max(32, fill));
  if (p.tpr > 512) return p;
  p.threads = p.tpr <= 32 ? kThreads : p.tpr;
  const int rows_per_block = p.threads / p.tpr;
  p.blocks = static_cast<unsigned>((static_cast<std::int64_t>(rows) + rows_per_block - 1) / rows_per_block);
  p.ok = true;
  return p;
}

bool all_aligned(std::initializer_list<const void*> ps) {
  for (const void* q : ps)
    if (q && !aligned16(q)) return false;
  return true;
}

template <class S, bool kResidual>
void launch_rownorm_forward(const RowPlan& p, cudaStream_t st, S* h, float* rstd, S* x_out, const S* x_in, const S* y,
                            const S* w, int rows, int dim, float eps, float off) {
  launch(pdl_enabled(), p.vw == 8 ? rownorm_forward_kernel<S, 8, kResidual> : rownorm_forward_kernel<S, 1, kResidual>,
         p.blocks, p.threads, 0, st, h, rstd, x_out, x_in, y, w, rows, dim, p.tpr, eps, off);
}

// MGRL_FUSED_NORM=0: the kernels before row groups (one block per row), read once.
bool row_groups() {
  static const bool on = env::switch_on("MGRL_FUSED_NORM");
  return on;
}

}  // namespace

void rmsnorm_forward(const Ctx& c, void* out, float* rstd, const void* x, const void* w, int rows, int dim,
                     float eps, bool unit_offset) {
  if (rows <= 0 || dim <= 0) return;
  const float off = unit_offset ? 1.0f : 0.0f;
  const RowPlan p = row_plan(rows, dim, all_aligned({out, x, w}));
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    if (row_groups() && p.ok) {
      launch_rownorm_forward<S, false>(p, c.stream, static_cast<S*>(out), rstd, nullptr, static_cast<const S*>(x),
                                       nullptr, static_cast<const S*>(w), rows, dim, eps, off);
      return;
    }
    rmsnorm_forward_kernel<S><<<rows, row_threads(dim), 0, c.stream>>>(
        static_cast<S*>(out), rstd, static_cast<const S*>(x), static_cast<const S*>(w), dim, eps, off);
    CUDA_CHECK_LAUNCH();
  });
}

void residual_rmsnorm_forward(const Ctx& c, void* x_out, void* h, float* rstd, const void* x_in, const void* y,
                              const void* w, int rows, int dim, float eps, bool unit_offset) {
  if (rows <= 0 || dim <= 0) return;
  const RowPlan p = row_plan(rows, dim, all_aligned({x_out, h, x_in, y, w}));
  if (!row_groups() || !p.ok) {  // the two passes
    residual_add(c, x_out, x_in, y, static_cast<std::int64_t>(rows) * dim);
    rmsnorm_forward(c, h, rstd, x_out, w, rows, dim, eps, unit_offset);
    return;
  }
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    launch_rownorm_forward<S, true>(p, c.stream, static_cast<S*>(h), rstd, static_cast<S*>(x_out),
                                    static_cast<const S*>(x_in), static_cast<const S*>(y), static_cast<const S*>(w),
                                    rows, dim, eps, unit_offset ? 1.0f : 0.0f);
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
    if (dx && row_groups()) {
      const RowPlan p = row_plan(rows, dim, all_aligned({dx, dout, x, w}));
      if (p.ok) {
        if (p.vw == 8)
          rownorm_backward_dx_kernel<S, 8><<<p.blocks, p.threads, 0, c.stream>>>(
              static_cast<S*>(dx), static_cast<const S*>(dout), static_cast<const S*>(x), static_cast<const S*>(w),
              rstd, rows, dim, p.tpr, accumulate, unit_offset ? 1.0f : 0.0f);
        else
          rownorm_backward_dx_kernel<S, 1><<<p.blocks, p.threads, 0, c.stream>>>(
              static_cast<S*>(dx), static_cast<const S*>(dout), static_cast<const S*>(x), static_cast<const S*>(w),
              rstd, rows, dim, p.tpr, accumulate, unit_offset ? 1.0f : 0.0f);
        CUDA_CHECK_LAUNCH();
        return;
      }
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
