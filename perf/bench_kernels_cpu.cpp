// bench_kernels_cpu.cpp: the ops of the CPU backend (kernels/cpu through the Ops interface the model calls,
// make_cpu_ops()) at the shapes of a small real model: Qwen2.5-0.5B's layers (hidden 896, 14 query heads and 2
// KV heads of 64, MLP 4864) with LoRA r = 16 and the vocabulary cut to 32000 so the LM head fits a CI budget.
// The argument is the number of packed tokens T (three sequences of T/4, T/2 and T/4 tokens), except where a
// benchmark says otherwise. Reports bytes/s (the operands read and written once: the memory traffic a perfect
// kernel would need) and, for the matrix products (linear, LoRA, attention, LM head), FLOP/s (2 per multiply-add;
// the attention counts only the causal half of the scores). The element-wise ops and AdamW are bound by memory:
// bytes/s is their figure.
//
//   build/perf/bench_kernels_cpu [--blas_threads=N] [Google Benchmark flags]
//
// --blas_threads sets OpenBLAS's thread count as mgrl's runtime.cpu_threads does (default: OpenBLAS's own, the
// cores of the machine); the other loops of the CPU backend are single-threaded.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/random.h"
#include "kernels/cpu/blas_info.h"
#include "kernels/ops.h"

namespace {

using mgrl::kernels::Ops;
using mgrl::kernels::KvPages;

constexpr int kD = 896, kHeads = 14, kKv = 2, kHd = 64, kI = 4864, kV = 32000, kR = 16;
constexpr float kEps = 1e-6f;

Ops& ops() {
  static const std::unique_ptr<Ops> cpu = mgrl::kernels::make_cpu_ops();
  return *cpu;
}

// Backend buffers of one benchmark, released at its end. Values are uniform in [-scale, scale) from the
// project's counter-based generator: the same inputs on every run.
class Buffers {
 public:
  ~Buffers() {
    for (void* p : ptrs_) ops().release(p);
  }
  float* random(std::size_t n, float scale = 1.0f) {
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i)
      host[i] = static_cast<float>(scale * (2.0 * mgrl::random_uniform(seed_, i) - 1.0));
    ++seed_;
    float* p = zeros(n);
    ops().upload_f32_as_storage(p, host.data(), n);
    return p;
  }
  float* zeros(std::size_t n) {
    ptrs_.push_back(ops().alloc(n * sizeof(float)));
    return static_cast<float*>(ptrs_.back());
  }
  template <typename T>
  T* copy_of(const std::vector<T>& host) {
    ptrs_.push_back(ops().alloc(host.size() * sizeof(T)));
    ops().upload(ptrs_.back(), host.data(), host.size() * sizeof(T));
    return static_cast<T*>(ptrs_.back());
  }

 private:
  std::vector<void*> ptrs_;
  std::uint64_t seed_ = 1;
};

std::size_t sz(std::int64_t a, std::int64_t b = 1, std::int64_t c = 1) { return static_cast<std::size_t>(a * b * c); }

// Bytes and FLOPs per iteration, as rates.
void report(benchmark::State& state, double bytes, double flops = 0) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * static_cast<double>(state.iterations())));
  if (flops > 0)
    state.counters["FLOP/s"] = benchmark::Counter(flops * static_cast<double>(state.iterations()),
                                                  benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
}

// The packed batch of T tokens: three sequences of T/4, T/2 and T - 3T/4 tokens; positions restart per sequence.
struct Packed {
  std::vector<std::int32_t> cu, pos;
  int max_len = 0;
  double causal_pairs = 0;  // sum over sequences of L (L + 1) / 2: the (query, key) pairs attention computes
};
Packed packed(int T) {
  Packed p;
  const int lens[3] = {T / 4, T / 2, T - T / 4 - T / 2};
  p.cu = {0};
  for (const int L : lens) {
    p.cu.push_back(p.cu.back() + L);
    for (int i = 0; i < L; ++i) p.pos.push_back(i);
    p.max_len = std::max(p.max_len, L);
    p.causal_pairs += 0.5 * L * (L + 1.0);
  }
  return p;
}

// ---- linear layers (the frozen base: the backward computes dx only, as in LoRA training) ----

// The MLP's up projection, [T, 896] -> [T, 4864].
void BM_LinearForward(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  Buffers b;
  float *y = b.zeros(sz(T, kI)), *x = b.random(sz(T, kD)), *W = b.random(sz(kI, kD), 0.05f);
  for (auto _ : state) ops().linear_forward(y, x, W, nullptr, T, kD, kI);
  report(state, 4.0 * (T * kD + kI * kD + T * kI), 2.0 * T * kD * kI);
}

void BM_LinearBackward(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  Buffers b;
  float *dx = b.zeros(sz(T, kD)), *dy = b.random(sz(T, kI)), *x = b.random(sz(T, kD));
  float* W = b.random(sz(kI, kD), 0.05f);
  for (auto _ : state) ops().linear_backward(dx, nullptr, nullptr, dy, x, W, T, kD, kI, false);
  report(state, 4.0 * (T * kI + kI * kD + T * kD), 2.0 * T * kD * kI);
}

// ---- LoRA on the MLP's up projection (r = 16) ----

void BM_LoraForward(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  Buffers b;
  float *y = b.zeros(sz(T, kI)), *xa = b.zeros(sz(T, kR)), *x = b.random(sz(T, kD));
  float *A = b.random(sz(kR, kD), 0.05f), *B = b.random(sz(kI, kR), 0.05f);
  for (auto _ : state) ops().lora_forward(y, xa, x, A, B, 2.0f, T, kD, kR, kI);
  report(state, 4.0 * (T * kD + kR * kD + kI * kR + 2.0 * T * kI + T * kR), 2.0 * T * kR * (kD + kI));
}

void BM_LoraBackward(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  Buffers b;
  float *dx = b.zeros(sz(T, kD)), *dA = b.zeros(sz(kR, kD)), *dB = b.zeros(sz(kI, kR));
  float *dy = b.random(sz(T, kI)), *x = b.random(sz(T, kD)), *xa = b.random(sz(T, kR));
  float *A = b.random(sz(kR, kD), 0.05f), *B = b.random(sz(kI, kR), 0.05f), *scratch = b.zeros(sz(T, kR));
  for (auto _ : state) ops().lora_backward(dx, dA, dB, dy, x, xa, A, B, 2.0f, T, kD, kR, kI, scratch);
  report(state, 4.0 * (T * kI + T * kD + T * kR + 2.0 * (kR * kD + kI * kR) + 2.0 * T * kD),
         4.0 * T * kR * (kD + kI));
}

// ---- attention (packed, causal, grouped-query) ----

void BM_AttentionForward(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  const Packed p = packed(T);
  Buffers b;
  float *out = b.zeros(sz(T, kHeads, kHd)), *lse = b.zeros(sz(kHeads, T));
  float *q = b.random(sz(T, kHeads, kHd)), *k = b.random(sz(T, kKv, kHd)), *v = b.random(sz(T, kKv, kHd));
  const std::int32_t* cu = b.copy_of(p.cu);
  for (auto _ : state) ops().attention_forward(out, lse, q, k, v, cu, 3, T, p.max_len, kHeads, kKv, kHd);
  // QK^T and PV over the causal pairs.
  report(state, 4.0 * (2.0 * T * kHeads * kHd + 2.0 * T * kKv * kHd + kHeads * T), 4.0 * kHeads * kHd * p.causal_pairs);
}

void BM_AttentionBackward(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  const Packed p = packed(T);
  Buffers b;
  float *dq = b.zeros(sz(T, kHeads, kHd)), *dk = b.zeros(sz(T, kKv, kHd)), *dv = b.zeros(sz(T, kKv, kHd));
  float *q = b.random(sz(T, kHeads, kHd)), *k = b.random(sz(T, kKv, kHd)), *v = b.random(sz(T, kKv, kHd));
  float *out = b.zeros(sz(T, kHeads, kHd)), *lse = b.zeros(sz(kHeads, T)), *dout = b.random(sz(T, kHeads, kHd));
  const std::int32_t* cu = b.copy_of(p.cu);
  ops().attention_forward(out, lse, q, k, v, cu, 3, T, p.max_len, kHeads, kKv, kHd);
  for (auto _ : state)
    ops().attention_backward(dq, dk, dv, dout, out, q, k, v, lse, cu, 3, T, p.max_len, kHeads, kKv, kHd);
  // Scores recomputed (QK^T), dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q: five products over the pairs.
  report(state, 4.0 * (4.0 * T * kHeads * kHd + 4.0 * T * kKv * kHd + kHeads * T), 10.0 * kHeads * kHd * p.causal_pairs);
}

// Decoding (GRPO rollouts): 8 sequences, one new token each, attending over a KV cache of range(0) positions.
void BM_AttentionCached(benchmark::State& state) {
  const int len = static_cast<int>(state.range(0)), B = 8, max_len = len;
  Buffers b;
  float *out = b.zeros(sz(B, kHeads, kHd)), *q = b.random(sz(B, kHeads, kHd));
  float *ck = b.random(sz(B, max_len, kKv * kHd)), *cv = b.random(sz(B, max_len, kKv * kHd));
  std::vector<std::int32_t> slot(B), pos(B, len - 1);
  for (int i = 0; i < B; ++i) slot[i] = i;
  const std::int32_t *dslot = b.copy_of(slot), *dpos = b.copy_of(pos);
  std::vector<std::int32_t> table(B);  // one block of max_len positions per slot
  for (int i = 0; i < B; ++i) table[i] = i;
  const KvPages pages{b.copy_of(table), B, 1, max_len, B};
  for (auto _ : state) ops().attention_cached(out, q, ck, cv, dslot, dpos, B, pages, kHeads, kKv, kHd);
  report(state, 4.0 * (2.0 * B * len * kKv * kHd + 2.0 * B * kHeads * kHd), 4.0 * B * kHeads * kHd * len);
}

// ---- element-wise and row-wise ops ----

void BM_RmsnormForward(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  Buffers b;
  float *out = b.zeros(sz(T, kD)), *rstd = b.zeros(sz(T)), *x = b.random(sz(T, kD)), *w = b.random(sz(kD));
  for (auto _ : state) ops().rmsnorm_forward(out, rstd, x, w, T, kD, kEps);
  report(state, 4.0 * (2.0 * T * kD + kD + T));
}

void BM_RmsnormBackward(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  Buffers b;
  float *dx = b.zeros(sz(T, kD)), *rstd = b.zeros(sz(T)), *x = b.random(sz(T, kD)), *w = b.random(sz(kD));
  float *out = b.zeros(sz(T, kD)), *dout = b.random(sz(T, kD));
  ops().rmsnorm_forward(out, rstd, x, w, T, kD, kEps);
  // dw null: the norm weights are frozen in LoRA training.
  for (auto _ : state) ops().rmsnorm_backward(dx, nullptr, dout, x, w, rstd, T, kD, false);
  report(state, 4.0 * (3.0 * T * kD + kD + T));
}

// In place on the queries [T, 14, 64].
void BM_RopeForward(benchmark::State& state) {
  const int T = static_cast<int>(state.range(0));
  const Packed p = packed(T);
  Buffers b;
  float* x = b.random(sz(T, kHeads, kHd));
  std::vector<float> inv(kHd / 2);
  for (int j = 0; j < kHd / 2; ++j) inv[j] = static_cast<float>(1.0 / std::pow(1000000.0, 2.0 * j / kHd));
  const float* dinv = b.copy_of(inv);
  const std::int32_t* pos = b.copy_of(p.pos);
  for (auto _ : state) ops().rope_forward(x, pos, dinv, T, kHeads, kHd);
  report(state, 4.0 * 2.0 * T * kHeads * kHd);
}

void BM_SwigluForward(benchmark::State& state) {
  const std::int64_t n = state.range(0) * kI;
  Buffers b;
  float *out = b.zeros(sz(n)), *gate = b.random(sz(n), 4.0f), *up = b.random(sz(n));
  for (auto _ : state) ops().swiglu_forward(out, gate, up, n);
  report(state, 4.0 * 3.0 * static_cast<double>(n));
}

void BM_SwigluBackward(benchmark::State& state) {
  const std::int64_t n = state.range(0) * kI;
  Buffers b;
  float *dgate = b.zeros(sz(n)), *dup = b.zeros(sz(n)), *dout = b.random(sz(n));
  float *gate = b.random(sz(n), 4.0f), *up = b.random(sz(n));
  for (auto _ : state) ops().swiglu_backward(dgate, dup, dout, gate, up, n);
  report(state, 4.0 * 5.0 * static_cast<double>(n));
}

// ---- LM head fused with log-softmax (tied embedding: dW null) ----

struct LmHead {
  Buffers b;
  int T;
  float *h, *W, *logprob, *lse, *weights, *dh;
  std::int32_t* targets;
  void* scratch;
  explicit LmHead(int tokens) : T(tokens) {
    h = b.random(sz(T, kD));
    W = b.random(sz(kV, kD), 0.05f);
    logprob = b.zeros(sz(T));
    lse = b.zeros(sz(T));
    weights = b.random(sz(T));
    dh = b.zeros(sz(T, kD));
    std::vector<std::int32_t> t(static_cast<std::size_t>(T));
    for (int i = 0; i < T; ++i) t[i] = static_cast<std::int32_t>(mgrl::random_bits(3, i) % kV);
    targets = b.copy_of(t);
    scratch = b.zeros(ops().lm_head_scratch_bytes(kV) / sizeof(float) + 1);
  }
};

void BM_LmHeadLogprobForward(benchmark::State& state) {
  LmHead m(static_cast<int>(state.range(0)));
  for (auto _ : state)
    ops().lm_head_logprob_forward(m.logprob, m.lse, m.h, m.W, m.targets, m.T, kD, kV, 1.0f, m.scratch);
  report(state, 4.0 * (m.T * kD + static_cast<double>(kV) * kD + 3.0 * m.T), 2.0 * m.T * kD * kV);
}

void BM_LmHeadLogprobBackward(benchmark::State& state) {
  LmHead m(static_cast<int>(state.range(0)));
  ops().lm_head_logprob_forward(m.logprob, m.lse, m.h, m.W, m.targets, m.T, kD, kV, 1.0f, m.scratch);
  for (auto _ : state)
    ops().lm_head_logprob_backward(m.dh, nullptr, m.weights, m.h, m.W, m.targets, m.lse, m.T, kD, kV, 1.0f,
                                   m.scratch);
  // Logits recomputed, then dh = dlogits @ W.
  report(state, 4.0 * (2.0 * m.T * kD + static_cast<double>(kV) * kD + 3.0 * m.T), 4.0 * m.T * kD * kV);
}

// ---- sampling (GRPO rollouts): range(0) rows of 32000 logits, temperature 0.7, top-p 0.9 ----

void BM_Sample(benchmark::State& state) {
  const int B = static_cast<int>(state.range(0));
  Buffers b;
  float* logits = b.random(sz(B, kV), 8.0f);
  std::vector<std::uint64_t> seeds(static_cast<std::size_t>(B));
  for (int i = 0; i < B; ++i) seeds[i] = 100 + i;
  const std::uint64_t* dseeds = b.copy_of(seeds);
  auto* tokens = reinterpret_cast<std::int32_t*>(b.zeros(sz(B)));
  float* logprobs = b.zeros(sz(B));
  Ops::Sampling params;
  params.temperature = 0.7f;
  params.top_p = 0.9f;
  for (auto _ : state) ops().sample(tokens, logprobs, logits, dseeds, B, kV, params);
  report(state, 4.0 * B * kV);
  state.SetItemsProcessed(state.iterations() * B);  // items = tokens sampled
}

// ---- AdamW over range(0) LoRA parameters (fp32 weights, grads, two moments) ----

void BM_AdamW(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Buffers b;
  float *p = b.random(n, 0.02f), *g = b.random(n, 1e-3f), *m = b.zeros(n), *v = b.zeros(n);
  Ops::AdamW hp;
  hp.weight_decay = 0.01f;
  for (auto _ : state) {
    ops().adamw(p, g, m, v, n, hp);
    ++hp.step;
  }
  // Reads weights, grads, m, v; writes weights, m, v.
  report(state, 4.0 * 7.0 * static_cast<double>(n));
}

// T = 64 keeps the smoke test (tests/perf.cmake) short; T = 512 is a typical packed micro-batch per rank.
#define MGRL_TOKENS(bm) BENCHMARK(bm)->Arg(64)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime()
MGRL_TOKENS(BM_LinearForward);
MGRL_TOKENS(BM_LinearBackward);
MGRL_TOKENS(BM_LoraForward);
MGRL_TOKENS(BM_LoraBackward);
MGRL_TOKENS(BM_AttentionForward);
MGRL_TOKENS(BM_AttentionBackward);
MGRL_TOKENS(BM_RmsnormForward);
MGRL_TOKENS(BM_RmsnormBackward);
MGRL_TOKENS(BM_RopeForward);
MGRL_TOKENS(BM_SwigluForward);
MGRL_TOKENS(BM_SwigluBackward);
MGRL_TOKENS(BM_LmHeadLogprobForward);
MGRL_TOKENS(BM_LmHeadLogprobBackward);
#undef MGRL_TOKENS
BENCHMARK(BM_AttentionCached)->Arg(64)->Arg(1024)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Sample)->Arg(8)->Unit(benchmark::kMicrosecond)->UseRealTime();
// 64 Ki parameters for the smoke test; 8.8 M is Qwen2.5-0.5B with r = 16 on all seven projections of 24 layers.
BENCHMARK(BM_AdamW)->Arg(1 << 16)->Arg(8798208)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--blas_threads=", 15) == 0) mgrl::kernels::cpu::set_blas_threads(std::atoi(argv[i] + 15));
    else args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::AddCustomContext("blas", mgrl::kernels::cpu::blas_info());
  benchmark::AddCustomContext("blas_threads", std::to_string(mgrl::kernels::cpu::blas_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
