// attention.cu: causal grouped-query attention over packed variable-length sequences, forward (saves lse) and
// backward: the entry points (head_dim 64 and 128 go to the tiled kernels of flash_attention.cu, or on Volta to those
// of flash_attention_sm70.cu) and the fallback kernels.
//
// Straightforward kernels, written to be checked by reading (no tiling, no tensor cores); like the tiled ones they take
// a sliding window and soft-capping (kernels/attention_options.h: keys t - window < u <= t; scores cap * tanh(s / cap)):
//   forward       one block per query row (b, h, t): pass 1 finds the max score over keys u <= t, pass 2 sums
//                 exp(s - max) and the weighted v rows; out = acc / sum, lse = max + log(sum).
//   backward dq   one block per query row: pass 1 computes Drow = sum_u p_u dp_u (p from the saved lse),
//                 pass 2 dq = scale * sum_u p_u (dp_u - Drow) k_u; Drow is saved to scratch [n_heads, T].
//   backward dkv  one block per key row (b, kv head, u): loops over the group's query heads and queries
//                 u <= t < len, recomputing p and ds; dk = sum ds q, dv = sum p dout. No atomics: deterministic.
// Grids run over (b, head, position < max_len); a block whose position is at or past its sequence's length owns no
// row and exits at once (uniformly: before any barrier). Position t of sequence b is token row cu_seqlens[b] + t;
// every index below is row0 + (a position < len), never past the sequence.
// Within a block each of the kAttnWarps warps takes every kAttnWarps-th key (or query); a dot product over
// head_dim is lane-strided plus a warp reduction; per-warp accumulators of head_dim floats sit in shared memory and
// are summed over warps at the end. Work: O(n_heads * sum_b len_b^2 * head_dim) for each kernel (the forward
// computes each score twice, the backward four times), with k/v (q/dout) rows re-read from L2 by every block.
#include "kernels/cuda/attention.cuh"

#include "kernels/cuda/attend_row.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_attention_sm70.cuh"

#include <string>

namespace mgrl::kernels::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = 32 * kAttnWarps;

// grid.x = B * n_heads * max_len (block id = (b * n_heads + h) * max_len + t), kAttnThreads. Reads q row
// row0 + t and k/v rows row0 .. row0 + t; writes out row row0 + t (head h) and lse[h * T + row0 + t].
template <class S>
__global__ void attention_forward_kernel(S* out, float* lse, const S* q, const S* k, const S* v,
                                         const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads,
                                         int n_kv, int hd, float scale, int window, float softcap, int* err) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float acc[kAttnWarps][kMaxHeadDim];
  __shared__ float red[kAttnWarps];
  const std::int64_t bid = blockIdx.x;
  const int t = static_cast<int>(bid % max_len);
  const std::int64_t bh = bid / max_len;
  const int h = static_cast<int>(bh % n_heads);
  const int b = static_cast<int>(bh / n_heads);
  const SeqRows sr = seq_rows(cu_seqlens, b, B, T, max_len, err);
  if (t >= sr.len) return;  // no row here (uniform over the block)
  const int kvh = h / (n_heads / n_kv);
  const std::int64_t qstride = static_cast<std::int64_t>(n_heads) * hd;  // token row strides
  const std::int64_t kstride = static_cast<std::int64_t>(n_kv) * hd;
  const std::int64_t row0 = sr.row0;
  S* o = out + (row0 + t) * qstride + static_cast<std::int64_t>(h) * hd;
  const S* qi = q + (row0 + t) * qstride + static_cast<std::int64_t>(h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = to_f32(qi[d]);
  __syncthreads();
  const S* kb = k + row0 * kstride + static_cast<std::int64_t>(kvh) * hd;  // key u at kb + u * kstride
  const S* vb = v + row0 * kstride + static_cast<std::int64_t>(kvh) * hd;
  const int first = window > 0 ? max(0, t - window + 1) : 0;
  const float row_lse =
      attend_row<S, kAttnWarps>(o, qs, acc, red, kb, vb, StridedRows{kstride}, first, t, hd, scale, softcap);
  if (threadIdx.x == 0) lse[static_cast<std::int64_t>(h) * T + row0 + t] = row_lse;
}

// grid.x = B * n_heads * max_len (block id as in the forward), kAttnThreads. Reads q/dout row row0 + t, k/v rows
// row0 .. row0 + t, lse[h * T + row0 + t]; writes dq row row0 + t (head h) and Drow[h * T + row0 + t] =
// sum_u p_u dp_u.
template <class S>
__global__ void attention_backward_dq_kernel(S* dq, float* Drow, const S* dout, const S* q, const S* k, const S* v,
                                             const float* lse, const std::int32_t* cu_seqlens, int B, int T,
                                             int max_len, int n_heads, int n_kv, int hd, float scale, int window,
                                             float softcap, int* err) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float gs[kMaxHeadDim];
  __shared__ float acc[kAttnWarps][kMaxHeadDim];
  __shared__ float red[kAttnWarps];
  const std::int64_t bid = blockIdx.x;
  const int t = static_cast<int>(bid % max_len);
  const std::int64_t bh = bid / max_len;
  const int h = static_cast<int>(bh % n_heads);
  const int b = static_cast<int>(bh / n_heads);
  const SeqRows sr = seq_rows(cu_seqlens, b, B, T, max_len, err);
  if (t >= sr.len) return;  // no row here (uniform over the block)
  const int kvh = h / (n_heads / n_kv);
  const std::int64_t qstride = static_cast<std::int64_t>(n_heads) * hd;
  const std::int64_t kstride = static_cast<std::int64_t>(n_kv) * hd;
  const std::int64_t row0 = sr.row0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t qoff = (row0 + t) * qstride + static_cast<std::int64_t>(h) * hd;
  const std::int64_t r = static_cast<std::int64_t>(h) * T + row0 + t;  // index into lse and Drow
  S* dqi = dq + qoff;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    qs[d] = to_f32(q[qoff + d]);
    gs[d] = to_f32(dout[qoff + d]);
  }
  for (int d = lane; d < hd; d += 32) acc[warp][d] = 0.0f;
  __syncthreads();
  const S* kb = k + row0 * kstride + static_cast<std::int64_t>(kvh) * hd;
  const S* vb = v + row0 * kstride + static_cast<std::int64_t>(kvh) * hd;
  const float lse_t = lse[r];

  // Pass 1: Drow = sum_u p_u dp_u with p_u = exp(cap(scale * q . k_u) - lse), dp_u = dout . v_u, over the keys
  // u of the window.
  const int first = window > 0 ? max(0, t - window + 1) : 0;
  float dsum = 0.0f;
  for (int u = first + warp; u <= t; u += kAttnWarps) {
    const float p = expf(capped_score(scale * warp_dot(qs, kb + u * kstride, hd), softcap) - lse_t);
    const float dp = warp_dot(gs, vb + u * kstride, hd);
    dsum += p * dp;
  }
  if (lane == 0) red[warp] = dsum;
  __syncthreads();
  float D = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) D += red[w];

  // Pass 2: dq = sum_u ds_u k_u with ds_u = scale * p_u * (dp_u - D) (* (1 - (s_u / softcap)^2) when capped).
  for (int u = first + warp; u <= t; u += kAttnWarps) {
    const S* ku = kb + u * kstride;
    const float s = capped_score(scale * warp_dot(qs, ku, hd), softcap);
    const float p = expf(s - lse_t);
    const float dp = warp_dot(gs, vb + u * kstride, hd);
    const float dcap = softcap > 0.0f ? 1.0f - (s / softcap) * (s / softcap) : 1.0f;
    const float ds = scale * p * (dp - D) * dcap;
    for (int d = lane; d < hd; d += 32) acc[warp][d] += ds * to_f32(ku[d]);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) a += acc[w][d];
    dqi[d] = from_f32<S>(a);
  }
  if (threadIdx.x == 0) Drow[r] = D;
}

// grid.x = B * n_kv * max_len (block id = (b * n_kv + kvh) * max_len + u), kAttnThreads. Reads k/v row row0 + u,
// q/dout rows row0 + u .. row0 + len - 1 of the group's heads and their lse/Drow; writes dk and dv of key row
// row0 + u (kv head kvh): sums over the group's query heads h and queries t in [u, len).
template <class S>
__global__ void attention_backward_dkv_kernel(S* dk, S* dv, const S* dout, const S* q, const S* k, const S* v,
                                              const float* lse, const float* Drow, const std::int32_t* cu_seqlens,
                                              int B, int T, int max_len, int n_heads, int n_kv, int hd, float scale,
                                              int window, float softcap, int* err) {
  __shared__ float ks[kMaxHeadDim];
  __shared__ float vs[kMaxHeadDim];
  __shared__ float dk_acc[kAttnWarps][kMaxHeadDim];
  __shared__ float dv_acc[kAttnWarps][kMaxHeadDim];
  const std::int64_t bid = blockIdx.x;
  const int u = static_cast<int>(bid % max_len);
  const std::int64_t bk = bid / max_len;
  const int kvh = static_cast<int>(bk % n_kv);
  const int b = static_cast<int>(bk / n_kv);
  const SeqRows sr = seq_rows(cu_seqlens, b, B, T, max_len, err);
  const int len = sr.len;
  if (u >= len) return;  // no row here (uniform over the block)
  const int group = n_heads / n_kv;
  const std::int64_t qstride = static_cast<std::int64_t>(n_heads) * hd;
  const std::int64_t kstride = static_cast<std::int64_t>(n_kv) * hd;
  const std::int64_t row0 = sr.row0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::int64_t koff = (row0 + u) * kstride + static_cast<std::int64_t>(kvh) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    ks[d] = to_f32(k[koff + d]);
    vs[d] = to_f32(v[koff + d]);
  }
  for (int d = lane; d < hd; d += 32) {
    dk_acc[warp][d] = 0.0f;
    dv_acc[warp][d] = 0.0f;
  }
  __syncthreads();
  const int nq = (window > 0 ? min(len, u + window) : len) - u;  // queries t = u .. u+nq-1 see key u
  const std::int64_t pairs = static_cast<std::int64_t>(group) * nq;
  for (std::int64_t idx = warp; idx < pairs; idx += kAttnWarps) {
    const int h = kvh * group + static_cast<int>(idx / nq);
    const int t = u + static_cast<int>(idx % nq);
    const std::int64_t qoff = (row0 + t) * qstride + static_cast<std::int64_t>(h) * hd;
    const std::int64_t r = static_cast<std::int64_t>(h) * T + row0 + t;  // index into lse and Drow
    const float s = capped_score(scale * warp_dot(ks, q + qoff, hd), softcap);
    const float p = expf(s - lse[r]);
    const float dp = warp_dot(vs, dout + qoff, hd);
    const float dcap = softcap > 0.0f ? 1.0f - (s / softcap) * (s / softcap) : 1.0f;
    const float ds = scale * p * (dp - Drow[r]) * dcap;
    for (int d = lane; d < hd; d += 32) {
      dk_acc[warp][d] += ds * to_f32(q[qoff + d]);
      dv_acc[warp][d] += p * to_f32(dout[qoff + d]);
    }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f, g = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      a += dk_acc[w][d];
      g += dv_acc[w][d];
    }
    dk[koff + d] = from_f32<S>(a);
    dv[koff + d] = from_f32<S>(g);
  }
}

// Host-side checks (the device checks cu_seqlens itself: seq_rows). T <= B * max_len holds for any valid
// cu_seqlens, and with it every grid below is non-empty once T > 0.
float score_scale(const AttentionOptions& opt, int head_dim) {
  return opt.scale > 0.0f ? opt.scale : 1.0f / sqrtf(static_cast<float>(head_dim));
}

void check_shapes(int B, int T, int max_len, int n_heads, int n_kv, int head_dim) {
  MGRL_CHECK(n_kv > 0 && n_heads % n_kv == 0,
             "n_heads (" + std::to_string(n_heads) + ") must be a multiple of n_kv (" + std::to_string(n_kv) + ")");
  MGRL_CHECK(head_dim > 0 && head_dim <= kMaxHeadDim,
             "the CUDA attention kernels take head_dim in [1, " + std::to_string(kMaxHeadDim) + "] (got " +
                 std::to_string(head_dim) + ")");
  MGRL_CHECK(B >= 0 && T >= 0 && max_len >= 0, "negative attention sizes");
  MGRL_CHECK(static_cast<std::int64_t>(T) <= static_cast<std::int64_t>(B) * max_len,
             "attention: T (" + std::to_string(T) + ") exceeds B * max_len (" + std::to_string(B) + " * " +
                 std::to_string(max_len) + ")");
  MGRL_CHECK(static_cast<std::int64_t>(B) * n_heads * max_len < (std::int64_t{1} << 31), "attention grid too large");
  MGRL_CHECK(max_len <= 65535 * 64, "attention: max_len above 65535 * 64 (tiled kernels' grid.y)");
}

}  // namespace

void attention_forward_naive(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                             const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                             int head_dim, const AttentionOptions& opt) {
  check_shapes(B, T, max_len, n_heads, n_kv, head_dim);
  if (T == 0) return;
  const std::int64_t blocks = static_cast<std::int64_t>(B) * n_heads * max_len;
  const float scale = score_scale(opt, head_dim);
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    attention_forward_kernel<S><<<static_cast<unsigned>(blocks), kAttnThreads, 0, c.stream>>>(
        static_cast<S*>(out), lse, static_cast<const S*>(q), static_cast<const S*>(k), static_cast<const S*>(v),
        cu_seqlens, B, T, max_len, n_heads, n_kv, head_dim, scale, opt.window, opt.softcap, c.err);
    CUDA_CHECK_LAUNCH();
  });
}

void attention_backward_naive(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* q,
                              const void* k, const void* v, const float* lse, const std::int32_t* cu_seqlens, int B,
                              int T, int max_len, int n_heads, int n_kv, int head_dim, const AttentionOptions& opt) {
  check_shapes(B, T, max_len, n_heads, n_kv, head_dim);
  if (T == 0) return;
  const std::int64_t blocks = static_cast<std::int64_t>(B) * n_heads * max_len;
  const std::int64_t kv_blocks = static_cast<std::int64_t>(B) * n_kv * max_len;
  const float scale = score_scale(opt, head_dim);
  // Drow [n_heads, T], laid out as lse.
  float* Drow = static_cast<float*>(
      scratch_alloc(sizeof(float) * static_cast<std::size_t>(n_heads) * static_cast<std::size_t>(T), c.stream));
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    attention_backward_dq_kernel<S><<<static_cast<unsigned>(blocks), kAttnThreads, 0, c.stream>>>(
        static_cast<S*>(dq), Drow, static_cast<const S*>(dout), static_cast<const S*>(q), static_cast<const S*>(k),
        static_cast<const S*>(v), lse, cu_seqlens, B, T, max_len, n_heads, n_kv, head_dim, scale, opt.window,
        opt.softcap, c.err);
    CUDA_CHECK_LAUNCH();
    attention_backward_dkv_kernel<S><<<static_cast<unsigned>(kv_blocks), kAttnThreads, 0, c.stream>>>(
        static_cast<S*>(dk), static_cast<S*>(dv), static_cast<const S*>(dout), static_cast<const S*>(q),
        static_cast<const S*>(k), static_cast<const S*>(v), lse, Drow, cu_seqlens, B, T, max_len, n_heads, n_kv,
        head_dim, scale, opt.window, opt.softcap, c.err);
    CUDA_CHECK_LAUNCH();
  });
  scratch_free(Drow, c.stream);
}

AttentionKernels attention_kernels(DType st, int head_dim, std::initializer_list<const void*> tensors) {
  if (flash_attention_sm70_forced() && flash_attention_sm70_applies(st, head_dim, tensors))
    return AttentionKernels::kSm70;
  if (flash_attention_applies(st, head_dim, tensors)) return AttentionKernels::kTiled;
  if (flash_attention_sm70_applies(st, head_dim, tensors)) return AttentionKernels::kSm70;
  return AttentionKernels::kNaive;
}

const char* attention_kernels_name(AttentionKernels k) {
  switch (k) {
    case AttentionKernels::kTiled:
      return "tiled";
    case AttentionKernels::kSm70:
      return "sm70";
    case AttentionKernels::kNaive:
      break;
  }
  return "naive";
}

// Which kernels take a call with these options: the tiled ones take every option; the Volta ones none (a call with
// options runs the naive kernels there).
AttentionKernels kernels_for(const AttentionOptions& opt, DType st, int head_dim,
                             std::initializer_list<const void*> tensors) {
  const AttentionKernels k = attention_kernels(st, head_dim, tensors);
  return k == AttentionKernels::kSm70 && !opt.plain() ? AttentionKernels::kNaive : k;
}

void attention_forward(const Ctx& c, void* out, float* lse, const void* q, const void* k, const void* v,
                       const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                       int head_dim, const AttentionOptions& opt) {
  check_shapes(B, T, max_len, n_heads, n_kv, head_dim);
  if (T == 0) return;
  switch (kernels_for(opt, c.st, head_dim, {out, q, k, v})) {
    case AttentionKernels::kTiled:
      flash_attention_forward(c, out, lse, q, k, v, cu_seqlens, B, T, max_len, n_heads, n_kv, head_dim, opt);
      return;
    case AttentionKernels::kSm70:
      flash_attention_sm70_forward(c, out, lse, q, k, v, cu_seqlens, B, T, max_len, n_heads, n_kv, head_dim);
      return;
    case AttentionKernels::kNaive:
      break;
  }
  attention_forward_naive(c, out, lse, q, k, v, cu_seqlens, B, T, max_len, n_heads, n_kv, head_dim, opt);
}

void attention_backward(const Ctx& c, void* dq, void* dk, void* dv, const void* dout, const void* out, const void* q,
                        const void* k, const void* v, const float* lse, const std::int32_t* cu_seqlens, int B, int T,
                        int max_len, int n_heads, int n_kv, int head_dim, const AttentionOptions& opt) {
  check_shapes(B, T, max_len, n_heads, n_kv, head_dim);
  if (T == 0) return;
  switch (kernels_for(opt, c.st, head_dim, {dq, dk, dv, dout, out, q, k, v})) {
    case AttentionKernels::kTiled:
      flash_attention_backward(c, dq, dk, dv, dout, out, q, k, v, lse, cu_seqlens, B, T, max_len, n_heads, n_kv,
                               head_dim, opt);
      return;
    case AttentionKernels::kSm70:
      flash_attention_sm70_backward(c, dq, dk, dv, dout, out, q, k, v, lse, cu_seqlens, B, T, max_len, n_heads,
                                    n_kv, head_dim);
      return;
    case AttentionKernels::kNaive:
      break;
  }
  attention_backward_naive(c, dq, dk, dv, dout, q, k, v, lse, cu_seqlens, B, T, max_len, n_heads, n_kv, head_dim,
                           opt);
}

}  // namespace mgrl::kernels::cuda
