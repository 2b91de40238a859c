// gemv.cu: small-M products of the decode step, y[t, o] = x[t] . W[o] for T <= 8 rows of x: each weight row read
// once with 16-byte loads by one warp, for all T rows of x at a time (x, a few KB, comes through L1/L2), fp32
// accumulation in a fixed order, and an epilogue that fuses what follows the product in the unfused step:
//   gemv_group_kernel     up to three matrices over the same x (q|k|v) with their optional biases (one rounding of
//                         acc + bias, as cuBLASLt's bias epilogue does);
//   gemv_gated_kernel     gate and up rows o in the same warp: act = f(round(gate)) * round(up), gate and up rounded
//                         to the storage dtype first as the unfused linear_forward stores them (neither written);
//   gemv_residual_kernel  y = r + round(x W^T), the residual add of residual.cu on the rounded product (y may be r:
//                         each element is read and written by one thread).
// Launch: kGemvWarps warps a block, one output row a warp, grid ceil(rows / kGemvWarps); T a template parameter.
// The group and gated kernels can fold in the RMSNorm before them (Ops::rmsnorm_linear_group_forward,
// rmsnorm_gated_mlp_forward: warp_dots' kNorm), so that the decode step writes no normalised copy of x.
// With MGRL_PDL=1 (common.cuh) a GEMV is scheduled during the kernel before it and prefetches its weight rows into L2
// there, then waits (pdl_wait) before it reads x or writes anything.
// Deterministic, and a row's result does not depend on the other rows of the call nor on T (the order of its sums is
// the same for every T): batch-invariant in the sense of kernels/cpu/gemm.h, though cuBLAS (T > 8, or T > 2 on large
// weights: gemv.cuh) is not.
#include <string>
#include <type_traits>

#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace mgrl::kernels::cuda {
namespace {

constexpr int kGemvWarps = 4;   // warps a block, one output row each
constexpr int kGemvLoads = 4;   // 16-byte weight loads a lane has in flight (over its NW weight rows)

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Eight storage values of a 16-byte load, as fp32.
template <class S>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
  const S* e = reinterpret_cast<const S*>(&raw);
#pragma unroll
  for (int k = 0; k < 8; ++k) f[k] = to_f32(e[k]);
}

// acc[w][t] = W_w . x[t] for the NW weight rows wr[w] [in] and the T rows of x [T, in], over the whole warp: lane l
// takes the 16-byte vectors l, l + 32, l + 64, ... of the rows (kGemvLoads / NW of each row loaded before any is
// used; the weights with the streaming hint, read once), multiply-adds them in element order into fp32, and a
// butterfly warp sum ends it: a fixed order, so the bits do not change from run to run. Every lane gets every sum.
// With kNorm (an RMSNorm folded in: Ops::rmsnorm_linear_group_forward), x[t] is taken times g + off elementwise
// (g [in], the norm's weight) and ss[t] = sum of x[t]^2 comes with it, over the same vectors (the caller scales acc
// by 1 / sqrt(ss / in + eps)).
template <class S, int T, int NW, bool kNorm = false>
__device__ __forceinline__ void warp_dots(float (&acc)[NW][T], const S* const (&wr)[NW], const S* x, int in,
                                          float (*ss)[T] = nullptr, const S* g = nullptr, float off = 0.0f) {
  constexpr int kU = kGemvLoads / NW > 0 ? kGemvLoads / NW : 1;
  const int lane = threadIdx.x & 31, nv = in / 8;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const uint4* gv = reinterpret_cast<const uint4*>(g);
  float sq[T];
#pragma unroll
  for (int t = 0; t < T; ++t) sq[t] = 0.0f;
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[w][t] = 0.0f;
  for (int v0 = lane; v0 < nv; v0 += 32 * kU) {
    uint4 wv[NW][kU] = {};
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int w = 0; w < NW; ++w)
        if (v0 + 32 * u < nv) wv[w][u] = __ldcs(reinterpret_cast<const uint4*>(wr[w]) + v0 + 32 * u);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int v = v0 + 32 * u;
      if (v >= nv) break;
      float wf[NW][8];
#pragma unroll
      for (int w = 0; w < NW; ++w) unpack8<S>(wv[w][u], wf[w]);
      float gf[8];
      if (kNorm) {
        unpack8<S>(__ldg(gv + v), gf);
#pragma unroll
        for (int k = 0; k < 8; ++k) gf[k] += off;
      }
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float xf[8];
        unpack8<S>(__ldg(xv + static_cast<std::int64_t>(t) * nv + v), xf);
        if (kNorm) {
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            sq[t] = fmaf(xf[k], xf[k], sq[t]);
            xf[k] *= gf[k];
          }
        }
#pragma unroll
        for (int w = 0; w < NW; ++w)
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[w][t] = fmaf(wf[w][k], xf[k], acc[w][t]);
      }
    }
  }
#pragma unroll
  for (int w = 0; w < NW; ++w)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[w][t] = warp_sum(acc[w][t]);
  if (kNorm) {
#pragma unroll
    for (int t = 0; t < T; ++t) (*ss)[t] = warp_sum(sq[t]);
  }
}


// a[lane] for lane < T, without indexing the register array at run time (which would put it in local memory).
template <int T>
__device__ __forceinline__ float pick(const float (&a)[T], int lane) {
  float v = 0.0f;
#pragma unroll
  for (int t = 0; t < T; ++t)
    if (t == lane) v = a[t];
  return v;
}

// The PDL prologue of a GEMV warp (common.cuh): with `prefetch` (the kernel was launched with PDL), the warp's NW
// weight rows into L2 a 128-byte line a lane at a time, while the kernel before may still run; then the wait for it,
// and the next kernel let in. Nothing of x or the outputs is touched before.
template <class S, int NW>
__device__ __forceinline__ void prefetch_rows_then_wait(const S* const (&wr)[NW], int in, bool prefetch) {
  if (prefetch) {
    const int lane = static_cast<int>(threadIdx.x & 31);
    const std::int64_t bytes = static_cast<std::int64_t>(in) * static_cast<std::int64_t>(sizeof(S));
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const char* row = reinterpret_cast<const char*>(wr[w]);
      for (std::int64_t b = static_cast<std::int64_t>(lane) * 128; b < bytes; b += 32 * 128) prefetch_l2(row + b);
      if (lane == 0) prefetch_l2(row + bytes - 1);  // the last line, when the row does not start on a line
    }
  }
  pdl_wait();
  pdl_launch_dependents();
}

// The norm fold's arguments (null g: no norm).
template <class S>
struct NormArgs {
  const S* g;
  float off, eps;
};

// A GEMV warp's products: the PDL prologue, then acc[w][t] = W_w . x[t], or with nm.g the norm folded in, W_w .
// (x[t] * (g + off)) / sqrt(mean(x[t]^2) + eps) (the row's rstd as rmsnorm's: 1 / sqrtf(ss / in + eps)).
template <class S, int T, int NW>
__device__ __forceinline__ void gemv_products(float (&acc)[NW][T], const S* const (&wr)[NW], const S* x, int in,
                                              bool prefetch, const NormArgs<S>& nm) {
  prefetch_rows_then_wait<S, NW>(wr, in, prefetch);
  if (!nm.g) {
    warp_dots<S, T, NW>(acc, wr, x, in);
    return;
  }
  float ss[T];
  warp_dots<S, T, NW, true>(acc, wr, x, in, &ss, nm.g, nm.off);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float r = 1.0f / sqrtf(ss[t] / static_cast<float>(in) + nm.eps);
#pragma unroll
    for (int w = 0; w < NW; ++w) acc[w][t] *= r;
  }
}

// The members of a q|k|v group: rows end[i - 1] .. end[i] - 1 of the launch are member i's outputs (end[i] of an
// absent member: the total).
struct GroupArgs {
  void* y[Ops::kMaxLinearGroup];
  const void* W[Ops::kMaxLinearGroup];
  const void* bias[Ops::kMaxLinearGroup];
  int end[Ops::kMaxLinearGroup];
};
static_assert(Ops::kMaxLinearGroup == 3, "member() selects among three");

// v[i] for i < 3 by selects: a run-time index into a kernel parameter's array would copy it to local memory.
template <class P>
__device__ __forceinline__ P member(const P (&v)[Ops::kMaxLinearGroup], int i) {
  return i == 0 ? v[0] : i == 1 ? v[1] : v[2];
}

template <class S, int T>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_group_kernel(GroupArgs a, const S* x, int in, bool prefetch,
                                                                     NormArgs<S> nm) {
  const int row = static_cast<int>(blockIdx.x) * kGemvWarps + static_cast<int>(threadIdx.x >> 5);
  if (row >= a.end[2]) return;  // the whole warp
  const int i = row < a.end[0] ? 0 : row < a.end[1] ? 1 : 2;
  const int begin = i == 0 ? 0 : i == 1 ? a.end[0] : a.end[1], o = row - begin, out = member(a.end, i) - begin;
  const S* const wr[1] = {static_cast<const S*>(member(a.W, i)) + static_cast<std::int64_t>(o) * in};
  float acc[1][T];
  gemv_products<S, T, 1>(acc, wr, x, in, prefetch, nm);
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (lane >= T) return;
  float v = pick<T>(acc[0], lane);
  const S* bias = static_cast<const S*>(member(a.bias, i));
  if (bias) v += to_f32(bias[o]);
  static_cast<S*>(member(a.y, i))[static_cast<std::int64_t>(lane) * out + o] = from_f32<S>(v);
}

template <class S, int T, bool kGeglu>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_gated_kernel(S* act, const S* x, const S* Wg, const S* Wu,
                                                                     int in, int I, bool prefetch, NormArgs<S> nm) {
  const int o = static_cast<int>(blockIdx.x) * kGemvWarps + static_cast<int>(threadIdx.x >> 5);
  if (o >= I) return;
  const std::int64_t at = static_cast<std::int64_t>(o) * in;
  const S* const wr[2] = {Wg + at, Wu + at};
  float acc[2][T];
  gemv_products<S, T, 2>(acc, wr, x, in, prefetch, nm);
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (lane >= T) return;
  const float g = to_f32(from_f32<S>(pick<T>(acc[0], lane))), u = to_f32(from_f32<S>(pick<T>(acc[1], lane)));
  act[static_cast<std::int64_t>(lane) * I + o] = from_f32<S>(kGeglu ? geglu_value(g, u) : swiglu_value(g, u));
}

template <class S, int T>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_residual_kernel(S* y, const S* r, const S* x, const S* W,
                                                                        int in, int out, bool prefetch) {
  const int o = static_cast<int>(blockIdx.x) * kGemvWarps + static_cast<int>(threadIdx.x >> 5);
  if (o >= out) return;
  const S* const wr[1] = {W + static_cast<std::int64_t>(o) * in};
  float acc[1][T];
  gemv_products<S, T, 1>(acc, wr, x, in, prefetch, NormArgs<S>{nullptr, 0.0f, 0.0f});
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (lane >= T) return;
  const std::int64_t e = static_cast<std::int64_t>(lane) * out + o;
  y[e] = from_f32<S>(to_f32(r[e]) + to_f32(from_f32<S>(pick<T>(acc[0], lane))));
}

// Calls f(std::integral_constant<int, T>{}) for 1 <= T <= kGemvMaxRows.
template <class F>
void with_rows(int T, F&& f) {
  switch (T) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: MGRL_CHECK(false, "gemv: " + std::to_string(T) + " rows");
  }
}
static_assert(kGemvMaxRows == 8, "with_rows covers 1..8");

unsigned blocks_for(int rows) { return static_cast<unsigned>((rows + kGemvWarps - 1) / kGemvWarps); }

}  // namespace

bool gemv_fits(int T, int in, std::int64_t rows, const void* x, const void* const* W, int n) {
  if (T < 1 || T > kGemvMaxRows || in <= 0 || in % 8 != 0 || !aligned16(x)) return false;
  if (!gemv_size_ok(T, rows * in * 2)) return false;
  for (int i = 0; i < n; ++i)
    if (!aligned16(W[i])) return false;
  return true;
}

bool gemv_group(const Ctx& c, const Ops::LinearMember* m, int n, const void* x, int T, int in, const void* norm_w,
                float eps, bool unit_offset) {
  MGRL_CHECK(n >= 1 && n <= Ops::kMaxLinearGroup, "linear_group_forward: 1 to 3 members");
  GroupArgs a{};
  const void* W[Ops::kMaxLinearGroup] = {};
  int rows = 0;
  for (int i = 0; i < n; ++i) {
    MGRL_CHECK(m[i].out >= 0, "linear_group_forward: a negative width");
    a.y[i] = m[i].y;
    a.W[i] = W[i] = m[i].W;
    a.bias[i] = m[i].bias;
    a.end[i] = rows += m[i].out;
  }
  for (int i = n; i < Ops::kMaxLinearGroup; ++i) a.end[i] = rows;
  if (!gemv_fits(T, in, rows, x, W, n) || (norm_w && !aligned16(norm_w))) return false;
  if (rows == 0) return true;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    with_rows(T, [&](auto rows_tag) {
      const bool pdl = pdl_enabled();
      const NormArgs<S> nm{static_cast<const S*>(norm_w), unit_offset ? 1.0f : 0.0f, eps};
      launch(pdl, gemv_group_kernel<S, decltype(rows_tag)::value>, blocks_for(rows), kGemvWarps * 32, 0, c.stream, a,
             static_cast<const S*>(x), in, pdl, nm);
    });
  });
  return true;
}

bool gemv_gated_fits(const void* x, const void* Wg, const void* Wu, int T, int in, int I, const void* norm_w) {
  const void* W[2] = {Wg, Wu};
  return gemv_fits(T, in, 2 * static_cast<std::int64_t>(I), x, W, 2) && (!norm_w || aligned16(norm_w));
}

bool gemv_gated(const Ctx& c, void* act, const void* x, const void* Wg, const void* Wu, int T, int in, int I,
                bool geglu, const void* norm_w, float eps, bool unit_offset) {
  if (!gemv_gated_fits(x, Wg, Wu, T, in, I, norm_w)) return false;
  if (I <= 0) return true;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    with_rows(T, [&](auto rows_tag) {
      constexpr int kT = decltype(rows_tag)::value;
      S* a = static_cast<S*>(act);
      const S *xs = static_cast<const S*>(x), *g = static_cast<const S*>(Wg), *u = static_cast<const S*>(Wu);
      const bool pdl = pdl_enabled();
      const NormArgs<S> nm{static_cast<const S*>(norm_w), unit_offset ? 1.0f : 0.0f, eps};
      launch(pdl, geglu ? gemv_gated_kernel<S, kT, true> : gemv_gated_kernel<S, kT, false>, blocks_for(I),
             kGemvWarps * 32, 0, c.stream, a, xs, g, u, in, I, pdl, nm);
    });
  });
  return true;
}

bool gemv_residual(const Ctx& c, void* y, const void* r, const void* x, const void* W, int T, int in, int out) {
  if (!gemv_fits(T, in, out, x, &W, 1)) return false;
  if (out <= 0) return true;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    with_rows(T, [&](auto rows_tag) {
      const bool pdl = pdl_enabled();
      launch(pdl, gemv_residual_kernel<S, decltype(rows_tag)::value>, blocks_for(out), kGemvWarps * 32, 0, c.stream,
             static_cast<S*>(y), static_cast<const S*>(r), static_cast<const S*>(x), static_cast<const S*>(W), in, out,
             pdl);
    });
  });
  return true;
}

}  // namespace mgrl::kernels::cuda
