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

// One block per row of the chunk: max, then sum of exp(l - max) (fp32, block reductions), lse = max + log(sum),
// logprob = l[target] - lse (0 for ignored rows). Pointers are already offset to the chunk's first row.
__global__ void lm_head_lse_kernel(float* logprob, float* lse, const float* logits, const std::int32_t* targets,
                                   int V, int* err) {
  const std::int64_t row = blockIdx.x;
  const float* l = logits + row * V;
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, l[v]);
  m = block_max(m);
  float s = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(l[v] - m);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const float ls = m + logf(s);
    lse[row] = ls;
    const std::int32_t tg = targets[row];
    if (tg >= V) atomicOr(err, kErrTargetId);
    logprob[row] = (tg < 0 || tg >= V) ? 0.0f : l[tg] - ls;
  }
}

// dl[r, v] = c_r * exp(l[r, v] - lse[r]) - (v == target ? c_r : 0), c_r = weights[r] * logit_scale (0 for ignored
// rows), rounded to the storage dtype for the two GEMMs. One thread per element, grid-stride.
template <class S>
__global__ void lm_head_dlogits_kernel(S* dl, const float* logits, const std::int32_t* targets, const float* weights,
                                       const float* lse, int n, int V, float logit_scale) {
  const std::int64_t total = static_cast<std::int64_t>(n) * V;
  for (std::int64_t i = gs_begin(); i < total; i += gs_stride()) {
    const std::int64_t r = i / V;
    const int v = static_cast<int>(i % V);
    const std::int32_t tg = targets[r];
    const float w = (tg < 0 || tg >= V) ? 0.0f : weights[r];
    float val = 0.0f;
    if (w != 0.0f) {
      const float cr = w * logit_scale;
      val = cr * expf(logits[i] - lse[r]);
      if (v == tg) val -= cr;
    }
    dl[i] = from_f32<S>(val);
  }
}

// logits[n, V] f32 = logit_scale * h[n, D] @ W[V, D]^T
void chunk_logits(const Ctx& c, float* logits, const void* h, const void* W, int n, int D, int V, float logit_scale) {
  gemm_rm(c.blas, false, true, n, V, D, logit_scale, h, c.st, D, W, c.st, D, 0.0f, logits, DType::F32, V);
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

}  // namespace

std::size_t lm_head_scratch_bytes(DType st, int V) {
  const std::size_t n = static_cast<std::size_t>(kLmHeadChunkRows) * static_cast<std::size_t>(std::max(V, 0));
  return align256(n * sizeof(float)) + n * dtype_size(st);
}

void lm_head_logprob_forward(const Ctx& c, float* logprob, float* lse, const void* h, const void* W,
                             const std::int32_t* targets, int T, int D, int V, float logit_scale, void* scratch) {
  check_sizes(T, D, V);
  if (T == 0) return;
  void* buf = scratch ? scratch : scratch_alloc(lm_head_scratch_bytes(c.st, V), c.stream);
  float* logits = static_cast<float*>(buf);
  for (int t0 = 0; t0 < T; t0 += kLmHeadChunkRows) {
    const int n = std::min(kLmHeadChunkRows, T - t0);
    chunk_logits(c, logits, row_ptr(h, t0, D, c.st), W, n, D, V, logit_scale);
    lm_head_lse_kernel<<<n, kRowThreads, 0, c.stream>>>(logprob + t0, lse + t0, logits, targets + t0, V, c.err);
    CUDA_CHECK_LAUNCH();
  }
  if (!scratch) scratch_free(buf, c.stream);
}

void lm_head_logprob_backward(const Ctx& c, void* dh, float* dW, const float* weights, const void* h, const void* W,
                              const std::int32_t* targets, const float* lse, int T, int D, int V, float logit_scale,
                              void* scratch) {
  check_sizes(T, D, V);
  if (T == 0) return;
  void* buf = scratch ? scratch : scratch_alloc(lm_head_scratch_bytes(c.st, V), c.stream);
  float* logits = static_cast<float*>(buf);
  void* dl = static_cast<char*>(buf) + align256(static_cast<std::size_t>(kLmHeadChunkRows) * V * sizeof(float));
  for (int t0 = 0; t0 < T; t0 += kLmHeadChunkRows) {
    const int n = std::min(kLmHeadChunkRows, T - t0);
    const void* hc = row_ptr(h, t0, D, c.st);
    chunk_logits(c, logits, hc, W, n, D, V, logit_scale);
    const std::int64_t total = static_cast<std::int64_t>(n) * V;
    dispatch(c.st, [&](auto tag) {
      using S = decltype(tag);
      lm_head_dlogits_kernel<S><<<grid_for(total), kThreads, 0, c.stream>>>(static_cast<S*>(dl), logits, targets + t0,
                                                                           weights + t0, lse + t0, n, V, logit_scale);
      CUDA_CHECK_LAUNCH();
    });
    // dh[n, D] = dl[n, V] @ W[V, D]   (written, storage dtype)
    gemm_rm(c.blas, false, false, n, D, V, 1.0f, dl, c.st, V, W, c.st, D, 0.0f,
            row_ptr(dh, t0, D, c.st), c.st, D);
    // dW[V, D] += dl[n, V]^T @ h[n, D]   (f32, beta = 1)
    if (dW) gemm_rm(c.blas, true, false, V, D, n, 1.0f, dl, c.st, V, hc, c.st, D, 1.0f, dW, DType::F32, D);
  }
  if (!scratch) scratch_free(buf, c.stream);
}

void lm_head_logits(const Ctx& c, float* logits, const void* h, const void* W, int T, int D, int V,
                    float logit_scale) {
  check_sizes(T, D, V);
  if (T == 0) return;
  chunk_logits(c, logits, h, W, T, D, V, logit_scale);
}

}  // namespace mgrl::kernels::cuda
