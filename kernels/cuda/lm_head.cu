// lm_head.cu: the output layer fused with log-softmax, in chunks of rows (cuBLAS GEMM into fp32 scratch, then a
// row kernel for logsumexp and the target's log-prob), its backward, full logits, and knowledge distillation's
// divergence from the student's and the teacher's logits (with its backward).
#include "kernels/cuda/lm_head.cuh"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/gemm.cuh"

namespace mgrl::kernels::cuda {
namespace {

constexpr int kRowThreads = 512;  // threads of the per-row logsumexp kernel

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }

// (m, s) pairs of an online log-sum-exp: s = sum of exp(l - m) over the values seen, m their maximum.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float mx = fmaxf(m, m2);
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}
__device__ __forceinline__ void lse_add(float& m, float& s, float x) {
  if (x > m) {
    s = (m == -INFINITY ? 0.0f : s * expf(m - x)) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}

// (m, s, z, i) of an online pass with statistics: besides lse's (m, s), z = sum of exp(l - m) * l and i the index
// of the first maximum.
struct RowStats {
  // x: the plain sum of the logits (their mean); q: the sum of exp(2 (l - m)) (log sum p^2 = log q - 2 log s)
  float m = -INFINITY, s = 0.0f, z = 0.0f, x = 0.0f, q = 0.0f;
  int i = 0x7fffffff;
};
__device__ __forceinline__ void stats_add(RowStats& a, float x, int v) {
  a.x += x;
  if (x > a.m) {
    const float r = a.m == -INFINITY ? 0.0f : expf(a.m - x);
    a.s = a.s * r + 1.0f;
    a.z = a.z * r + x;
    a.q = a.q * r * r + 1.0f;
    a.m = x;
    a.i = v;
  } else {
    const float e = expf(x - a.m);
    a.s += e;
    a.z += e * x;
    a.q += e * e;
    if (x == a.m && v < a.i) a.i = v;
  }
}
__device__ __forceinline__ void stats_merge(RowStats& a, const RowStats& b) {
  if (b.m == -INFINITY) return;
  if (a.m == -INFINITY) {
    a = b;
    return;
  }
  a.x += b.x;
  const float mx = fmaxf(a.m, b.m), ra = expf(a.m - mx), rb = expf(b.m - mx);
  a.s = a.s * ra + b.s * rb;
  a.z = a.z * ra + b.z * rb;
  a.q = a.q * ra * ra + b.q * rb * rb;
  a.i = a.m > b.m ? a.i : (b.m > a.m ? b.i : min(a.i, b.i));
  a.m = mx;
}

// One block per row of the chunk, one pass over the row (online max and sum of exp(l - max), fp32; 16-byte loads
// when V is a multiple of 4), then a block reduction of the (max, sum) pairs: lse = max + log(sum),
// logprob = l[target] - lse (0 for ignored rows). Pointers are already offset to the chunk's first row.
// Stats: also the entropy lse - z / s, the top-1 hit (target == the first maximum's index) and the mean logit into
// entropy[row], top1[row] and mean[row] (0 for ignored rows); a separate instantiation, so that the plain pass keeps
// its two accumulators.
template <bool Stats>
__global__ void lm_head_lse_kernel(float* logprob, float* lse, const float* logits, const std::int32_t* targets,
                                   int V, int* err, float* entropy, float* top1, float* mean, float* lsq) {
  const std::int64_t row = blockIdx.x;
  const float* l = logits + row * V;
  if constexpr (Stats) {
    RowStats a;
    for (int v = threadIdx.x; v < V; v += blockDim.x) stats_add(a, l[v], v);
    for (int o = 16; o > 0; o >>= 1) {
      RowStats b;
      b.m = __shfl_xor_sync(0xffffffffu, a.m, o);
      b.s = __shfl_xor_sync(0xffffffffu, a.s, o);
      b.z = __shfl_xor_sync(0xffffffffu, a.z, o);
      b.i = __shfl_xor_sync(0xffffffffu, a.i, o);
      b.x = __shfl_xor_sync(0xffffffffu, a.x, o);
      b.q = __shfl_xor_sync(0xffffffffu, a.q, o);
      stats_merge(a, b);
    }
    __shared__ RowStats sh[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sh[warp] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < nw; ++w) stats_merge(a, sh[w]);
      const float ls = a.m + logf(a.s);
      lse[row] = ls;
      const std::int32_t tg = targets[row];
      if (tg >= V) atomicOr(err, kErrTargetId);
      const bool ignored = tg < 0 || tg >= V;
      logprob[row] = ignored ? 0.0f : l[tg] - ls;
      entropy[row] = ignored ? 0.0f : ls - a.z / a.s;
      top1[row] = !ignored && tg == a.i ? 1.0f : 0.0f;
      mean[row] = ignored ? 0.0f : a.x / static_cast<float>(V);
      lsq[row] = ignored ? 0.0f : logf(a.q) - 2.0f * logf(a.s);
    }
    return;
  }
  float m = -INFINITY, s = 0.0f;
  if ((V & 3) == 0) {
    const float4* l4 = reinterpret_cast<const float4*>(l);
    for (int v = threadIdx.x; v < V / 4; v += blockDim.x) {
      const float4 x = l4[v];
      lse_add(m, s, x.x);
      lse_add(m, s, x.y);
      lse_add(m, s, x.z);
      lse_add(m, s, x.w);
    }
  } else {
    for (int v = threadIdx.x; v < V; v += blockDim.x) lse_add(m, s, l[v]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    lse_merge(m, s, m2, s2);
  }
  __shared__ float sm[32], ss[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < nw; ++w) lse_merge(m, s, sm[w], ss[w]);
    const float ls = m + logf(s);
    lse[row] = ls;
    const std::int32_t tg = targets[row];
    if (tg >= V) atomicOr(err, kErrTargetId);
    logprob[row] = (tg < 0 || tg >= V) ? 0.0f : l[tg] - ls;
  }
}

// dl[r, v] = c_r * exp(l[r, v] - lse[r]) - (v == target ? c_r : 0), c_r = weights[r] * logit_scale (0 for ignored
// rows), rounded to the storage dtype for the two GEMMs. Grid (ceil(V / (4 * threads)), rows): each thread takes 4
// consecutive columns of one row (16-byte loads when V is a multiple of 4).
// With softcap > 0 the logits are capped (logit_scale * softcap * tanh(raw / softcap)) and each value is also
// multiplied by the tanh's derivative, 1 - (l / (logit_scale * softcap))^2.
// ent_w, ent (optional, both or neither; GRPO's entropy bonus): where ent_w[r] != 0 the row's value is
// logit_scale * (w (p - onehot) + ent_w[r] p (log p + ent[r])) (times the tanh's derivative with softcap), p =
// exp(l - lse) (kernels/cpu/lm_head.h); rows with ent_w[r] = 0 are computed as without.
template <class S>
__global__ void lm_head_dlogits_kernel(S* dl, const float* logits, const std::int32_t* targets, const float* weights,
                                       const float* lse, int V, float logit_scale, float softcap, const float* ent_w,
                                       const float* ent) {
  const std::int64_t r = blockIdx.y;
  const int v0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (v0 >= V) return;
  const std::int32_t tg = targets[r];
  const float w = (tg < 0 || tg >= V) ? 0.0f : weights[r];
  const float u = (tg < 0 || tg >= V || !ent_w) ? 0.0f : ent_w[r];
  const float cr = w * logit_scale, ls = lse[r];
  const float* l = logits + r * V;
  S* d = dl + r * V;
  float x[4];
  const bool full = v0 + 4 <= V;
  if (full && (V & 3) == 0) {
    const float4 x4 = *reinterpret_cast<const float4*>(l + v0);
    x[0] = x4.x;
    x[1] = x4.y;
    x[2] = x4.z;
    x[3] = x4.w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = v0 + k < V ? l[v0 + k] : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (v0 + k >= V) break;
    float val = 0.0f;
    if (u != 0.0f) {
      const float lp = x[k] - ls, p = expf(lp);
      val = w * (p - (v0 + k == tg ? 1.0f : 0.0f)) + u * p * (lp + ent[r]);
      if (softcap > 0.0f) {
        const float th = x[k] / (logit_scale * softcap);
        val *= 1.0f - th * th;
      }
      val *= logit_scale;
    } else if (cr != 0.0f) {
      val = cr * expf(x[k] - ls);
      if (v0 + k == tg) val -= cr;
      if (softcap > 0.0f) {
        const float th = x[k] / (logit_scale * softcap);
        val *= 1.0f - th * th;
      }
    }
    d[v0 + k] = from_f32<S>(val);
  }
}

// x[i] = outer * tanh(x[i] * inner), grid-stride.
__global__ void softcap_kernel(float* x, std::int64_t n, float outer, float inner) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) x[i] = outer * tanhf(x[i] * inner);
}

// logits[n, V] f32 = logit_scale * h[n, D] @ W[V, D]^T, or logit_scale * softcap * tanh(h @ W^T / softcap)
void chunk_logits(const Ctx& c, float* logits, const void* h, const void* W, int n, int D, int V, float logit_scale,
                  float softcap) {
  gemm_rm(c.blas, false, true, n, V, D, softcap > 0.0f ? 1.0f : logit_scale, h, c.st, D, W, c.st, D, 0.0f, logits,
          DType::F32, V);
  if (softcap > 0.0f) {
    const std::int64_t count = static_cast<std::int64_t>(n) * V;
    softcap_kernel<<<grid_for(count), kThreads, 0, c.stream>>>(logits, count, logit_scale * softcap, 1.0f / softcap);
    CUDA_CHECK_LAUNCH();
  }
}

// Row `row` of a row-major [*, D] storage-dtype matrix.
const void* row_ptr(const void* base, std::int64_t row, int D, DType st) {
  return static_cast<const char*>(base) + row * D * static_cast<std::int64_t>(dtype_size(st));
}
void* row_ptr(void* base, std::int64_t row, int D, DType st) {
  return static_cast<char*>(base) + row * D * static_cast<std::int64_t>(dtype_size(st));
}

void check_sizes(int T, int D, int V) {
  MGRL_CHECK(T >= 0 && D > 0 && V > 0,
             "lm_head sizes T=" + std::to_string(T) + " D=" + std::to_string(D) + " V=" + std::to_string(V));
}

// The chunk's rows [t0, t0 + n) from their fp32 logits: lse and logprob.
void chunk_lse(const Ctx& c, float* logprob, float* lse, const float* logits, const std::int32_t* targets, int t0,
               int n, int V, float* stats, int T) {
  if (stats)
    lm_head_lse_kernel<true><<<n, kRowThreads, 0, c.stream>>>(logprob + t0, lse + t0, logits, targets + t0, V, c.err,
                                                               stats + t0, stats + T + t0,
                                                               stats + 2 * static_cast<std::int64_t>(T) + t0,
                                                               stats + 3 * static_cast<std::int64_t>(T) + t0);
  else
    lm_head_lse_kernel<false><<<n, kRowThreads, 0, c.stream>>>(logprob + t0, lse + t0, logits, targets + t0, V, c.err,
                                                                nullptr, nullptr, nullptr, nullptr);
  CUDA_CHECK_LAUNCH();
}

// The chunk's rows [t0, t0 + n) of dh and its part of dW from its storage-dtype dlogits dl [n, V] and hidden states
// hc [n, D] (h offset to row t0).
void chunk_gemms(const Ctx& c, void* dh, float* dW, const void* dl, const void* hc, const void* W, int t0, int n, int D,
                 int V) {
  // dh[n, D] = dl[n, V] @ W[V, D]   (written, storage dtype)
  gemm_rm(c.blas, false, false, n, D, V, 1.0f, dl, c.st, V, W, c.st, D, 0.0f, row_ptr(dh, t0, D, c.st), c.st, D);
  // dW[V, D] += dl[n, V]^T @ h[n, D]   (f32, beta = 1)
  if (dW) gemm_rm(c.blas, true, false, V, D, n, 1.0f, dl, c.st, V, hc, c.st, D, 1.0f, dW, DType::F32, D);
}

// The chunk's backward from its fp32 logits: dlogits (storage dtype) into dl, dh rows written, dW accumulated.
void chunk_backward(const Ctx& c, void* dh, float* dW, void* dl, const float* logits, const float* weights,
                    const void* hc, const void* W, const std::int32_t* targets, const float* lse, int t0, int n, int D,
                    int V, float logit_scale, float softcap, const float* ent_w = nullptr, const float* ent = nullptr) {
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    const dim3 grid(static_cast<unsigned>((V + 4 * kThreads - 1) / (4 * kThreads)), static_cast<unsigned>(n));
    lm_head_dlogits_kernel<S><<<grid, kThreads, 0, c.stream>>>(static_cast<S*>(dl), logits, targets + t0,
                                                               weights + t0, lse + t0, V, logit_scale, softcap,
                                                               ent_w ? ent_w + t0 : nullptr, ent ? ent + t0 : nullptr);
    CUDA_CHECK_LAUNCH();
  });
  chunk_gemms(c, dh, dW, dl, hc, W, t0, n, D, V);
}

// The storage-dtype dlogits part of the scratch, after the fp32 logits.
void* dlogits_part(void* buf, int V) {
  return static_cast<char*>(buf) + align256(static_cast<std::size_t>(lm_head_chunk_rows(V)) * V * sizeof(float));
}

}  // namespace

int lm_head_chunk_rows(int V) {
  // As many rows as keep the chunk's fp32 logits and storage dlogits (6 bytes a value) within 1 GiB, from 128 to
  // 1024 rows: 1024 for vocabularies up to ~175k (a 152k vocabulary: 933 MB). Larger chunks make the two GEMMs of
  // each chunk efficient (M = 128 ran at ~280 TFLOP/s on an H100) and give the row kernels more blocks.
  int rows = 1024;
  while (rows > 128 && static_cast<std::size_t>(rows) * static_cast<std::size_t>(std::max(V, 1)) * 6 > (1u << 30))
    rows /= 2;
  return rows;
}

std::size_t lm_head_scratch_bytes(DType st, int V) {
  const std::size_t n = static_cast<std::size_t>(lm_head_chunk_rows(V)) * static_cast<std::size_t>(std::max(V, 0));
  return align256(n * sizeof(float)) + n * dtype_size(st);
}

namespace {

// The chunk loop of the three ops below: each chunk's logits once, then its forward part (lse, logprob) when
// logprob is non-null and its backward part (dlogits, dh, dW) when dh is non-null.
void head_pass(const Ctx& c, float* logprob, float* lse, void* dh, float* dW, const float* weights, const void* h,
               const void* W, const std::int32_t* targets, const float* lse_in, int T, int D, int V,
               float logit_scale, void* scratch, float softcap, float* stats, const float* ent_w = nullptr,
               const float* ent = nullptr) {
  check_sizes(T, D, V);
  if (T == 0) return;
  void* buf = scratch ? scratch : scratch_alloc(lm_head_scratch_bytes(c.st, V), c.stream);
  float* logits = static_cast<float*>(buf);
  void* dl = dlogits_part(buf, V);
  const int chunk = lm_head_chunk_rows(V);
  for (int t0 = 0; t0 < T; t0 += chunk) {
    const int n = std::min(chunk, T - t0);
    const void* hc = row_ptr(h, t0, D, c.st);
    chunk_logits(c, logits, hc, W, n, D, V, logit_scale, softcap);
    if (logprob) chunk_lse(c, logprob, lse, logits, targets, t0, n, V, stats, T);
    if (dh)
      chunk_backward(c, dh, dW, dl, logits, weights, hc, W, targets, lse_in, t0, n, D, V, logit_scale, softcap, ent_w,
                     ent);
  }
  if (!scratch) scratch_free(buf, c.stream);
}

}  // namespace

void lm_head_logprob_forward(const Ctx& c, float* logprob, float* lse, const void* h, const void* W,
                             const std::int32_t* targets, int T, int D, int V, float logit_scale, void* scratch,
                             float softcap, float* stats) {
  head_pass(c, logprob, lse, nullptr, nullptr, nullptr, h, W, targets, nullptr, T, D, V, logit_scale, scratch, softcap,
            stats);
}

void lm_head_logprob_backward(const Ctx& c, void* dh, float* dW, const float* weights, const void* h, const void* W,
                              const std::int32_t* targets, const float* lse, int T, int D, int V, float logit_scale,
                              void* scratch, float softcap, const float* entropy_weights, const float* entropy) {
  head_pass(c, nullptr, nullptr, dh, dW, weights, h, W, targets, lse, T, D, V, logit_scale, scratch, softcap, nullptr,
            entropy_weights, entropy);
}

void lm_head_logprob_forward_backward(const Ctx& c, float* logprob, float* lse, void* dh, float* dW,
                                      const float* weights, const void* h, const void* W, const std::int32_t* targets,
                                      int T, int D, int V, float logit_scale, void* scratch, float softcap,
                                      float* stats) {
  // The chunk's logits once: its backward part reuses them (lse from its forward part).
  head_pass(c, logprob, lse, dh, dW, weights, h, W, targets, lse, T, D, V, logit_scale, scratch, softcap, stats);
}

namespace {

// ---- knowledge distillation's divergence (kernels/cpu/lm_head.h lm_head_divergence) ----
// mode: 0 forward KL (beta = 0), 1 reverse KL (beta = 1), 2 the generalized JSD (0 < beta < 1).

// log m = log((1 - beta) p_s + beta p_t) from lps = log p_s and lpt = log p_t: logaddexp(lps + log(1 - beta),
// lpt + log beta) (l1b = log(1 - beta), lb = log beta).
__device__ __forceinline__ float log_mix(float lps, float lpt, float l1b, float lb) {
  const float a = lps + l1b, b = lpt + lb;
  return fmaxf(a, b) + log1pf(expf(-fabsf(a - b)));
}

// f(zs[v], zt[v]) for the columns v of a row this thread takes (block-strided; 16-byte loads when V is a multiple of
// 4: the rows of both fp32 buffers then start on 16-byte boundaries).
template <class F>
__device__ __forceinline__ void row_for_each(const float* zs, const float* zt, int V, F&& f) {
  if ((V & 3) == 0) {
    const float4* s4 = reinterpret_cast<const float4*>(zs);
    const float4* t4 = reinterpret_cast<const float4*>(zt);
    for (int v = threadIdx.x; v < V / 4; v += blockDim.x) {
      const float4 x = s4[v], y = t4[v];
      f(x.x, y.x);
      f(x.y, y.y);
      f(x.z, y.z);
      f(x.w, y.w);
    }
  } else {
    for (int v = threadIdx.x; v < V; v += blockDim.x) f(zs[v], zt[v]);
  }
}

// One block per row of the chunk, on its student (zs) and teacher (zt) fp32 logits. Pass 1: online (max, sum of
// exp(l - max)) of both rows, block-reduced (every thread merges the warps' pairs in the same order, so all hold the
// same) to lse_s and lse_t. Pass 2, with log p = l - lse: the student's entropy -sum p_s log p_s and
//   mode 0: d = sum p_t (log p_t - log p_s)                                   (KL(p_t || p_s))
//   mode 1: k = sum p_s (log p_s - log p_t)                                   (KL(p_s || p_t))
//   mode 2: d = sum p_t (log p_t - log m), k = sum p_s (log p_s - log m)      (KL(p_t || m), KL(p_s || m))
// block-summed: div[row] = d, k, or beta d + (1 - beta) k; entropy[row] (each skipped when null); the row's lse_s,
// lse_t and aux = k (chunk-local, for the dlogits kernel). div and entropy are already offset to the chunk's first
// row; zs and zt to the chunk's logits.
__global__ void divergence_row_kernel(float* div, float* entropy, float* lse_s, float* lse_t, float* aux,
                                      const float* zs, const float* zt, int V, int mode, float beta, float l1b,
                                      float lb) {
  const std::int64_t row = blockIdx.x;
  const float* s = zs + row * V;
  const float* q = zt + row * V;
  float ms = -INFINITY, ss = 0.0f, mt = -INFINITY, st = 0.0f;
  row_for_each(s, q, V, [&](float x, float y) {
    lse_add(ms, ss, x);
    lse_add(mt, st, y);
  });
  for (int o = 16; o > 0; o >>= 1) {
    const float ms2 = __shfl_xor_sync(0xffffffffu, ms, o), ss2 = __shfl_xor_sync(0xffffffffu, ss, o);
    const float mt2 = __shfl_xor_sync(0xffffffffu, mt, o), st2 = __shfl_xor_sync(0xffffffffu, st, o);
    lse_merge(ms, ss, ms2, ss2);
    lse_merge(mt, st, mt2, st2);
  }
  __shared__ float sh[4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) {
    sh[0][warp] = ms;
    sh[1][warp] = ss;
    sh[2][warp] = mt;
    sh[3][warp] = st;
  }
  __syncthreads();
  ms = sh[0][0];
  ss = sh[1][0];
  mt = sh[2][0];
  st = sh[3][0];
  for (int w = 1; w < nw; ++w) {
    lse_merge(ms, ss, sh[0][w], sh[1][w]);
    lse_merge(mt, st, sh[2][w], sh[3][w]);
  }
  const float ls = ms + logf(ss), lt = mt + logf(st);
  float e = 0.0f, d = 0.0f, k = 0.0f;
  row_for_each(s, q, V, [&](float x, float y) {
    const float lps = x - ls, lpt = y - lt, ps = expf(lps);
    e -= ps * lps;
    if (mode == 0) {
      d += expf(lpt) * (lpt - lps);
    } else if (mode == 1) {
      k += ps * (lps - lpt);
    } else {
      const float lm = log_mix(lps, lpt, l1b, lb);
      k += ps * (lps - lm);
      d += expf(lpt) * (lpt - lm);
    }
  });
  // block_sum's leading barrier orders these after every thread's reads of sh; mode is the same in the whole block
  e = block_sum(e);
  if (mode != 1) d = block_sum(d);
  if (mode != 0) k = block_sum(k);
  if (threadIdx.x == 0) {
    if (div) div[row] = mode == 0 ? d : mode == 1 ? k : beta * d + (1.0f - beta) * k;
    if (entropy) entropy[row] = e;
    lse_s[row] = ls;
    lse_t[row] = lt;
    aux[row] = k;
  }
}

// dl[r, v] = weights[r] * logit_scale * g[r, v], the gradient of weights[r] * div[r] in the student's logits, with
// log p = l - lse (the row kernel's lse_s, lse_t, and aux = its k):
//   mode 0: g = p_s - p_t;   mode 1: g = p_s (log p_s - log p_t - aux);   mode 2: g = (1 - beta) p_s (log p_s - log m
//   - aux); times the tanh's derivative 1 - (l_s / (logit_scale * softcap))^2 with softcap > 0; 0 on rows of weight
// 0; rounded to the storage dtype for the two GEMMs. Grid (ceil(V / (4 * threads)), rows): each thread takes 4
// consecutive columns of one row (16-byte loads when V is a multiple of 4). weights is offset to the chunk's first
// row; the rest are chunk-local.
template <class S>
__global__ void divergence_dlogits_kernel(S* dl, const float* zs, const float* zt, const float* weights,
                                          const float* lse_s, const float* lse_t, const float* aux, int V, int mode,
                                          float beta, float l1b, float lb, float logit_scale, float softcap) {
  const std::int64_t r = blockIdx.y;
  const int v0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (v0 >= V) return;
  const float w = weights[r];
  S* d = dl + r * V;
  if (w == 0.0f) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (v0 + k < V) d[v0 + k] = from_f32<S>(0.0f);
    return;
  }
  const float* ls_row = zs + r * V;
  const float* lt_row = zt + r * V;
  float xs[4], xt[4];
  if (v0 + 4 <= V && (V & 3) == 0) {
    const float4 a = *reinterpret_cast<const float4*>(ls_row + v0), b = *reinterpret_cast<const float4*>(lt_row + v0);
    xs[0] = a.x;
    xs[1] = a.y;
    xs[2] = a.z;
    xs[3] = a.w;
    xt[0] = b.x;
    xt[1] = b.y;
    xt[2] = b.z;
    xt[3] = b.w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      xs[k] = v0 + k < V ? ls_row[v0 + k] : 0.0f;
      xt[k] = v0 + k < V ? lt_row[v0 + k] : 0.0f;
    }
  }
  const float ls = lse_s[r], lt = lse_t[r], kl = aux[r];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (v0 + k >= V) break;
    const float lps = xs[k] - ls, lpt = xt[k] - lt, ps = expf(lps);
    const float g = mode == 0   ? ps - expf(lpt)
                    : mode == 1 ? ps * (lps - lpt - kl)
                                : (1.0f - beta) * ps * (lps - log_mix(lps, lpt, l1b, lb) - kl);
    float val = g * w * logit_scale;
    if (softcap > 0.0f) {
      const float th = xs[k] / (logit_scale * softcap);
      val *= 1.0f - th * th;
    }
    d[v0 + k] = from_f32<S>(val);
  }
}

// Rows of the divergence's chunk: as many as keep its two fp32 logits buffers and the storage dlogits (10 bytes a
// value, at most) within 1 GiB, from 128 to 1024 rows (a 152k vocabulary: 512).
int divergence_chunk_rows(int V) {
  int rows = 1024;
  while (rows > 128 && static_cast<std::size_t>(rows) * static_cast<std::size_t>(std::max(V, 1)) * 10 > (1u << 30))
    rows /= 2;
  return rows;
}

}  // namespace

void lm_head_divergence(const Ctx& c, float* div, float* entropy, void* dh, float* dW, const float* weights,
                        const void* h, const void* W, int T, int D, int V, float logit_scale, float softcap,
                        const void* th, const void* tW, int Dt, float t_logit_scale, float t_softcap, float beta) {
  check_sizes(T, D, V);
  MGRL_CHECK(Dt > 0, "lm_head_divergence: teacher width Dt=" + std::to_string(Dt));
  MGRL_CHECK(beta >= 0.0f && beta <= 1.0f, "lm_head_divergence: beta " + std::to_string(beta) + " outside [0, 1]");
  MGRL_CHECK(!dh || weights, "lm_head_divergence: the backward needs the rows' weights");
  if (T == 0) return;
  const int mode = beta == 0.0f ? 0 : beta == 1.0f ? 1 : 2;
  const float lb = mode == 2 ? static_cast<float>(std::log(static_cast<double>(beta))) : 0.0f;
  const float l1b = mode == 2 ? static_cast<float>(std::log(1.0 - static_cast<double>(beta))) : 0.0f;
  // Scratch: the chunk's student then teacher fp32 logits, its rows' lse_s, lse_t and aux, then (with the backward)
  // its storage-dtype dlogits.
  const int chunk = divergence_chunk_rows(V);
  const std::size_t vals = static_cast<std::size_t>(chunk) * static_cast<std::size_t>(V);
  const std::size_t logits_bytes = align256(vals * sizeof(float)), rows_bytes = align256(3 * chunk * sizeof(float));
  char* buf = static_cast<char*>(
      scratch_alloc(2 * logits_bytes + rows_bytes + (dh ? vals * dtype_size(c.st) : 0), c.stream));
  float* zs = reinterpret_cast<float*>(buf);
  float* zt = reinterpret_cast<float*>(buf + logits_bytes);
  float* lse_s = reinterpret_cast<float*>(buf + 2 * logits_bytes);
  float* lse_t = lse_s + chunk;
  float* aux = lse_t + chunk;
  void* dl = buf + 2 * logits_bytes + rows_bytes;
  for (int t0 = 0; t0 < T; t0 += chunk) {
    const int n = std::min(chunk, T - t0);
    const void* hc = row_ptr(h, t0, D, c.st);
    chunk_logits(c, zs, hc, W, n, D, V, logit_scale, softcap);
    chunk_logits(c, zt, row_ptr(th, t0, Dt, c.st), tW, n, Dt, V, t_logit_scale, t_softcap);
    divergence_row_kernel<<<n, kRowThreads, 0, c.stream>>>(div ? div + t0 : nullptr, entropy ? entropy + t0 : nullptr,
                                                            lse_s, lse_t, aux, zs, zt, V, mode, beta, l1b, lb);
    CUDA_CHECK_LAUNCH();
    if (!dh) continue;
    dispatch(c.st, [&](auto tag) {
      using S = decltype(tag);
      const dim3 grid(static_cast<unsigned>((V + 4 * kThreads - 1) / (4 * kThreads)), static_cast<unsigned>(n));
      divergence_dlogits_kernel<S><<<grid, kThreads, 0, c.stream>>>(static_cast<S*>(dl), zs, zt, weights + t0, lse_s,
                                                                    lse_t, aux, V, mode, beta, l1b, lb, logit_scale,
                                                                    softcap);
      CUDA_CHECK_LAUNCH();
    });
    chunk_gemms(c, dh, dW, dl, hc, W, t0, n, D, V);
  }
  scratch_free(buf, c.stream);
}

void lm_head_logits(const Ctx& c, float* logits, const void* h, const void* W, int T, int D, int V,
                    float logit_scale, float softcap) {
  check_sizes(T, D, V);
  if (T == 0) return;
  chunk_logits(c, logits, h, W, T, D, V, logit_scale, softcap);
}

}  // namespace mgrl::kernels::cuda
