// cpu_ops.cpp: the CPU backend of the op interface (kernels/ops.h): fp32 storage, host memory,
// each op delegating to its kernels/cpu reference implementation.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kv_cache.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/lm_head.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/ops.h"

namespace mgrl::kernels {
namespace {

inline float* F(void* p) { return static_cast<float*>(p); }
inline const float* F(const void* p) { return static_cast<const float*>(p); }

class CpuOps final : public Ops {
 public:
  const char* name() const override { return "cpu"; }
  DType storage() const override { return DType::F32; }

  void* alloc(std::size_t bytes) override {
    void* p = std::calloc(bytes ? bytes : 1, 1);
    if (!p) throw OutOfMemory("out of host memory allocating " + std::to_string(bytes) + " bytes");
    return p;
  }
  void release(void* p) override { std::free(p); }
  std::size_t available_memory() const override {
    std::uint64_t avail = 0;
    {
      std::ifstream f("/proc/meminfo");
      std::string key;
      std::uint64_t kib = 0;
      std::string unit;
      while (f >> key >> kib >> unit)
        if (key == "MemAvailable:") {
          avail = kib * 1024;
          break;
        }
    }
    // cgroup v2: a memory limit below what the machine has (containers, SLURM jobs).
    std::ifstream mx("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
    std::string limit;
    std::uint64_t used = 0;
    if (mx >> limit && limit != "max" && cur >> used) {
      const std::uint64_t lim = std::stoull(limit);
      const std::uint64_t left = lim > used ? lim - used : 0;
      if (avail == 0 || left < avail) avail = left;
    }
    return static_cast<std::size_t>(avail);
  }
  void upload(void* dst, const void* host, std::size_t bytes) override { copy(dst, host, bytes); }
  void download(void* host, const void* src, std::size_t bytes) override { copy(host, src, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void zero(void* p, std::size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void upload_f32_as_storage(void* dst, const float* host, std::size_t n) override { copy(dst, host, n * 4); }
  void download_storage_as_f32(float* host, const void* src, std::size_t n) override { copy(host, src, n * 4); }
  void f32_to_storage(void* dst, const float* src, std::size_t n) override { copy(dst, src, n * 4); }
  void synchronize() override {}
  void set_batch_invariant(bool on) override { cpu::set_batch_invariant(on); }

  void embedding_forward(void* out, const std::int32_t* ids, const void* table, int T, int V, int D,
                         float scale = 1.0f) override {
    cpu::embedding_forward(F(out), ids, F(table), T, V, D, scale);
  }
  void embedding_backward(float* dtable, const void* dout, const std::int32_t* ids, int T, int V, int D,
                          float scale = 1.0f) override {
    cpu::embedding_backward(dtable, F(dout), ids, T, V, D, scale);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int rows, int dim, float eps,
                       bool unit_offset = false) override {
    cpu::rmsnorm_forward(F(out), rstd, F(x), F(w), rows, dim, eps, unit_offset);
  }
  void rmsnorm_backward(void* dx, float* dw, const void* dout, const void* x, const void* w, const float* rstd,
                        int rows, int dim, bool accumulate, bool unit_offset = false) override {
    cpu::rmsnorm_backward(F(dx), dw, F(dout), F(x), F(w), rstd, rows, dim, accumulate, unit_offset);
  }
  void residual_rmsnorm_forward(void* x_out, void* h, float* rstd, const void* x_in, const void* y, const void* w,
                                int rows, int dim, float eps, bool unit_offset = false) override {
    cpu::residual_rmsnorm_forward(F(x_out), F(h), rstd, F(x_in), F(y), F(w), rows, dim, eps, unit_offset);
  }
  void linear_forward(void* y, const void* x, const void* W, const void* bias, int T, int in, int out) override {
    cpu::linear_forward(F(y), F(x), F(W), F(bias), T, in, out);
  }
  void linear_backward(void* dx, float* dW, float* dbias, const void* dy, const void* x, const void* W, int T, int in,
                       int out, bool accumulate_dx) override {
    cpu::linear_backward(F(dx), dW, dbias, F(dy), F(x), F(W), T, in, out, accumulate_dx);
  }
  void lora_forward(void* y, float* xa, const void* x, const float* A, const float* B, float scale, int T, int in,
                    int r, int out) override {
    cpu::lora_forward(F(y), xa, F(x), A, B, scale, T, in, r, out);
  }
  void lora_backward(void* dx, float* dA, float* dB, const void* dy, const void* x, const float* xa, const float* A,
                     const float* B, float scale, int T, int in, int r, int out, float* scratch) override {
    cpu::lora_backward(F(dx), dA, dB, F(dy), F(x), xa, A, B, scale, T, in, r, out, scratch);
  }
  void lora_merge(void* Wm, const void* W, const float* A, const float* B, float scale, int out, int in,
                  int r) override {
    cpu::lora_merge(F(Wm), F(W), A, B, scale, out, in, r);
  }
  void lora_group_forward(const LoraMember* g, int n, const void* x, int T, int in, int r, float* scratch) override {
    cpu::lora_group_forward(g, n, F(x), T, in, r, scratch);
  }
  void lora_group_backward(void* dx, const LoraMember* g, int n, const void* x, int T, int in, int r,
                           float* scratch) override {
    cpu::lora_group_backward(F(dx), g, n, F(x), T, in, r, scratch);
  }
  void dropout(void* out, const void* x, int rows, int cols, float p, std::uint64_t seed,
               const std::uint64_t* row_keys) override {
    const float keep_scale = 1.0f / (1.0f - p);
    for (int t = 0; t < rows; ++t) {
      const std::uint64_t row_seed = random_bits(seed, row_keys[t]);
      const std::size_t r0 = static_cast<std::size_t>(t) * static_cast<std::size_t>(cols);
      for (int j = 0; j < cols; ++j)
        F(out)[r0 + j] = dropout_keep(row_seed, static_cast<std::uint64_t>(j), p) ? F(x)[r0 + j] * keep_scale : 0.0f;
    }
  }
  void add_uniform_noise(void* x, int rows, int cols, const float* row_scale, std::uint64_t seed,
                         const std::uint64_t* row_keys) override {
    for (int t = 0; t < rows; ++t) {
      const std::uint64_t row_seed = random_bits(seed, row_keys[t]);
      float* r = F(x) + static_cast<std::size_t>(t) * static_cast<std::size_t>(cols);
      for (int j = 0; j < cols; ++j) r[j] += row_scale[t] * noise_uniform(row_seed, static_cast<std::uint64_t>(j));
    }
  }
  void rope_forward(void* x, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                    int head_dim) override {
    cpu::rope_forward(F(x), pos, inv_freq, T, n_heads, head_dim);
  }
  void rope_backward(void* dx, const std::int32_t* pos, const float* inv_freq, int T, int n_heads,
                     int head_dim) override {
    cpu::rope_backward(F(dx), pos, inv_freq, T, n_heads, head_dim);
  }
  void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                         const std::int32_t* cu_seqlens, int B, int T, int max_len, int n_heads, int n_kv,
                         int head_dim, const AttentionOptions& opt = {}) override {
    cpu::attention_forward(F(out), lse, F(q), F(k), F(v), cu_seqlens, B, T, max_len, n_heads, n_kv, head_dim, opt);
  }
  void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* /*out*/, const void* q,
                          const void* k, const void* v, const float* lse, const std::int32_t* cu_seqlens, int B,
                          int T, int max_len, int n_heads, int n_kv, int head_dim,
                          const AttentionOptions& opt = {}) override {
    cpu::attention_backward(F(dq), F(dk), F(dv), F(dout), F(q), F(k), F(v), lse, cu_seqlens, B, T, max_len, n_heads,
                            n_kv, head_dim, opt);
  }
  void dequantize_nf4(void* dst, const Nf4Weight& w, std::int64_t begin, std::int64_t end) override {
    if (end <= begin) return;
    if (w.absmax) {
      cpu::nf4_dequantize_range(w.codes, w.absmax, w.code, begin, end, F(dst));
      return;
    }
    // double-quantized: the absmax of the blocks the range touches, then the codes
    // (from the start of the nested block holding the first one: nested_absmax is indexed by block / 256)
    const std::int64_t b0 = begin / cpu::kNf4Block / cpu::kNf4NestedBlock * cpu::kNf4NestedBlock;
    const std::int64_t b1 = (end - 1) / cpu::kNf4Block + 1;
    nf4_absmax_.resize(static_cast<std::size_t>(b1));
    cpu::nf4_absmax_dequantize(w.qabsmax + b0, w.nested_absmax + b0 / cpu::kNf4NestedBlock, w.offset, w.nested_code,
                               b1 - b0, nf4_absmax_.data() + b0);
    cpu::nf4_dequantize_range(w.codes, nf4_absmax_.data(), w.code, begin, end, F(dst));
  }
  void swiglu_forward(void* out, const void* gate, const void* up, std::int64_t n) override {
    cpu::swiglu_forward(F(out), F(gate), F(up), n);
  }
  void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                       std::int64_t n) override {
    cpu::swiglu_backward(F(dgate), F(dup), F(dout), F(gate), F(up), n);
  }
  void geglu_forward(void* out, const void* gate, const void* up, std::int64_t n) override {
    cpu::geglu_forward(F(out), F(gate), F(up), n);
  }
  void geglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                      std::int64_t n) override {
    cpu::geglu_backward(F(dgate), F(dup), F(dout), F(gate), F(up), n);
  }
  void residual_forward(void* x, const void* y, std::int64_t n) override { cpu::residual_forward(F(x), F(y), n); }
  void residual_add(void* out, const void* a, const void* b, std::int64_t n) override {
    cpu::residual_add(F(out), F(a), F(b), n);
  }
  std::size_t lm_head_scratch_bytes(int V) const override {
    return static_cast<std::size_t>(cpu::lm_head_scratch_floats(V)) * sizeof(float);
  }
  void lm_head_logprob_forward(float* logprob, float* lse, const void* h, const void* W, const std::int32_t* targets,
                               int T, int D, int V, float logit_scale, void* scratch, float softcap = 0.0f,
                               float* stats = nullptr) override {
    cpu::lm_head_logprob_forward(logprob, lse, F(h), F(W), targets, T, D, V, logit_scale, F(scratch), softcap, stats);
  }
  void lm_head_logprob_backward(void* dh, float* dW, const float* weights, const void* h, const void* W,
                                const std::int32_t* targets, const float* lse, int T, int D, int V, float logit_scale,
                                void* scratch, float softcap = 0.0f, const float* entropy_weights = nullptr,
                                const float* entropy = nullptr) override {
    cpu::lm_head_logprob_backward(F(dh), dW, weights, F(h), F(W), targets, lse, T, D, V, logit_scale, F(scratch),
                                  softcap, entropy_weights, entropy);
  }
  void lm_head_logprob_forward_backward(float* logprob, float* lse, void* dh, float* dW, const float* weights,
                                        const void* h, const void* W, const std::int32_t* targets, int T, int D, int V,
                                        float logit_scale, void* scratch, float softcap = 0.0f,
                                        float* stats = nullptr) override {
    cpu::lm_head_logprob_forward_backward(logprob, lse, F(dh), dW, weights, F(h), F(W), targets, T, D, V, logit_scale,
                                          F(scratch), softcap, stats);
  }
  void lm_head_logits(float* logits, const void* h, const void* W, int T, int D, int V, float logit_scale,
                      float softcap = 0.0f) override {
    cpu::lm_head_logits(logits, F(h), F(W), T, D, V, logit_scale, softcap);
  }
  void lm_head_divergence(float* div, float* entropy, void* dh, float* dW, const float* weights, const void* h,
                          const void* W, int T, int D, int V, float logit_scale, float softcap, const void* th,
                          const void* tW, int Dt, float t_logit_scale, float t_softcap, float beta) override {
    cpu::lm_head_divergence(div, entropy, F(dh), dW, weights, F(h), F(W), T, D, V, logit_scale, softcap, F(th), F(tW),
                            Dt, t_logit_scale, t_softcap, beta, nullptr);
  }
  void kv_store(void* cache_k, void* cache_v, const void* k, const void* v, const std::int32_t* slot,
                const std::int32_t* pos, int T, const KvPages& pages, int n_kv, int head_dim) override {
    cpu::kv_store(F(cache_k), F(cache_v), F(k), F(v), slot, pos, T, pages, n_kv, head_dim);
  }
  void attention_cached(void* out, const void* q, const void* cache_k, const void* cache_v, const std::int32_t* slot,
                        const std::int32_t* pos, int T, const KvPages& pages, int n_heads, int n_kv,
                        int head_dim, const AttentionOptions& opt = {}) override {
    cpu::attention_cached(F(out), F(q), F(cache_k), F(cache_v), slot, pos, T, pages, n_heads, n_kv, head_dim, opt);
  }
  void gather_rows(void* dst, const void* src, const std::int32_t* idx, int n, int width) override {
    cpu::gather_rows(F(dst), F(src), idx, n, width);
  }
  void scatter_rows(void* dst, const void* src, const std::int32_t* idx, int n, int width) override {
    cpu::scatter_rows(F(dst), F(src), idx, n, width);
  }
  void sample(std::int32_t* tokens, float* logprobs, const float* logits, const std::uint64_t* seeds, int B, int V,
              const Sampling& params) override {
    cpu::sample(tokens, logprobs, logits, seeds, B, V, params);
  }
  void repetition_penalty(float* out, const float* logits, const std::uint8_t* seen, const std::int32_t* seen_row,
                          int R, int V, float penalty) override {
    cpu::repetition_penalty(out, logits, seen, seen_row, R, V, penalty);
  }
  void mark_seen(std::uint8_t* seen, const std::int32_t* seen_row, const std::int32_t* tokens, int R, int V) override {
    cpu::mark_seen(seen, seen_row, tokens, R, V);
  }
  void token_logprobs(float* logprobs, const float* logits, const std::int32_t* tokens, int R, int V) override {
    cpu::token_logprobs(logprobs, logits, tokens, R, V);
  }
  void decode_advance(std::int32_t* ids, std::int32_t* pos, std::int32_t* count, std::int32_t* done,
                      std::uint64_t* seeds, std::int32_t* ring_tokens, float* ring_logprobs, const std::int32_t* tokens,
                      const float* logprobs, const std::uint64_t* streams, const std::int32_t* eos, int n_eos,
                      int max_count, int R) override {
    cpu::decode_advance(ids, pos, count, done, seeds, ring_tokens, ring_logprobs, tokens, logprobs, streams, eos, n_eos,
                        max_count, R);
  }
  double sum_squares(const float* x, std::size_t n) override { return cpu::sum_squares(x, n); }
  void weighted_sum_accumulate(double* acc, const float* x, const float* w, std::size_t n, double scale) override {
    cpu::weighted_sum_accumulate(acc, x, w, n, scale);
  }
  void adamw(float* params, const float* grads, float* m, float* v, std::size_t n, const AdamW& hp) override {
    cpu::adamw(params, grads, m, v, n, hp);
  }

 private:
  std::vector<float> nf4_absmax_;  // dequantize_nf4: the dequantized absmax of a double-quantized weight
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops() { return std::make_unique<CpuOps>(); }

}  // namespace mgrl::kernels
