// cuda_ops.cu: the CUDA backend of the op interface (kernels/ops.h): owns the stream, the cuBLAS handle and the
// device error word; memory and copies here, each op forwarding to its kernels/cuda launcher.
#include "kernels/cuda/cuda_ops.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/check_cuda.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/kv_cache.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/lm_head.cuh"
#include "kernels/cuda/lora.cuh"
#include "kernels/cuda/nf4.cuh"
#include "kernels/cuda/optimizer.cuh"
#include "kernels/cuda/phase_timer.cuh"
#include "kernels/cuda/residual.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace mgrl::kernels {

#if CUDART_VERSION >= 12030
namespace {
// Compiled like every kernel of the library (same architectures), so its code's PTX version is theirs.
__global__ void pdl_probe_kernel() { cuda::pdl_wait(); }
}  // namespace
#endif

bool cuda::pdl_enabled() {
  static const bool on = [] {
#if CUDART_VERSION >= 12030
    if (!env::opt_in("MGRL_PDL")) return false;
    const int major = cuda::device_facts().major;
    // The code the device runs must have been compiled for compute_90 or later: in a build whose newest code is
    // compute_80 PTX (which an H100's driver JIT-compiles) pdl_wait() is empty, and a kernel launched with the
    // attribute would read its inputs before the kernel that writes them has finished.
    cudaFuncAttributes code{};
    CUDA_CHECK(cudaFuncGetAttributes(&code, pdl_probe_kernel));
    // Programmatic edges in captured graphs (the decode step is recorded) need a 12.3 driver.
    int driver = 0;
    CUDA_CHECK(cudaDriverGetVersion(&driver));
    const char* why = major < 9            ? "needs compute capability 9.0"
                      : code.ptxVersion < 90 ? "needs kernels compiled for compute_90 or later (this build has none)"
                      : driver < 12030       ? "needs a CUDA 12.3 or newer driver"
                                             : nullptr;
    if (why) {
      log::info(std::string("MGRL_PDL=1 ignored: programmatic dependent launch ") + why);
      return false;
    }
    log::info("MGRL_PDL=1: the decode step's kernels are launched with programmatic dependent launch");
    return true;
#else
    if (env::opt_in("MGRL_PDL")) log::info("MGRL_PDL=1 ignored: programmatic dependent launch needs CUDA 12.3 or newer");
    return false;
#endif
  }();
  return on;
}

namespace {

class CudaOps final : public Ops {
 public:
  CudaOps(int device, DType storage) : st_(storage) {
    CUDA_CHECK(cudaSetDevice(device));
    int pools = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
    MGRL_CHECK(pools != 0, "CUDA device " + std::to_string(device) +
                               " does not support stream-ordered allocation (cudaMallocAsync), which the CUDA "
                               "backend uses for op scratch");
    // Scratch freed with cudaFreeAsync stays in the device's default pool (no return to the driver at each sync).
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    std::uint64_t threshold = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    // Biased linear layers on cuBLASLt (bias in the epilogue); MGRL_CUBLASLT_BIAS=0: bias broadcast + cublasGemmEx.
    if (env::switch_on("MGRL_CUBLASLT_BIAS")) lt_ = cuda::lt_create();
    CUDA_CHECK(cudaMalloc(&err_, sizeof(int)));
    CUDA_CHECK(cudaMemsetAsync(err_, 0, sizeof(int), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    timer_ = std::make_unique<cuda::PhaseTimer>(stream_);
  }
  ~CudaOps() override {
    // Teardown must not throw: errors here are ignored.
    (void)cudaStreamSynchronize(stream_);
    for (auto& [key, exec] : graphs_) (void)cudaGraphExecDestroy(exec);
    timer_.reset();
    cuda::lt_destroy(lt_);
    (void)cublasDestroy(blas_);
    (void)cudaFree(err_);
    (void)cudaStreamDestroy(stream_);
  }
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;
  DeviceStream device_stream() const override { return {static_cast<void*>(stream_)}; }

  const char* name() const override { return "cuda"; }
  DType storage() const override { return st_; }

  // ---- memory (setup time: these synchronise) ----
  void* alloc(std::size_t bytes) override {
    const std::size_t n = bytes ? bytes : 1;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: the context stays usable
      std::size_t free = 0, total = 0;
      (void)cudaMemGetInfo(&free, &total);
      throw OutOfMemory("out of GPU memory allocating " + std::to_string(n) + " bytes (" +
                        std::to_string(free >> 20) + " of " + std::to_string(total >> 20) + " MiB free)");
    }
    CUDA_CHECK(e);
    CUDA_CHECK(cudaMemsetAsync(p, 0, n, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return p;
  }
  std::size_t available_memory() const override {
    std::size_t free = 0, total = 0;
    return cudaMemGetInfo(&free, &total) == cudaSuccess ? free : 0;
  }
  void release(void* p) override {
    if (!p) return;
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // no queued op may still use p
    CUDA_CHECK(cudaFree(p));
  }
  // From pageable host memory cudaMemcpyAsync returns once the data is staged, so `host` may be reused at once;
  // from pinned host memory the caller must not touch `host` before the next synchronisation.
  void upload(void* dst, const void* host, std::size_t bytes) override {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void download(void* host, const void* src, std::size_t bytes) override {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    wait();
    check_device_errors();
  }
  // dst and src must not overlap (cudaMemcpy), unlike the CPU backend's memmove.
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes && dst != src) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void zero(void* p, std::size_t bytes) override {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  void upload_f32_as_storage(void* dst, const float* host, std::size_t n) override {
    if (!n) return;
    float* tmp = static_cast<float*>(cuda::scratch_alloc(n * sizeof(float), stream_));
    CUDA_CHECK(cudaMemcpyAsync(tmp, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    cuda::f32_to_storage(ctx(), dst, tmp, static_cast<std::int64_t>(n));
    cuda::scratch_free(tmp, stream_);
  }
  void f32_to_storage(void* dst, const float* src, std::size_t n) override {
    if (n) cuda::f32_to_storage(ctx(), dst, src, static_cast<std::int64_t>(n));
  }
  void download_storage_as_f32(float* host, const void* src, std::size_t n) override {
    if (!n) return;
    float* tmp = static_cast<float*>(cuda::scratch_alloc(n * sizeof(float), stream_));
    cuda::storage_to_f32(ctx(), tmp, src, static_cast<std::int64_t>(n));
    CUDA_CHECK(cudaMemcpyAsync(host, tmp, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    cuda::scratch_free(tmp, stream_);
    wait();
    check_device_errors();
  }
  void synchronize() override {
    wait();
    check_device_errors();
  }

  // ---- ops ----
  void embedding_forward(void* out, const std::int32_t* ids, const void* table, int T, int V, int D,
                         float scale = 1.0f) override {
    cuda::embedding_forward(ctx(), out, ids, table, T, V, D, scale);
  }
  void embedding_backward(float* dtable, const void* dout, const std::int32_t* ids, int T, int V, int D,
                          float scale = 1.0f) override {
    cuda::embedding_backward(ctx(), dtable, dout, ids, T, V, D, scale);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int rows, int dim, float eps,
                       bool unit_offset = false) override {
    cuda::rmsnorm_forward(ctx(), out, rstd, x, w, rows, dim, eps, unit_offset);
  }
  void rmsnorm_backward(void* dx, float* dw, const void* dout, const void* x, const void* w, const float* rstd,
                        int rows, int dim, bool accumulate, bool unit_offset = false) override {
    cuda::rmsnorm_backward(ctx(), dx, dw, dout, x, w, rstd, rows, dim, accumulate, unit_offset);
  }
  void residual_rmsnorm_forward(void* x_out, void* h, float* rstd, const void* x_in, const void* y, const void* w,
                                int rows, int dim, float eps, bool unit_offset = false) override {
    cuda::residual_rmsnorm_forward(ctx(), x_out, h, rstd, x_in, y, w, rows, dim, eps, unit_offset);
  }
  void linear_forward(void* y, const void* x, const void* W, const void* bias, int T, int in, int out) override {
    cuda::linear_forward(ctx(), y, x, W, bias, T, in, out);
  }
  void linear_backward(void* dx, float* dW, float* dbias, const void* dy, const void* x, const void* W, int T, int in,
                       int out, bool accumulate_dx) override {
    cuda::linear_backward(ctx(), dx, dW, dbias, dy, x, W, T, in, out, accumulate_dx);
  }
  void lora_forward(void* y, float* xa, const void* x, const float* A, const float* B, float scale, int T, int in,
                    int r, int out) override {
    cuda::lora_forward(ctx(), y, xa, x, A, B, scale, T, in, r, out);
  }
  void lora_backward(void* dx, float* dA, float* dB, const void* dy, const void* x, const float* xa, const float* A,
                     const float* B, float scale, int T, int in, int r, int out, float* scratch) override {
    cuda::lora_backward(ctx(), dx, dA, dB, dy, x, xa, A, B, scale, T, in, r, out, scratch);
  }
  void lora_merge(void* Wm, const void* W, const float* A, const float* B, float scale, int out, int in,
                  int r) override {
    cuda::lora_merge(ctx(), Wm, W, A, B, scale, out, in, r);
  }
  void lora_group_forward(const LoraMember* g, int n, const void* x, int T, int in, int r, float*) override {
    cuda::lora_group_forward(ctx(), g, n, x, T, in, r);
  }
  bool linear_lora_group_forward(const LinearMember* m, const LoraMember* g, int n, const void* x, int T, int in,
                                 int r) override {
    if (n <= 0 || n > kMaxLoraGroup) return false;
    const void* W[kMaxLoraGroup] = {};
    for (int i = 0; i < n; ++i) {
      if (m[i].bias || m[i].y != g[i].y || m[i].out != g[i].out) return false;
      W[i] = m[i].W;
    }
    return cuda::lora_concat_forward(ctx(), g, W, n, x, T, in, r);
  }
  void lora_group_backward(void* dx, const LoraMember* g, int n, const void* x, int T, int in, int r,
                           float*) override {
    cuda::lora_group_backward(ctx(), dx, g, n, x, T, in, r);
  }
  void dropout(void* out, const void* x, int rows, int cols, float p, std::uint64_t seed,
               const std::uint64_t* row_keys) override {
    cuda::dropout(ctx(), out, x, rows, cols, p, seed, row_keys);
  }
  void add_uniform_noise(void* x, int rows, int cols, const float* row_scale, std::uint64_t seed,
                         const std::uint64_t* row_keys) override {
    cuda::add_uniform_noise(ctx(), x, rows, cols, row_scale, seed, row_keys);
  }
  void rope_forward(void* x, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                    int head_dim) override {
    cuda::rope_forward(ctx(), x, pos, inv_freq, T, n_heads, head_dim);
  }
  void rope_backward(void* dx, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                     int head_dim) override {
    cuda::rope_backward(ctx(), dx, pos, inv_freq, T, n_heads, head_dim);
  }
  void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                         const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                         int head_dim, const AttentionOptions& opt = {}) override {
    cuda::attention_forward(ctx(), out, lse, q, k, v, cu_seqlens, B, T, max_len, n_heads, n_kv, head_dim, opt);
  }
  void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const void* q,
                          const void* k, const void* v, const float* lse, const std::int32_t* cu_seqlens, int B,
                          int T, int max_len, int n_heads, int n_kv, int head_dim,
                          const AttentionOptions& opt = {}) override {
    cuda::attention_backward(ctx(), dq, dk, dv, dout, out, q, k, v, lse, cu_seqlens, B, T, max_len, n_heads, n_kv,
                             head_dim, opt);
  }
  void dequantize_nf4(void* dst, const Nf4Weight& w, std::int64_t begin, std::int64_t end) override {
    cuda::dequantize_nf4(ctx(), dst, w, begin, end);
  }
  void swiglu_forward(void* out, const void* gate, const void* up, std::int64_t n) override {
    cuda::swiglu_forward(ctx(), out, gate, up, n);
  }
  void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                       std::int64_t n) override {
    cuda::swiglu_backward(ctx(), dgate, dup, dout, gate, up, n);
  }
  void geglu_forward(void* out, const void* gate, const void* up, std::int64_t n) override {
    cuda::geglu_forward(ctx(), out, gate, up, n);
  }
  void geglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                      std::int64_t n) override {
    cuda::geglu_backward(ctx(), dgate, dup, dout, gate, up, n);
  }
  void residual_forward(void* x, const void* y, std::int64_t n) override { cuda::residual_forward(ctx(), x, y, n); }
  void residual_add(void* out, const void* a, const void* b, std::int64_t n) override {
    cuda::residual_add(ctx(), out, a, b, n);
  }
  std::size_t lm_head_scratch_bytes(int V) const override { return cuda::lm_head_scratch_bytes(st_, V); }
  void lm_head_logprob_forward(float* logprob, float* lse, const void* h, const void* W, const std::int32_t* targets,
                               int T, int D, int V, float logit_scale, void* scratch, float softcap = 0.0f,
                               float* stats = nullptr) override {
    cuda::lm_head_logprob_forward(ctx(), logprob, lse, h, W, targets, T, D, V, logit_scale, scratch, softcap, stats);
  }
  void lm_head_logprob_backward(void* dh, float* dW, const float* weights, const void* h, const void* W,
                                const std::int32_t* targets, const float* lse, int T, int D, int V, float logit_scale,
                                void* scratch, float softcap = 0.0f, const float* entropy_weights = nullptr,
                                const float* entropy = nullptr) override {
    cuda::lm_head_logprob_backward(ctx(), dh, dW, weights, h, W, targets, lse, T, D, V, logit_scale, scratch,
                                   softcap, entropy_weights, entropy);
  }
  void lm_head_logprob_forward_backward(float* logprob, float* lse, void* dh, float* dW, const float* weights,
                                        const void* h, const void* W, const std::int32_t* targets, int T, int D, int V,
                                        float logit_scale, void* scratch, float softcap = 0.0f,
                                        float* stats = nullptr) override {
    cuda::lm_head_logprob_forward_backward(ctx(), logprob, lse, dh, dW, weights, h, W, targets, T, D, V, logit_scale,
                                           scratch, softcap, stats);
  }
  void lm_head_divergence(float* div, float* entropy, void* dh, float* dW, const float* weights, const void* h,
                          const void* W, int T, int D, int V, float logit_scale, float softcap, const void* th,
                          const void* tW, int Dt, float t_logit_scale, float t_softcap, float beta) override {
    cuda::lm_head_divergence(ctx(), div, entropy, dh, dW, weights, h, W, T, D, V, logit_scale, softcap, th, tW, Dt,
                             t_logit_scale, t_softcap, beta);
  }
  void lm_head_logits(float* logits, const void* h, const void* W, int T, int D, int V, float logit_scale,
                      float softcap = 0.0f) override {
    cuda::lm_head_logits(ctx(), logits, h, W, T, D, V, logit_scale, softcap);
  }
  void kv_store(void* cache_k, void* cache_v, const void* k, const void* v, const std::int32_t* slot,
                const std::int32_t* pos, int T, const KvPages& pages, int n_kv, int head_dim) override {
    cuda::kv_store(ctx(), cache_k, cache_v, k, v, slot, pos, T, pages, n_kv, head_dim);
  }
  void attention_cached(void* out, const void* q, const void* cache_k, const void* cache_v, const std::int32_t* slot,
                        const std::int32_t* pos, int T, const KvPages& pages, int n_heads, int n_kv,
                        int head_dim, const AttentionOptions& opt = {}) override {
    cuda::attention_cached(ctx(), out, q, cache_k, cache_v, slot, pos, T, pages, n_heads, n_kv, head_dim, opt);
  }
  void gather_rows(void* dst, const void* src, const std::int32_t* idx, int n, int width) override {
    cuda::gather_rows(ctx(), dst, src, idx, n, width);
  }
  void scatter_rows(void* dst, const void* src, const std::int32_t* idx, int n, int width) override {
    cuda::scatter_rows(ctx(), dst, src, idx, n, width);
  }
  // The fused inference ops: one kernel for RoPE + KV store; the GEMV kernels (gemv.cu) where they take the call
  // (T <= 8 rows, aligned), else the composition of the base class.
  void rope_kv_store(void* q, void* k, const void* v, void* cache_k, void* cache_v, const std::int32_t* slot,
                     const std::int32_t* pos, const float* inv_freq, int T, const KvPages& pages, int n_heads,
                     int n_kv, int head_dim) override {
    cuda::rope_kv_store(ctx(), q, k, v, cache_k, cache_v, slot, pos, inv_freq, T, pages, n_heads, n_kv, head_dim);
  }
  void linear_group_forward(const LinearMember* m, int n, const void* x, int T, int in) override {
    if (!cuda::gemv_group(ctx(), m, n, x, T, in)) Ops::linear_group_forward(m, n, x, T, in);
  }
  void gated_mlp_forward(void* act, void* gate, void* up, const void* x, const void* Wg, const void* Wu, int T,
                         int in, int I, bool geglu) override {
    static const bool stacked = env::opt_in_logged(  // until a GPU has measured it
        "MGRL_GATE_UP_STACKED", "MGRL_GATE_UP_STACKED=1: gate and up as one GEMM beyond 8 rows, when stacked");
    if (cuda::gemv_gated(ctx(), act, x, Wg, Wu, T, in, I, geglu)) return;
    if (stacked && cuda::gated_mlp_stacked(ctx(), act, x, Wg, Wu, T, in, I, geglu)) return;
    Ops::gated_mlp_forward(act, gate, up, x, Wg, Wu, T, in, I, geglu);
  }
  bool rmsnorm_linear_group_forward(const LinearMember* m, int n, const void* x, const void* norm_w, float eps,
                                    bool unit_offset, int T, int in) override {
    return norm_w != nullptr && cuda::gemv_group(ctx(), m, n, x, T, in, norm_w, eps, unit_offset);
  }
  bool rmsnorm_gated_mlp_forward(void* act, const void* x, const void* norm_w, float eps, bool unit_offset,
                                 const void* Wg, const void* Wu, int T, int in, int I, bool geglu) override {
    return norm_w != nullptr && cuda::gemv_gated(ctx(), act, x, Wg, Wu, T, in, I, geglu, norm_w, eps, unit_offset);
  }
  bool rmsnorm_gated_mlp_fits(const void* x, const void* norm_w, const void* Wg, const void* Wu, int T, int in,
                              int I) const override {
    return norm_w != nullptr && cuda::gemv_gated_fits(x, Wg, Wu, T, in, I, norm_w);
  }
  void linear_residual_forward(void* y, const void* r, const void* x, const void* W, int T, int in, int out,
                               void* tmp) override {
    if (!cuda::gemv_residual(ctx(), y, r, x, W, T, in, out)) Ops::linear_residual_forward(y, r, x, W, T, in, out, tmp);
  }
  void sample(std::int32_t* tokens, float* logprobs, const float* logits, const std::uint64_t* seeds, int B, int V,
              const Sampling& params) override {
    cuda::sample(ctx(), tokens, logprobs, logits, seeds, B, V, params);
  }
  void repetition_penalty(float* out, const float* logits, const std::uint8_t* seen, const std::int32_t* seen_row,
                          int R, int V, float penalty) override {
    cuda::repetition_penalty(ctx(), out, logits, seen, seen_row, R, V, penalty);
  }
  void mark_seen(std::uint8_t* seen, const std::int32_t* seen_row, const std::int32_t* tokens, int R, int V) override {
    cuda::mark_seen(ctx(), seen, seen_row, tokens, R, V);
  }
  void token_logprobs(float* logprobs, const float* logits, const std::int32_t* tokens, int R, int V) override {
    cuda::token_logprobs(ctx(), logprobs, logits, tokens, R, V);
  }
  void decode_advance(std::int32_t* ids, std::int32_t* pos, std::int32_t* count, std::int32_t* done,
                      std::uint64_t* seeds, std::int32_t* ring_tokens, float* ring_logprobs, const std::int32_t* tokens,
                      const float* logprobs, const std::uint64_t* streams, const std::int32_t* eos, int n_eos,
                      int max_count, int R) override {
    cuda::decode_advance(ctx(), ids, pos, count, done, seeds, ring_tokens, ring_logprobs, tokens, logprobs, streams,
                         eos, n_eos, max_count, R);
  }
  double sum_squares(const float* x, std::size_t n) override {
    double* d = static_cast<double*>(cuda::scratch_alloc(sizeof(double), stream_));
    cuda::sum_squares(ctx(), d, x, n);
    double h = 0;
    CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    cuda::scratch_free(d, stream_);
    wait();
    check_device_errors();
    return h;
  }
  void weighted_sum_accumulate(double* acc, const float* x, const float* w, std::size_t n, double scale) override {
    cuda::weighted_sum_accumulate(ctx(), acc, x, w, n, scale);
  }
  void adamw(float* params, const float* grads, float* m, float* v, std::size_t n, const AdamW& hp) override {
    cuda::adamw(ctx(), params, grads, m, v, n, hp);
  }

  // ---- phase timing: CUDA events on the stream (and NVTX ranges); host waits on the host clock ----
  void phase_begin(Phase p) override { timer_->begin(p); }
  void phase_end(Phase p) override { timer_->end(p); }
  PhaseSeconds phase_seconds() override {
    timer_->collect(event_s_, true);
    PhaseSeconds s = phase_s_;
    for (int i = 0; i < kNumPhases; ++i) s[i] += event_s_[i];
    return s;
  }
  void phase_reset() override {
    timer_->reset();
    phase_s_ = {};
    event_s_ = {};
  }

  // ---- recorded op sequences: CUDA graphs captured from the stream (MGRL_CUDA_GRAPHS=0 turns them off) ----
  bool run_recorded(std::uint64_t key, const std::function<void()>& body) override {
    if (!graphs_enabled()) {
      body();
      return false;
    }
    auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
      return true;
    }
    if (graphs_.size() >= kMaxGraphs) forget_recordings();
    // Thread-local capture mode: only this thread's CUDA calls are checked against the capture (another thread's
    // legal synchronising call, e.g. a communicator's, does not invalidate it).
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      body();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(stream_, &broken);
      if (broken) (void)cudaGraphDestroy(broken);
      throw;
    }
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    // WithFlags: CUDA 11.4 to 13 (the 3-argument cudaGraphInstantiate is 12.0+; 11.8 builds for V100 need this).
    const cudaError_t e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    (void)cudaGraphDestroy(graph);
    CUDA_CHECK(e);
    graphs_.emplace(key, exec);
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    return false;
  }
  void forget_recordings() override {
    if (graphs_.empty()) return;
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // a replay in flight may still use the graphs' memory
    for (auto& [key, exec] : graphs_) (void)cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

 private:
  cuda::Ctx ctx() const { return cuda::Ctx{st_, stream_, blas_, err_, lt_}; }

  static bool graphs_enabled() {
    static const bool on = env::switch_on("MGRL_CUDA_GRAPHS");
    return on;
  }
  static constexpr std::size_t kMaxGraphs = 256;  // beyond this many keys, start over
  std::unordered_map<std::uint64_t, cudaGraphExec_t> graphs_;

  // The host blocks until the stream's work is done: counted as host wait.
  void wait() {
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    phase_add(Phase::HostWait, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }

  // Reads (and clears) the error word kernels set when they meet bad ids; call after a stream sync.
  void check_device_errors() {
    int bits = 0;
    CUDA_CHECK(cudaMemcpyAsync(&bits, err_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (bits == 0) return;
    CUDA_CHECK(cudaMemsetAsync(err_, 0, sizeof(int), stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::string what;
    if (bits & cuda::kErrTokenId) what += " a token id >= vocab size (embedding);";
    if (bits & cuda::kErrTargetId) what += " a target id >= vocab size (lm_head);";
    if (bits & cuda::kErrLength) what += " malformed cu_seqlens (attention);";
    if (bits & cuda::kErrCacheIndex) what += " a slot, position or row index out of range (KV cache);";
    MGRL_CHECK(bits == 0, "CUDA kernels met invalid input since the last synchronisation:" + what);
  }

  DType st_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cuda::LtState* lt_ = nullptr;  // cuBLASLt for the biased GEMMs (null: switched off)
  std::unique_ptr<cuda::PhaseTimer> timer_;
  PhaseSeconds event_s_{};
  int* err_ = nullptr;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(int device, DType storage) {
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  MGRL_CHECK(device >= 0 && device < count,
             "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " visible)");
  MGRL_CHECK(storage == DType::BF16 || storage == DType::F16,
             std::string("the CUDA backend stores bf16 or f16, not ") + dtype_name(storage));
  int major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MGRL_CHECK(storage != DType::BF16 || major >= 8,
             "bf16 storage needs compute capability 8.0 or newer (device " + std::to_string(device) + " is " +
                 std::to_string(major) + ".x)");
  return std::make_unique<CudaOps>(device, storage);
}

const char* cuda_attention_kernels(DType storage, int head_dim) {
  return cuda::attention_kernels_name(cuda::attention_kernels(storage, head_dim, {}));
}

std::unique_ptr<Ops> make_cuda_ops(int device) {
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  MGRL_CHECK(device >= 0 && device < count,
             "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " visible)");
  int major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return make_cuda_ops(device, major >= 8 ? DType::BF16 : DType::F16);
}

}  // namespace mgrl::kernels
