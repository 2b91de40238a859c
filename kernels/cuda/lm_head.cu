// lm_head.cu: the output layer fused with log-softmax, in chunks of rows (cuBLAS GEMM into fp32 scratch, then a
// row kernel for logsumexp and the target's log-prob), its backward, and full logits.
#include "kernels/cuda/lm_head.cuh"

#include <algorithm>
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
  // dh[n, D] = dl[n, V] @ W[V, D]   (written, storage dtype)
  gemm_rm(c.blas, false, false, n, D, V, 1.0f, dl, c.st, V, W, c.st, D, 0.0f, row_ptr(dh, t0, D, c.st), c.st, D);
  // dW[V, D] += dl[n, V]^T @ h[n, D]   (f32, beta = 1)
  if (dW) gemm_rm(c.blas, true, false, V, D, n, 1.0f, dl, c.st, V, hc, c.st, D, 1.0f, dW, DType::F32, D);
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

void lm_head_divergence(const Ctx&, float*, float*, void*, float*, const float*, const void*, const void*, int, int,
                        int, float, float, const void*, const void*, int, float, float, float) {
  MGRL_CHECK(false, "lm_head_divergence: no CUDA kernel yet");  // TEMPORARY: replaced before this branch lands
}

void lm_head_logits(const Ctx& c, float* logits, const void* h, const void* W, int T, int D, int V,
                    float logit_scale, float softcap) {
  check_sizes(T, D, V);
  if (T == 0) return;
  chunk_logits(c, logits, h, W, T, D, V, logit_scale, softcap);
}

}  // namespace mgrl::kernels::cuda
