// test_fused_norm.cpp: the decoder block really takes the fused residual + RMSNorm ops (Ops::residual_rmsnorm_forward,
// Ops::residual_add) when MGRL_FUSED_NORM is not 0, and the separate copy / residual_forward / rmsnorm_forward when it
// is: the CPU backend wrapped in an Ops that counts the calls, through the training forward and the inference engine,
// on a Llama-like and a Gemma 3 fixture model (post-norms). Registered twice in tests/CMakeLists.txt: the Fused test
// with the switch unset, the Unfused test with MGRL_FUSED_NORM=0 (each fails in the other setting).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "model/block.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

namespace mgrl::model {
namespace {

const std::string kData = MGRL_TEST_DATA_DIR "/models/";

// The CPU backend with a count per op name of the calls the block's residual path can make.
class CountingOps final : public kernels::Ops {
 public:
  std::unique_ptr<kernels::Ops> in = kernels::make_cpu_ops();
  std::map<std::string, int> calls;

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
  void set_batch_invariant(bool on) override { in->set_batch_invariant(on); }

  void embedding_forward(void* out, const std::int32_t* ids, const void* table, int T, int V, int D,
                         float scale) override {
    in->embedding_forward(out, ids, table, T, V, D, scale);
  }
  void embedding_backward(float* dt, const void* dout, const std::int32_t* ids, int T, int V, int D,
                          float scale) override {
    in->embedding_backward(dt, dout, ids, T, V, D, scale);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int rows, int dim, float eps,
                       bool unit) override {
    ++calls["rmsnorm_forward"];
    in->rmsnorm_forward(out, rstd, x, w, rows, dim, eps, unit);
  }
  void rmsnorm_backward(void* dx, float* dw, const void* dout, const void* x, const void* w, const float* rstd,
                        int rows, int dim, bool acc, bool unit) override {
    in->rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, dim, acc, unit);
  }
  void residual_rmsnorm_forward(void* x_out, void* h, float* rstd, const void* x_in, const void* y, const void* w,
                                int rows, int dim, float eps, bool unit) override {
    ++calls["residual_rmsnorm_forward"];
    in->residual_rmsnorm_forward(x_out, h, rstd, x_in, y, w, rows, dim, eps, unit);
  }
  void linear_forward(void* y, const void* x, const void* W, const void* b, int T, int i, int o) override {
    in->linear_forward(y, x, W, b, T, i, o);
  }
  void linear_backward(void* dx, float* dW, float* db, const void* dy, const void* x, const void* W, int T, int i,
                       int o, bool acc) override {
    in->linear_backward(dx, dW, db, dy, x, W, T, i, o, acc);
  }
  void lora_forward(void* y, float* xa, const void* x, const float* A, const float* B, float s, int T, int i, int r,
                    int o) override {
    in->lora_forward(y, xa, x, A, B, s, T, i, r, o);
  }
  void lora_backward(void* dx, float* dA, float* dB, const void* dy, const void* x, const float* xa, const float* A,
                     const float* B, float s, int T, int i, int r, int o, float* scratch) override {
    in->lora_backward(dx, dA, dB, dy, x, xa, A, B, s, T, i, r, o, scratch);
  }
  void lora_merge(void* Wm, const void* W, const float* A, const float* B, float scale, int out, int in_,
                  int r) override {
    in->lora_merge(Wm, W, A, B, scale, out, in_, r);
  }
  void lora_group_forward(const kernels::LoraMember* g, int n, const void* x, int T, int i, int r,
                          float* scratch) override {
    in->lora_group_forward(g, n, x, T, i, r, scratch);
  }
  void lora_group_backward(void* dx, const kernels::LoraMember* g, int n, const void* x, int T, int i, int r,
                           float* scratch) override {
    in->lora_group_backward(dx, g, n, x, T, i, r, scratch);
  }
  void dropout(void* out, const void* x, std::int64_t n, float p, std::uint64_t seed) override {
    in->dropout(out, x, n, p, seed);
  }
  void rope_forward(void* x, const std::int32_t* pos, const float* f, int T, int h, int d) override {
    in->rope_forward(x, pos, f, T, h, d);
  }
  void rope_backward(void* dx, const std::int32_t* pos, const float* f, int T, int h, int d) override {
    in->rope_backward(dx, pos, f, T, h, d);
  }
  void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, const std::int32_t* cu,
                         int B, int T, int L, int h, int kv, int d, const kernels::AttentionOptions& opt) override {
    in->attention_forward(out, lse, q, k, v, cu, B, T, L, h, kv, d, opt);
  }
  void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const void* q,
                          const void* k, const void* v, const float* lse, const std::int32_t* cu, int B, int T, int L,
                          int h, int kv, int d, const kernels::AttentionOptions& opt) override {
    in->attention_backward(dq, dk, dv, dout, out, q, k, v, lse, cu, B, T, L, h, kv, d, opt);
  }
  void dequantize_nf4(void* dst, const kernels::Nf4Weight& w, std::int64_t b, std::int64_t e) override {
    in->dequantize_nf4(dst, w, b, e);
  }
  void swiglu_forward(void* out, const void* g, const void* u, std::int64_t n) override {
    in->swiglu_forward(out, g, u, n);
  }
  void swiglu_backward(void* dg, void* du, const void* dout, const void* g, const void* u, std::int64_t n) override {
    in->swiglu_backward(dg, du, dout, g, u, n);
  }
  void geglu_forward(void* out, const void* g, const void* u, std::int64_t n) override {
    in->geglu_forward(out, g, u, n);
  }
  void geglu_backward(void* dg, void* du, const void* dout, const void* g, const void* u, std::int64_t n) override {
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
                               int D, int V, float ls, void* scratch, float cap) override {
    in->lm_head_logprob_forward(lp, lse, h, W, t, T, D, V, ls, scratch, cap);
  }
  void lm_head_logprob_backward(void* dh, float* dW, const float* wt, const void* h, const void* W,
                                const std::int32_t* t, const float* lse, int T, int D, int V, float ls, void* scratch,
                                float cap) override {
    in->lm_head_logprob_backward(dh, dW, wt, h, W, t, lse, T, D, V, ls, scratch, cap);
  }
  void lm_head_logprob_forward_backward(float* lp, float* lse, void* dh, float* dW, const float* wt, const void* h,
                                        const void* W, const std::int32_t* t, int T, int D, int V, float ls,
                                        void* scratch, float cap) override {
    in->lm_head_logprob_forward_backward(lp, lse, dh, dW, wt, h, W, t, T, D, V, ls, scratch, cap);
  }
  void lm_head_logits(float* logits, const void* h, const void* W, int T, int D, int V, float ls,
                      float cap) override {
    in->lm_head_logits(logits, h, W, T, D, V, ls, cap);
  }
  void kv_store(void* ck, void* cv, const void* k, const void* v, const std::int32_t* slot, const std::int32_t* pos,
                int T, const kernels::KvPages& pages, int kv, int d) override {
    in->kv_store(ck, cv, k, v, slot, pos, T, pages, kv, d);
  }
  void attention_cached(void* out, const void* q, const void* ck, const void* cv, const std::int32_t* slot,
                        const std::int32_t* pos, int T, const kernels::KvPages& pages, int h, int kv, int d,
                        const kernels::AttentionOptions& opt) override {
    in->attention_cached(out, q, ck, cv, slot, pos, T, pages, h, kv, d, opt);
  }
  void gather_rows(void* dst, const void* src, const std::int32_t* idx, int n, int width) override {
    in->gather_rows(dst, src, idx, n, width);
  }
  void scatter_rows(void* dst, const void* src, const std::int32_t* idx, int n, int width) override {
    in->scatter_rows(dst, src, idx, n, width);
  }
  void sample(std::int32_t* tokens, float* lp, const float* logits, const std::uint64_t* seeds, int B, int V,
              const Sampling& p) override {
    in->sample(tokens, lp, logits, seeds, B, V, p);
  }
  void decode_advance(std::int32_t* ids, std::int32_t* pos, std::int32_t* count, std::int32_t* done,
                      std::uint64_t* seeds, std::int32_t* rt, float* rl, const std::int32_t* tokens, const float* lp,
                      const std::uint64_t* streams, const std::int32_t* eos, int n_eos, int max_count,
                      int R) override {
    in->decode_advance(ids, pos, count, done, seeds, rt, rl, tokens, lp, streams, eos, n_eos, max_count, R);
  }
  double sum_squares(const float* x, std::size_t n) override { return in->sum_squares(x, n); }
  void weighted_sum_accumulate(double* acc, const float* x, const float* w, std::size_t n, double s) override {
    in->weighted_sum_accumulate(acc, x, w, n, s);
  }
  void adamw(float* p, const float* g, float* m, float* v, std::size_t n, const AdamW& hp) override {
    in->adamw(p, g, m, v, n, hp);
  }
};

// The calls per op of one training forward and of one inference prefill of a fixture model, and its layer count.
struct Counts {
  std::map<std::string, int> train, infer;
  int layers = 0;
};

Counts count_calls(const std::string& name) {
  CountingOps ops;
  const io::ModelConfig cfg = io::parse_hf_config(kData + name + "/config.json");
  Transformer net(cfg, ops);
  net.load_weights(kData + name);
  net.add_lora(read_peft_config(kData + name + "/adapter_config.json"), 0).load_peft(kData + name);
  Counts c;
  c.layers = static_cast<int>(cfg.num_hidden_layers);
  const Batch b = Batch::from_sequences({{1, 5, 9, 2}, {3, 4, 7}});
  std::vector<float> lp(static_cast<std::size_t>(b.T()));
  net.forward(b, lp.data());
  c.train = ops.calls;
  ops.calls.clear();
  KvCache cache(cfg, ops, 1, 8);
  net.infer({1, 5, 9}, {0, 0, 0}, {0, 1, 2}, {2}, cache);
  c.infer = ops.calls;
  return c;
}

// Per layer: the residual before the MLP norm fused with it, the last residual out of place; the separate ops unused
// (the layer's only other norms are the attention norm, and on Gemma the two post-norms; plus the final norm).
TEST(FusedNorm, BlockTakesTheFusedOps) {
  ASSERT_TRUE(fused_norm_enabled()) << "run without MGRL_FUSED_NORM=0";
  for (const std::string name : {"llama_gqa", "gemma3_text"}) {
    const Counts c = count_calls(name);
    const int post = name == "gemma3_text" ? 2 : 0, qk = post;  // Gemma 3: post-norms and q/k norms
    for (const auto* m : {&c.train, &c.infer}) {
      const auto n = [m](const char* op) { return m->count(op) ? m->at(op) : 0; };
      EXPECT_EQ(n("residual_rmsnorm_forward"), c.layers) << name;
      EXPECT_EQ(n("residual_add"), c.layers) << name;
      EXPECT_EQ(n("residual_forward"), 0) << name;
      EXPECT_EQ(n("rmsnorm_forward"), c.layers * (1 + post + qk) + 1) << name;
    }
  }
}

TEST(FusedNorm, UnfusedTakesTheSeparateOps) {
  ASSERT_FALSE(fused_norm_enabled()) << "run with MGRL_FUSED_NORM=0";
  for (const std::string name : {"llama_gqa", "gemma3_text"}) {
    const Counts c = count_calls(name);
    const int post = name == "gemma3_text" ? 2 : 0, qk = post;  // Gemma 3: post-norms and q/k norms
    for (const auto* m : {&c.train, &c.infer}) {
      const auto n = [m](const char* op) { return m->count(op) ? m->at(op) : 0; };
      EXPECT_EQ(n("residual_rmsnorm_forward"), 0) << name;
      EXPECT_EQ(n("residual_add"), 0) << name;
      EXPECT_EQ(n("residual_forward"), 2 * c.layers) << name;
      EXPECT_EQ(n("rmsnorm_forward"), c.layers * (2 + post + qk) + 1) << name;
    }
  }
}

}  // namespace
}  // namespace mgrl::model
