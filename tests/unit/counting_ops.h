// counting_ops.h: a backend (the CPU one unless told) wrapped in an Ops that counts the calls of each op by name (the
// memory ops and sum_squares are not counted), so that a test can show which ops a forward takes (test_fused_norm.cpp,
// test_decode_fused.cpp). The fused inference ops count as one call each (the wrapped backend runs them, the CPU
// backend as their composition, unseen by the counts); with compose_fused they run as the composition of this
// wrapper's ops instead (Ops' defaults), which makes a CUDA backend run its separate ops (test_model_cuda.cpp).
// Recordings (run_recorded) are not forwarded: the wrapper runs every op as it comes. With fold_norms the ops that fold
// an RMSNorm into the product after it (Ops::rmsnorm_linear_group_forward, rmsnorm_gated_mlp_forward), which the CPU
// backend declines, are taken here as the wrapped backend's norm and op on a scratch copy of h: the engine's wiring
// of them runs on the CPU, with the bits of the separate ops (test_decode_fused.cpp).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "kernels/ops.h"

namespace mgrl::test {

class CountingOps final : public kernels::Ops {
 public:
  explicit CountingOps(std::unique_ptr<kernels::Ops> inner = kernels::make_cpu_ops(), bool compose = false)
      : in(std::move(inner)), compose_fused(compose) {}
  ~CountingOps() override {
    for (void* p : scratch_) in->release(p);
  }
  std::unique_ptr<kernels::Ops> in;
  bool compose_fused;
  bool fold_norms = false;
  std::map<std::string, int> calls;
  // The calls f makes (counted from zero; calls is left empty).
  template <class F>
  std::map<std::string, int> count(F&& f) {
    calls.clear();
    f();
    return std::exchange(calls, {});
  }

  const char* name() const override { return in->name(); }
  DType storage() const override { return in->storage(); }
  void* alloc(std::size_t b) override { return in->alloc(b); }
  std::size_t available_memory() const override { return in->available_memory(); }
  void release(void* p) override { in->release(p); }
  void upload(void* d, const void* h, std::size_t b) override { in->upload(d, h, b); }
  void download(void* h, const void* s, std::size_t b) override { in->download(h, s, b); }
  void copy(void* d, const void* s, std::size_t b) override { in->copy(d, s, b); }
  void zero(void* p, std::size_t b) override { in->zero(p, b); }
  void upload_f32_as_storage(void* d, const float* h, std::size_t n) override { in->upload_f32_as_storage(d, h, n); }
  void download_storage_as_f32(float* h, const void* s, std::size_t n) override {
    in->download_storage_as_f32(h, s, n);
  }
  void f32_to_storage(void* d, const float* s, std::size_t n) override { in->f32_to_storage(d, s, n); }
  void synchronize() override { in->synchronize(); }
  kernels::DeviceStream device_stream() const override { return in->device_stream(); }
  void set_batch_invariant(bool on) override { in->set_batch_invariant(on); }

  void embedding_forward(void* out, const std::int32_t* ids, const void* table, int T, int V, int D,
                         float scale) override {
    ++calls["embedding_forward"];
    in->embedding_forward(out, ids, table, T, V, D, scale);
  }
  void embedding_backward(float* dt, const void* dout, const std::int32_t* ids, int T, int V, int D,
                          float scale) override {
    ++calls["embedding_backward"];
    in->embedding_backward(dt, dout, ids, T, V, D, scale);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int rows, int dim, float eps,
                       bool unit) override {
    ++calls["rmsnorm_forward"];
    in->rmsnorm_forward(out, rstd, x, w, rows, dim, eps, unit);
  }
  void rmsnorm_backward(void* dx, float* dw, const void* dout, const void* x, const void* w, const float* rstd,
                        int rows, int dim, bool acc, bool unit) override {
    ++calls["rmsnorm_backward"];
    in->rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, dim, acc, unit);
  }
  void residual_rmsnorm_forward(void* x_out, void* h, float* rstd, const void* x_in, const void* y, const void* w,
                                int rows, int dim, float eps, bool unit) override {
    ++calls["residual_rmsnorm_forward"];
    in->residual_rmsnorm_forward(x_out, h, rstd, x_in, y, w, rows, dim, eps, unit);
  }
  void linear_forward(void* y, const void* x, const void* W, const void* b, int T, int i, int o) override {
    ++calls["linear_forward"];
    in->linear_forward(y, x, W, b, T, i, o);
  }
  void linear_backward(void* dx, float* dW, float* db, const void* dy, const void* x, const void* W, int T, int i,
                       int o, bool acc) override {
    ++calls["linear_backward"];
    in->linear_backward(dx, dW, db, dy, x, W, T, i, o, acc);
  }
  void lora_forward(void* y, float* xa, const void* x, const float* A, const float* B, float s, int T, int i, int r,
                    int o) override {
    ++calls["lora_forward"];
    in->lora_forward(y, xa, x, A, B, s, T, i, r, o);
  }
  void lora_backward(void* dx, float* dA, float* dB, const void* dy, const void* x, const float* xa, const float* A,
                     const float* B, float s, int T, int i, int r, int o, float* scratch) override {
    ++calls["lora_backward"];
    in->lora_backward(dx, dA, dB, dy, x, xa, A, B, s, T, i, r, o, scratch);
  }
  void lora_merge(void* Wm, const void* W, const float* A, const float* B, float scale, int out, int in_,
                  int r) override {
    ++calls["lora_merge"];
    in->lora_merge(Wm, W, A, B, scale, out, in_, r);
  }
  void lora_group_forward(const kernels::LoraMember* g, int n, const void* x, int T, int i, int r,
                          float* scratch) override {
    ++calls["lora_group_forward"];
    in->lora_group_forward(g, n, x, T, i, r, scratch);
  }
  // The linears of a group and their adapters as one op (Ops::linear_lora_group_forward): declined in the
  // composition, else the inner backend's answer, counted when taken (a test can then tell that the path ran).
  bool linear_lora_group_forward(const LinearMember* m, const kernels::LoraMember* g, int n, const void* x, int T,
                                 int i, int r) override {
    if (compose_fused) return false;
    const bool took = in->linear_lora_group_forward(m, g, n, x, T, i, r);
    if (took) ++calls["linear_lora_group_forward"];
    return took;
  }
  void lora_group_backward(void* dx, const kernels::LoraMember* g, int n, const void* x, int T, int i, int r,
                           float* scratch) override {
    ++calls["lora_group_backward"];
    in->lora_group_backward(dx, g, n, x, T, i, r, scratch);
  }
  void dropout(void* out, const void* x, int rows, int cols, float p, std::uint64_t seed,
               const std::uint64_t* row_keys) override {
    ++calls["dropout"];
    in->dropout(out, x, rows, cols, p, seed, row_keys);
  }
  void add_uniform_noise(void* x, int rows, int cols, const float* row_scale, std::uint64_t seed,
                         const std::uint64_t* row_keys) override {
    ++calls["add_uniform_noise"];
    in->add_uniform_noise(x, rows, cols, row_scale, seed, row_keys);
  }
  void rope_forward(void* x, const std::int32_t* pos, const float* f, int T, int h, int d) override {
    ++calls["rope_forward"];
    in->rope_forward(x, pos, f, T, h, d);
  }
  void rope_backward(void* dx, const std::int32_t* pos, const float* f, int T, int h, int d) override {
    ++calls["rope_backward"];
    in->rope_backward(dx, pos, f, T, h, d);
  }
  void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, const std::int32_t* cu,
                         int B, int T, int L, int h, int kv, int d, const kernels::AttentionOptions& opt) override {
    ++calls["attention_forward"];
    in->attention_forward(out, lse, q, k, v, cu, B, T, L, h, kv, d, opt);
  }
  void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const void* q,
                          const void* k, const void* v, const float* lse, const std::int32_t* cu, int B, int T, int L,
                          int h, int kv, int d, const kernels::AttentionOptions& opt) override {
    ++calls["attention_backward"];
    in->attention_backward(dq, dk, dv, dout, out, q, k, v, lse, cu, B, T, L, h, kv, d, opt);
  }
  void dequantize_nf4(void* dst, const kernels::Nf4Weight& w, std::int64_t b, std::int64_t e) override {
    ++calls["dequantize_nf4"];
    in->dequantize_nf4(dst, w, b, e);
  }
  void swiglu_forward(void* out, const void* g, const void* u, std::int64_t n) override {
    ++calls["swiglu_forward"];
    in->swiglu_forward(out, g, u, n);
  }
  void swiglu_backward(void* dg, void* du, const void* dout, const void* g, const void* u, std::int64_t n) override {
    ++calls["swiglu_backward"];
    in->swiglu_backward(dg, du, dout, g, u, n);
  }
  void geglu_forward(void* out, const void* g, const void* u, std::int64_t n) override {
    ++calls["geglu_forward"];
    in->geglu_forward(out, g, u, n);
  }
  void geglu_backward(void* dg, void* du, const void* dout, const void* g, const void* u, std::int64_t n) override {
    ++calls["geglu_backward"];
    in->geglu_backward(dg, du, dout, g, u, n);
  }
  void residual_forward(void* x, const void* y, std::int64_t n) override {
    ++calls["residual_forward"];
    in->residual_forward(x, y, n);
  }
  void residual_add(void* out, const void* a, const void* b, std::int64_t n) override {
    ++calls["residual_add"];
    in->residual_add(out, a, b, n);
  }
  std::size_t lm_head_scratch_bytes(int V) const override { return in->lm_head_scratch_bytes(V); }
  void lm_head_logprob_forward(float* lp, float* lse, const void* h, const void* W, const std::int32_t* t, int T,
                               int D, int V, float ls, void* scratch, float cap, float* stats) override {
    ++calls["lm_head_logprob_forward"];
    in->lm_head_logprob_forward(lp, lse, h, W, t, T, D, V, ls, scratch, cap, stats);
  }
  void lm_head_logprob_backward(void* dh, float* dW, const float* wt, const void* h, const void* W,
                                const std::int32_t* t, const float* lse, int T, int D, int V, float ls, void* scratch,
                                float cap, const float* ent_w, const float* ent) override {
    ++calls["lm_head_logprob_backward"];
    in->lm_head_logprob_backward(dh, dW, wt, h, W, t, lse, T, D, V, ls, scratch, cap, ent_w, ent);
  }
  void lm_head_logprob_forward_backward(float* lp, float* lse, void* dh, float* dW, const float* wt, const void* h,
                                        const void* W, const std::int32_t* t, int T, int D, int V, float ls,
                                        void* scratch, float cap, float* stats) override {
    ++calls["lm_head_logprob_forward_backward"];
    in->lm_head_logprob_forward_backward(lp, lse, dh, dW, wt, h, W, t, T, D, V, ls, scratch, cap, stats);
  }
  void lm_head_logits(float* logits, const void* h, const void* W, int T, int D, int V, float ls,
                      float cap) override {
    ++calls["lm_head_logits"];
    in->lm_head_logits(logits, h, W, T, D, V, ls, cap);
  }
  void lm_head_divergence(float* div, float* ent, void* dh, float* dW, const float* w, const void* h, const void* W,
                          int T, int D, int V, float ls, float cap, const void* th, const void* tW, int Dt, float tls,
                          float tcap, float beta) override {
    ++calls["lm_head_divergence"];
    in->lm_head_divergence(div, ent, dh, dW, w, h, W, T, D, V, ls, cap, th, tW, Dt, tls, tcap, beta);
  }
  void kv_store(void* ck, void* cv, const void* k, const void* v, const std::int32_t* slot, const std::int32_t* pos,
                int T, const kernels::KvPages& pages, int kv, int d) override {
    ++calls["kv_store"];
    in->kv_store(ck, cv, k, v, slot, pos, T, pages, kv, d);
  }
  void attention_cached(void* out, const void* q, const void* ck, const void* cv, const std::int32_t* slot,
                        const std::int32_t* pos, int T, const kernels::KvPages& pages, int h, int kv, int d,
                        const kernels::AttentionOptions& opt) override {
    ++calls["attention_cached"];
    in->attention_cached(out, q, ck, cv, slot, pos, T, pages, h, kv, d, opt);
  }
  void gather_rows(void* dst, const void* src, const std::int32_t* idx, int n, int width) override {
    ++calls["gather_rows"];
    in->gather_rows(dst, src, idx, n, width);
  }
  void scatter_rows(void* dst, const void* src, const std::int32_t* idx, int n, int width) override {
    ++calls["scatter_rows"];
    in->scatter_rows(dst, src, idx, n, width);
  }
  void sample(std::int32_t* tokens, float* lp, const float* logits, const std::uint64_t* seeds, int B, int V,
              const Sampling& p) override {
    ++calls["sample"];
    in->sample(tokens, lp, logits, seeds, B, V, p);
  }
  void repetition_penalty(float* out, const float* logits, const std::uint8_t* seen, const std::int32_t* seen_row,
                          int R, int V, float penalty) override {
    ++calls["repetition_penalty"];
    in->repetition_penalty(out, logits, seen, seen_row, R, V, penalty);
  }
  void mark_seen(std::uint8_t* seen, const std::int32_t* seen_row, const std::int32_t* tokens, int R, int V) override {
    ++calls["mark_seen"];
    in->mark_seen(seen, seen_row, tokens, R, V);
  }
  void token_logprobs(float* lp, const float* logits, const std::int32_t* tokens, int R, int V) override {
    ++calls["token_logprobs"];
    in->token_logprobs(lp, logits, tokens, R, V);
  }
  void decode_advance(std::int32_t* ids, std::int32_t* pos, std::int32_t* count, std::int32_t* done,
                      std::uint64_t* seeds, std::int32_t* rt, float* rl, const std::int32_t* tokens, const float* lp,
                      const std::uint64_t* streams, const std::int32_t* eos, int n_eos, int max_count,
                      int R) override {
    ++calls["decode_advance"];
    in->decode_advance(ids, pos, count, done, seeds, rt, rl, tokens, lp, streams, eos, n_eos, max_count, R);
  }
  void rope_kv_store(void* q, void* k, const void* v, void* ck, void* cv, const std::int32_t* slot,
                     const std::int32_t* pos, const float* f, int T, const kernels::KvPages& pages, int h, int kv,
                     int d) override {
    ++calls["rope_kv_store"];
    if (compose_fused)
      Ops::rope_kv_store(q, k, v, ck, cv, slot, pos, f, T, pages, h, kv, d);
    else
      in->rope_kv_store(q, k, v, ck, cv, slot, pos, f, T, pages, h, kv, d);
  }
  void linear_group_forward(const LinearMember* m, int n, const void* x, int T, int i) override {
    ++calls["linear_group_forward"];
    if (compose_fused)
      Ops::linear_group_forward(m, n, x, T, i);
    else
      in->linear_group_forward(m, n, x, T, i);
  }
  void gated_mlp_forward(void* act, void* g, void* u, const void* x, const void* Wg, const void* Wu, int T, int i,
                         int I, bool geglu) override {
    ++calls["gated_mlp_forward"];
    if (compose_fused)
      Ops::gated_mlp_forward(act, g, u, x, Wg, Wu, T, i, I, geglu);
    else
      in->gated_mlp_forward(act, g, u, x, Wg, Wu, T, i, I, geglu);
  }
  void linear_residual_forward(void* y, const void* r, const void* x, const void* W, int T, int i, int o,
                               void* tmp) override {
    ++calls["linear_residual_forward"];
    if (compose_fused)
      Ops::linear_residual_forward(y, r, x, W, T, i, o, tmp);
    else
      in->linear_residual_forward(y, r, x, W, T, i, o, tmp);
  }
  // The norm-folding decode ops: declined in the composition (the block then runs the norm and the op); with
  // fold_norms the inner backend's norm and op on scratch; else the inner backend's answer (counted when taken).
  bool rmsnorm_linear_group_forward(const LinearMember* m, int n, const void* x, const void* nw, float eps, bool unit,
                                    int T, int i) override {
    if (compose_fused) return false;
    bool took = true;
    if (fold_norms) {
      void* h = scratch(0, static_cast<std::size_t>(T) * i * in->storage_size());
      in->rmsnorm_forward(h, static_cast<float*>(scratch(1, static_cast<std::size_t>(T) * 4)), x, nw, T, i, eps, unit);
      in->linear_group_forward(m, n, h, T, i);
    } else {
      took = in->rmsnorm_linear_group_forward(m, n, x, nw, eps, unit, T, i);
    }
    if (took) ++calls["rmsnorm_linear_group_forward"];
    return took;
  }
  bool rmsnorm_gated_mlp_forward(void* act, const void* x, const void* nw, float eps, bool unit, const void* Wg,
                                 const void* Wu, int T, int i, int I, bool geglu) override {
    if (compose_fused) return false;
    bool took = true;
    if (fold_norms) {
      const std::size_t S = in->storage_size();
      void* h = scratch(0, static_cast<std::size_t>(T) * i * S);
      in->rmsnorm_forward(h, static_cast<float*>(scratch(1, static_cast<std::size_t>(T) * 4)), x, nw, T, i, eps, unit);
      in->gated_mlp_forward(act, scratch(2, static_cast<std::size_t>(T) * I * S),
                            scratch(3, static_cast<std::size_t>(T) * I * S), h, Wg, Wu, T, i, I, geglu);
    } else {
      took = in->rmsnorm_gated_mlp_forward(act, x, nw, eps, unit, Wg, Wu, T, i, I, geglu);
    }
    if (took) ++calls["rmsnorm_gated_mlp_forward"];
    return took;
  }
  bool rmsnorm_gated_mlp_fits(const void* x, const void* nw, const void* Wg, const void* Wu, int T, int i,
                              int I) const override {
    return !compose_fused && (fold_norms || in->rmsnorm_gated_mlp_fits(x, nw, Wg, Wu, T, i, I));
  }
  double sum_squares(const float* x, std::size_t n) override { return in->sum_squares(x, n); }

 private:
  // Scratch buffer k (0: h, 1: rstd, 2 and 3: gate and up) of at least `bytes`, kept and grown.
  void* scratch(int k, std::size_t bytes) {
    if (scratch_bytes_[k] < bytes) {
      if (scratch_[k]) in->release(scratch_[k]);
      scratch_[k] = in->alloc(bytes);
      scratch_bytes_[k] = bytes;
    }
    return scratch_[k];
  }
  void* scratch_[4] = {};
  std::size_t scratch_bytes_[4] = {};

 public:
  void weighted_sum_accumulate(double* acc, const float* x, const float* w, std::size_t n, double s) override {
    ++calls["weighted_sum_accumulate"];
    in->weighted_sum_accumulate(acc, x, w, n, s);
  }
  void adamw(float* p, const float* g, float* m, float* v, std::size_t n, const AdamW& hp) override {
    ++calls["adamw"];
    in->adamw(p, g, m, v, n, hp);
  }
};

}  // namespace mgrl::test
