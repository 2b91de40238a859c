// test_ops_cuda.cpp: every op of the CUDA backend against the CPU reference backend on the same random inputs
// (rounded to the storage dtype first, so both compute on identical values), for bf16 (sm_80+) and fp16 storage.
// Without a usable CUDA device the binary exits 77 (CTest: skipped).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/build_info.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/flash_attention_sm70_plan.h"
#include "kernels/ops.h"

namespace mgrl::kernels {
namespace {

using Vec = std::vector<float>;
using Ids = std::vector<std::int32_t>;

// Tolerances (relative error = |got - ref| / |ref| over the whole tensor, 2-norms):
//  - storage-dtype outputs: one final rounding (bf16 2^-9, fp16 2^-12 relative) plus fp32 summation-order noise;
//    and, for lm_head dW, dlogits rounded to the storage dtype before the GEMM.
//  - f32 outputs computed in fp32 from identical inputs on both sides (LoRA xa/dA/dB, rstd, lse, log-probs,
//    dbias, embedding dtable): only the order of fp32 sums differs (~1e-6); 1e-4 leaves a wide margin.
//  - f32 outputs of cuBLAS GEMMs (linear dW, logits): 1e-3 (fp32 accumulation, algorithm-dependent order).
constexpr double kF32Tol = 1e-4;
constexpr double kGemmF32Tol = 1e-3;

Vec randu(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

std::size_t sz(std::int64_t a, std::int64_t b = 1, std::int64_t c = 1, std::int64_t d = 1) {
  return static_cast<std::size_t>(a * b * c * d);
}

class OpsCuda : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    int major = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    if (GetParam() == DType::BF16 && major < 8) GTEST_SKIP() << "bf16 storage needs compute capability 8.0+";
    cpu_ = make_cpu_ops();
    gpu_ = make_cuda_ops(0, GetParam());
  }
  void TearDown() override {
    for (auto& [ops, p] : owned_) ops->release(p);
    owned_.clear();
  }

  DType st() const { return GetParam(); }
  double tol() const { return st() == DType::BF16 ? 2e-2 : 1e-2; }

  // v rounded to the storage dtype (host conversion, round to nearest even) and back to f32.
  Vec rounded(Vec v) const {
    for (auto& x : v)
      x = st() == DType::BF16 ? __bfloat162float(__float2bfloat16_rn(x)) : __half2float(__float2half_rn(x));
    return v;
  }

  // A tensor on both backends holding the same values: storage dtype (values rounded first) or f32.
  struct Pair {
    void* c = nullptr;
    void* g = nullptr;
    std::size_t n = 0;
    bool storage = false;
  };
  void* own(Ops& ops, std::size_t bytes) {
    void* p = ops.alloc(bytes);
    owned_.emplace_back(&ops, p);
    return p;
  }
  Pair storage(const Vec& v) {
    const Vec r = rounded(v);
    Pair p{own(*cpu_, r.size() * 4), own(*gpu_, r.size() * gpu_->storage_size()), r.size(), true};
    cpu_->upload(p.c, r.data(), r.size() * 4);
    gpu_->upload_f32_as_storage(p.g, r.data(), r.size());
    return p;
  }
  Pair f32(const Vec& v) {
    Pair p{own(*cpu_, v.size() * 4), own(*gpu_, v.size() * 4), v.size(), false};
    cpu_->upload(p.c, v.data(), v.size() * 4);
    gpu_->upload(p.g, v.data(), v.size() * 4);
    return p;
  }
  Pair i32(const Ids& v) {
    Pair p{own(*cpu_, v.size() * 4), own(*gpu_, v.size() * 4), v.size(), false};
    cpu_->upload(p.c, v.data(), v.size() * 4);
    gpu_->upload(p.g, v.data(), v.size() * 4);
    return p;
  }
  // Elements e.. of p on both backends (a view into p's memory: e = 1 gives storage pointers that are not 16-byte
  // aligned).
  Pair view(const Pair& p, std::size_t e) const {
    Pair v = p;
    v.c = static_cast<float*>(p.c) + e;
    v.g = static_cast<char*>(p.g) + e * (p.storage ? gpu_->storage_size() : 4);
    v.n = p.n - e;
    return v;
  }
  Vec cpu_values(const Pair& p) const {
    Vec v(p.n);
    cpu_->download(v.data(), p.c, p.n * 4);
    return v;
  }
  Vec gpu_values(const Pair& p) const {
    Vec v(p.n);
    if (p.storage)
      gpu_->download_storage_as_f32(v.data(), p.g, p.n);
    else
      gpu_->download(v.data(), p.g, p.n * 4);
    return v;
  }

  // Relative 2-norm error of the GPU values of p against the CPU values of p.
  void expect_close(const std::string& what, const Pair& p, double tolerance) const {
    expect_close_vec(what, cpu_values(p), gpu_values(p), tolerance);
  }
  void expect_close_vec(const std::string& what, const Vec& ref, const Vec& got, double tolerance) const {
    ASSERT_EQ(ref.size(), got.size()) << what;
    double num = 0.0, den = 0.0;
    std::size_t nonfinite = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      if (!std::isfinite(got[i])) ++nonfinite;
      const double d = static_cast<double>(got[i]) - ref[i];
      num += d * d;
      den += static_cast<double>(ref[i]) * ref[i];
    }
    EXPECT_EQ(nonfinite, 0u) << what << ": non-finite values";
    const double rel = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
    std::printf("  [%s] %-28s rel %.3e (tol %.0e, n %zu)\n", dtype_name(st()), what.c_str(), rel, tolerance,
                ref.size());
    EXPECT_LE(rel, tolerance) << what << " (" << dtype_name(st()) << ")";
  }

  std::unique_ptr<Ops> cpu_, gpu_;
  std::vector<std::pair<Ops*, void*>> owned_;
};

// ---------------------------------------------------------------------------------------------------------------

TEST_P(OpsCuda, BackendBasics) {
  EXPECT_STREQ(gpu_->name(), "cuda");
  EXPECT_EQ(gpu_->storage(), st());
  EXPECT_EQ(gpu_->storage_size(), 2u);
  EXPECT_NE(gpu_->device_stream().cuda, nullptr);
  EXPECT_EQ(cpu_->device_stream().cuda, nullptr);
  // upload / copy / zero / download round trip of raw bytes, and zero-filled alloc.
  const Vec v = randu(1001, 1);
  Pair a = f32(v), b = f32(Vec(v.size(), 0.0f));
  EXPECT_EQ(gpu_values(b), Vec(v.size(), 0.0f));
  gpu_->copy(b.g, a.g, v.size() * 4);
  EXPECT_EQ(gpu_values(b), v);
  gpu_->zero(b.g, 10 * 4);
  Vec want = v;
  for (int i = 0; i < 10; ++i) want[static_cast<std::size_t>(i)] = 0.0f;
  EXPECT_EQ(gpu_values(b), want);
  // The device conversion rounds like the host (round to nearest even), and back is exact.
  const Vec big = randu(4099, 2, -300.0f, 300.0f);
  void* s = own(*gpu_, big.size() * 2);
  gpu_->upload_f32_as_storage(s, big.data(), big.size());
  Vec back(big.size());
  gpu_->download_storage_as_f32(back.data(), s, big.size());
  EXPECT_EQ(back, rounded(big));
  gpu_->synchronize();
}

TEST_P(OpsCuda, Embedding) {
  const int V = 101, D = 67;
  Ids ids = {3, 0, 100, 3, -1, 57, 3, 99, -1, 42};
  std::mt19937 gen(7);
  for (int i = 0; i < 27; ++i) ids.push_back(static_cast<std::int32_t>(gen() % V));  // repeats likely
  const int T = static_cast<int>(ids.size());
  Pair id = i32(ids);
  Pair table = storage(randu(sz(V, D), 3));
  Pair out = storage(Vec(sz(T, D), 5.0f));
  cpu_->embedding_forward(out.c, static_cast<const std::int32_t*>(id.c), table.c, T, V, D);
  gpu_->embedding_forward(out.g, static_cast<const std::int32_t*>(id.g), table.g, T, V, D);
  expect_close("embedding out (exact)", out, 0.0);

  Pair dout = storage(randu(sz(T, D), 4));
  Pair dtable = f32(randu(sz(V, D), 5, -0.1f, 0.1f));  // accumulates onto what is there
  cpu_->embedding_backward(static_cast<float*>(dtable.c), dout.c, static_cast<const std::int32_t*>(id.c), T, V, D);
  gpu_->embedding_backward(static_cast<float*>(dtable.g), dout.g, static_cast<const std::int32_t*>(id.g), T, V, D);
  expect_close("embedding dtable", dtable, kF32Tol);

  // An id >= V cannot throw inside a kernel: the next synchronisation reports it, and the flag is then cleared.
  Pair bad = i32({1, V});
  gpu_->embedding_forward(out.g, static_cast<const std::int32_t*>(bad.g), table.g, 2, V, D);
  EXPECT_THROW(gpu_->synchronize(), FatalError);
  EXPECT_NO_THROW(gpu_->synchronize());
}

TEST_P(OpsCuda, Rmsnorm) {
  struct Case {
    int rows, dim;
  };
  for (const Case cs : {Case{29, 203}, Case{31 * 3, 40}, Case{5, 1031}}) {
    const int rows = cs.rows, dim = cs.dim;
    const std::string tag = std::to_string(rows) + "x" + std::to_string(dim) + " ";
    const float eps = 1e-6f;
    Pair x = storage(randu(sz(rows, dim), 10, -2.0f, 2.0f));
    Pair w = storage(randu(sz(dim), 11, 0.5f, 1.5f));
    Pair out = storage(Vec(sz(rows, dim), 0.0f));
    Pair rstd = f32(Vec(sz(rows), 0.0f));
    cpu_->rmsnorm_forward(out.c, static_cast<float*>(rstd.c), x.c, w.c, rows, dim, eps);
    gpu_->rmsnorm_forward(out.g, static_cast<float*>(rstd.g), x.g, w.g, rows, dim, eps);
    expect_close(tag + "rmsnorm out", out, tol());
    expect_close(tag + "rmsnorm rstd", rstd, kF32Tol);

    // Backward with the same (CPU) rstd on both sides; dx written, then accumulated; dw accumulates.
    Pair rs = f32(cpu_values(rstd));
    Pair dout = storage(randu(sz(rows, dim), 12));
    Pair dx = storage(randu(sz(rows, dim), 13));
    Pair dw = f32(randu(sz(dim), 14, -0.1f, 0.1f));
    for (bool acc : {false, true}) {
      cpu_->rmsnorm_backward(dx.c, static_cast<float*>(dw.c), dout.c, x.c, w.c, static_cast<const float*>(rs.c), rows,
                             dim, acc);
      gpu_->rmsnorm_backward(dx.g, static_cast<float*>(dw.g), dout.g, x.g, w.g, static_cast<const float*>(rs.g), rows,
                             dim, acc);
      expect_close(tag + (acc ? "rmsnorm dx (accumulate)" : "rmsnorm dx"), dx, tol());
      expect_close(tag + "rmsnorm dw", dw, kF32Tol);
    }
    // dx only, dw only.
    cpu_->rmsnorm_backward(dx.c, nullptr, dout.c, x.c, w.c, static_cast<const float*>(rs.c), rows, dim, false);
    gpu_->rmsnorm_backward(dx.g, nullptr, dout.g, x.g, w.g, static_cast<const float*>(rs.g), rows, dim, false);
    expect_close(tag + "rmsnorm dx (no dw)", dx, tol());
    cpu_->rmsnorm_backward(nullptr, static_cast<float*>(dw.c), dout.c, x.c, w.c, static_cast<const float*>(rs.c), rows,
                           dim, false);
    gpu_->rmsnorm_backward(nullptr, static_cast<float*>(dw.g), dout.g, x.g, w.g, static_cast<const float*>(rs.g), rows,
                           dim, false);
    expect_close(tag + "rmsnorm dw (no dx)", dw, kF32Tol);

    // In place (out aliases x).
    cpu_->rmsnorm_forward(x.c, static_cast<float*>(rstd.c), x.c, w.c, rows, dim, eps);
    gpu_->rmsnorm_forward(x.g, static_cast<float*>(rstd.g), x.g, w.g, rows, dim, eps);
    expect_close(tag + "rmsnorm in place", x, tol());
  }
}

// The RMSNorm row-group kernels (forward and dx; kernels/cuda/rmsnorm.cu) and the residual add fused into the forward,
// at the shapes that matter: per-head rows of 64 and 128, hidden sizes 896, 4096 and 8192, an odd 100 (no 16-byte
// vectors), 20000 (too long for a row group: the one-block-per-row kernels), unit offset off and on, every pointer one
// element past 16-byte alignment (shift 1: the scalar path), out of place and in place. gpu.ops_cuda_unfused_norm runs
// it again with MGRL_FUSED_NORM=0 (the kernels of before, the fused op as two passes).
TEST_P(OpsCuda, RmsnormRowGroupsAndResidualRmsnorm) {
  struct Case {
    int rows, dim, shift;
  };
  std::uint32_t seed = 100;
  for (const Case cs : {Case{37 * 4, 64, 0}, Case{301, 128, 0}, Case{29, 896, 0}, Case{9, 4096, 0}, Case{3, 8192, 0},
                        Case{13, 100, 0}, Case{2, 20000, 0}, Case{7, 896, 1}, Case{40, 64, 1}}) {
    for (const bool unit : {false, true}) {
      const int rows = cs.rows, dim = cs.dim;
      const std::size_t sh = static_cast<std::size_t>(cs.shift), n = sz(rows, dim) + sh;
      const std::string tag =
          std::to_string(rows) + "x" + std::to_string(dim) + (sh ? " shifted" : "") + (unit ? " unit " : " ");
      const float eps = 1e-6f;
      // Element sh of a pair on each backend (CPU: f32, GPU: storage dtype or f32).
      const auto C = [sh](const Pair& p) { return static_cast<void*>(static_cast<char*>(p.c) + sh * 4); };
      const std::size_t gs = gpu_->storage_size();
      const auto G = [sh, gs](const Pair& p) {
        return static_cast<void*>(static_cast<char*>(p.g) + sh * (p.storage ? gs : 4));
      };
      const auto F = [](void* p) { return static_cast<float*>(p); };
      Pair x = storage(randu(n, seed++, -2.0f, 2.0f));
      Pair w = storage(unit ? randu(dim + sh, seed++, -0.5f, 0.5f) : randu(dim + sh, seed++, 0.5f, 1.5f));
      Pair out = storage(Vec(n, 0.0f)), rstd = f32(Vec(rows + sh, 0.0f));
      cpu_->rmsnorm_forward(C(out), F(C(rstd)), C(x), C(w), rows, dim, eps, unit);
      gpu_->rmsnorm_forward(G(out), F(G(rstd)), G(x), G(w), rows, dim, eps, unit);
      expect_close(tag + "rmsnorm out", out, tol());
      expect_close(tag + "rmsnorm rstd", rstd, kF32Tol);

      Pair rs = f32(cpu_values(rstd)), dout = storage(randu(n, seed++)), dx = storage(randu(n, seed++));
      for (const bool acc : {false, true}) {
        cpu_->rmsnorm_backward(C(dx), nullptr, C(dout), C(x), C(w), F(C(rs)), rows, dim, acc, unit);
        gpu_->rmsnorm_backward(G(dx), nullptr, G(dout), G(x), G(w), F(G(rs)), rows, dim, acc, unit);
        expect_close(tag + (acc ? "rmsnorm dx (accumulate)" : "rmsnorm dx"), dx, tol());
      }

      // The residual add fused into the norm: x_out apart from x_in, then in place (x_out = x_in).
      Pair y = storage(randu(n, seed++, -2.0f, 2.0f)), x_out = storage(Vec(n, 0.0f)), h = storage(Vec(n, 0.0f));
      cpu_->residual_rmsnorm_forward(C(x_out), C(h), F(C(rstd)), C(x), C(y), C(w), rows, dim, eps, unit);
      gpu_->residual_rmsnorm_forward(G(x_out), G(h), F(G(rstd)), G(x), G(y), G(w), rows, dim, eps, unit);
      expect_close(tag + "residual+norm x_out", x_out, tol());
      expect_close(tag + "residual+norm h", h, tol());
      expect_close(tag + "residual+norm rstd", rstd, tol());  // x_out is rounded before the norm on the GPU only
      expect_close(tag + "residual+norm x_in kept", x, 0.0);
      cpu_->residual_rmsnorm_forward(C(x), C(h), F(C(rstd)), C(x), C(y), C(w), rows, dim, eps, unit);
      gpu_->residual_rmsnorm_forward(G(x), G(h), F(G(rstd)), G(x), G(y), G(w), rows, dim, eps, unit);
      expect_close(tag + "residual+norm in place x", x, tol());
      expect_close(tag + "residual+norm in place h", h, tol());

      // The plain norm in place (out = x).
      cpu_->rmsnorm_forward(C(x), F(C(rstd)), C(x), C(w), rows, dim, eps, unit);
      gpu_->rmsnorm_forward(G(x), F(G(rstd)), G(x), G(w), rows, dim, eps, unit);
      expect_close(tag + "rmsnorm in place", x, tol());
    }
  }
}

// out = a + b out of place and with out aliasing a or b, with 16-byte vectors (n = 1024) and without (n = 1003).
TEST_P(OpsCuda, ResidualAdd) {
  for (const std::int64_t n : {std::int64_t{1003}, std::int64_t{1024}}) {
    const std::string tag = "n " + std::to_string(n) + " ";
    Pair a = storage(randu(sz(n), 82)), b = storage(randu(sz(n), 83)), out = storage(Vec(sz(n), 0.0f));
    cpu_->residual_add(out.c, a.c, b.c, n);
    gpu_->residual_add(out.g, a.g, b.g, n);
    expect_close(tag + "residual out = a + b", out, tol());
    cpu_->residual_add(a.c, a.c, b.c, n);
    gpu_->residual_add(a.g, a.g, b.g, n);
    expect_close(tag + "residual a = a + b", a, tol());
    cpu_->residual_add(b.c, out.c, b.c, n);
    gpu_->residual_add(b.g, out.g, b.g, n);
    expect_close(tag + "residual b = out + b", b, tol());
  }
}

TEST_P(OpsCuda, Linear) {
  const int T = 37, in = 91, out = 53;
  Pair x = storage(randu(sz(T, in), 20));
  Pair W = storage(randu(sz(out, in), 21, -0.3f, 0.3f));
  Pair bias = storage(randu(sz(out), 22));
  Pair y = storage(Vec(sz(T, out), 0.0f));
  for (bool with_bias : {false, true}) {
    const void* bc = with_bias ? bias.c : nullptr;
    const void* bg = with_bias ? bias.g : nullptr;
    cpu_->linear_forward(y.c, x.c, W.c, bc, T, in, out);
    gpu_->linear_forward(y.g, x.g, W.g, bg, T, in, out);
    expect_close(with_bias ? "linear y (bias)" : "linear y", y, tol());
  }
  Pair dy = storage(randu(sz(T, out), 23));
  Pair dx = storage(randu(sz(T, in), 24));
  Pair dW = f32(randu(sz(out, in), 25, -0.1f, 0.1f));
  Pair db = f32(randu(sz(out), 26, -0.1f, 0.1f));
  for (bool acc : {false, true}) {
    cpu_->linear_backward(dx.c, static_cast<float*>(dW.c), static_cast<float*>(db.c), dy.c, x.c, W.c, T, in, out, acc);
    gpu_->linear_backward(dx.g, static_cast<float*>(dW.g), static_cast<float*>(db.g), dy.g, x.g, W.g, T, in, out, acc);
    expect_close(acc ? "linear dx (accumulate)" : "linear dx", dx, tol());
    expect_close("linear dW", dW, kGemmF32Tol);
    expect_close("linear dbias", db, kF32Tol);
  }
  // Only dx.
  cpu_->linear_backward(dx.c, nullptr, nullptr, dy.c, x.c, W.c, T, in, out, false);
  gpu_->linear_backward(dx.g, nullptr, nullptr, dy.g, x.g, W.g, T, in, out, false);
  expect_close("linear dx (only)", dx, tol());
}

// Biased linear layers at model-like shapes (widths multiples of 8: what cuBLASLt's bias epilogue takes; decode's
// T = 1 and 8 beside training's), and with x, y and the bias one element off their allocation's alignment (a plan
// of its own, or the broadcast path when cuBLASLt has none; the heuristic must see the bias's alignment).
TEST_P(OpsCuda, LinearBiasShapes) {
  struct Shape {
    int T, in, out, offset;
  };
  const Shape shapes[] = {{1, 896, 1152, 0}, {8, 896, 128, 0}, {37, 896, 896, 0}, {256, 128, 64, 0},
                          {1, 64, 96, 1},    {19, 128, 40, 1}};
  for (const Shape& sh : shapes) {
    const int T = sh.T, in = sh.in, out = sh.out, o = sh.offset;
    Pair x = storage(randu(sz(T, in) + o, 27));
    Pair W = storage(randu(sz(out, in), 28, -0.1f, 0.1f));
    Pair bias = storage(randu(sz(out) + o, 29));
    Pair y = storage(Vec(sz(T, out) + o, 0.0f));
    const std::size_t S = dtype_size(st());
    // The CPU backend holds f32 (4 bytes a value), the GPU the storage dtype.
    auto at_c = [&](void* p) { return static_cast<void*>(static_cast<char*>(p) + o * 4); };
    auto at_g = [&](void* p) { return static_cast<void*>(static_cast<char*>(p) + o * S); };
    cpu_->linear_forward(at_c(y.c), at_c(x.c), W.c, at_c(bias.c), T, in, out);
    gpu_->linear_forward(at_g(y.g), at_g(x.g), W.g, at_g(bias.g), T, in, out);
    expect_close("linear y (bias) T " + std::to_string(T) + " " + std::to_string(in) + "->" + std::to_string(out) +
                     (o ? " unaligned" : ""),
                 y, tol());
  }
}

TEST_P(OpsCuda, Lora) {
  struct Case {
    int T, in, r, out;
  };
  // T not a multiple of the kernels' row tiles (4, 8, 32), widths not multiples of 32 or 256.
  for (const Case cs : {Case{45, 77, 7, 59}, Case{70, 300, 16, 261}, Case{3, 33, 1, 5}}) {
    const int T = cs.T, in = cs.in, r = cs.r, out = cs.out;
    const std::string tag = "r" + std::to_string(r) + " T" + std::to_string(T) + " ";
    const float scale = 2.0f / static_cast<float>(r);
    Pair x = storage(randu(sz(T, in), 30));
    Pair A = f32(randu(sz(r, in), 31, -0.2f, 0.2f));
    Pair B = f32(randu(sz(out, r), 32, -0.2f, 0.2f));
    Pair y = storage(randu(sz(T, out), 33));
    Pair xa = f32(Vec(sz(T, r), 0.0f));
    cpu_->lora_forward(y.c, static_cast<float*>(xa.c), x.c, static_cast<const float*>(A.c),
                       static_cast<const float*>(B.c), scale, T, in, r, out);
    gpu_->lora_forward(y.g, static_cast<float*>(xa.g), x.g, static_cast<const float*>(A.g),
                       static_cast<const float*>(B.g), scale, T, in, r, out);
    expect_close(tag + "lora xa", xa, kF32Tol);
    expect_close(tag + "lora y (+=)", y, tol());

    // Backward from the CPU's xa on both sides. dA, dB accumulate onto random values, dx adds onto random values.
    Pair xa_ref = f32(cpu_values(xa));
    Pair dy = storage(randu(sz(T, out), 34));
    Pair dx = storage(randu(sz(T, in), 35));
    Pair dA = f32(randu(sz(r, in), 36, -0.01f, 0.01f));
    Pair dB = f32(randu(sz(out, r), 37, -0.01f, 0.01f));
    Pair scratch = f32(Vec(sz(T, r), 0.0f));
    for (bool own_scratch : {true, false}) {
      float* sc = own_scratch ? static_cast<float*>(scratch.c) : nullptr;
      float* sg = own_scratch ? static_cast<float*>(scratch.g) : nullptr;
      cpu_->lora_backward(dx.c, static_cast<float*>(dA.c), static_cast<float*>(dB.c), dy.c, x.c,
                          static_cast<const float*>(xa_ref.c), static_cast<const float*>(A.c),
                          static_cast<const float*>(B.c), scale, T, in, r, out, sc);
      gpu_->lora_backward(dx.g, static_cast<float*>(dA.g), static_cast<float*>(dB.g), dy.g, x.g,
                          static_cast<const float*>(xa_ref.g), static_cast<const float*>(A.g),
                          static_cast<const float*>(B.g), scale, T, in, r, out, sg);
      const std::string s = own_scratch ? "" : " (op scratch)";
      expect_close(tag + "lora dx (+=)" + s, dx, tol());
      expect_close(tag + "lora dA" + s, dA, kF32Tol);
      expect_close(tag + "lora dB" + s, dB, kF32Tol);
    }
    // The caller's scratch holds scale * dy @ B after the first call (f32).
    expect_close(tag + "lora scratch = scale dy B", scratch, kF32Tol);
    // Only dB (no dA, no dx).
    cpu_->lora_backward(nullptr, nullptr, static_cast<float*>(dB.c), dy.c, x.c, static_cast<const float*>(xa_ref.c),
                        static_cast<const float*>(A.c), static_cast<const float*>(B.c), scale, T, in, r, out, nullptr);
    gpu_->lora_backward(nullptr, nullptr, static_cast<float*>(dB.g), dy.g, x.g, static_cast<const float*>(xa_ref.g),
                        static_cast<const float*>(A.g), static_cast<const float*>(B.g), scale, T, in, r, out, nullptr);
    expect_close(tag + "lora dB (only)", dB, kF32Tol);
  }
}

// A LoRA group (Ops::lora_group_forward / lora_group_backward: members sharing x, the products over x stacked) on the
// GPU against the CPU backend's group op (which tests/unit/test_ops_cpu.cpp holds to its members run one by one).
// Same tolerances as the single op: the cuBLAS path's split operands keep xa, dA, dB at fp32 accuracy.
TEST_P(OpsCuda, LoraGroup) {
  struct Case {
    int T, in, r;
    std::vector<int> outs;
  };
  for (const Case& cs : {Case{45, 77, 7, {59, 21, 21}}, Case{70, 300, 16, {261, 261}}, Case{3, 33, 1, {5, 9, 5}},
                         Case{20, 64, 4, {48}}}) {
    const int T = cs.T, in = cs.in, r = cs.r, n = static_cast<int>(cs.outs.size());
    const std::string tag = "n" + std::to_string(n) + " r" + std::to_string(r) + " T" + std::to_string(T) + " ";
    Pair x = storage(randu(sz(T, in), 130));
    Pair dx = storage(randu(sz(T, in), 131));
    std::vector<Pair> A, B, y, xa, dy, dA, dB;
    std::vector<float> scale;
    for (int m = 0; m < n; ++m) {
      const int out = cs.outs[static_cast<std::size_t>(m)];
      const std::uint32_t s0 = 140 + 10 * static_cast<std::uint32_t>(m);
      A.push_back(f32(randu(sz(r, in), s0, -0.2f, 0.2f)));
      B.push_back(f32(randu(sz(out, r), s0 + 1, -0.2f, 0.2f)));
      y.push_back(storage(randu(sz(T, out), s0 + 2)));
      xa.push_back(f32(Vec(sz(T, r), 0.0f)));
      dy.push_back(storage(randu(sz(T, out), s0 + 3)));
      dA.push_back(f32(randu(sz(r, in), s0 + 4, -0.01f, 0.01f)));
      dB.push_back(f32(randu(sz(out, r), s0 + 5, -0.01f, 0.01f)));
      scale.push_back((2.0f + static_cast<float>(m)) / static_cast<float>(r));
    }
    // Members on each side; `gpu` picks the pointers, with_dA / with_dB leave gradients out.
    const auto members = [&](bool gpu, bool with_dA, bool with_dB, const std::vector<Pair>& xa_use) {
      std::vector<LoraMember> g(static_cast<std::size_t>(n));
      for (int m = 0; m < n; ++m) {
        const std::size_t i = static_cast<std::size_t>(m);
        const auto pick = [gpu](const Pair& p) { return gpu ? p.g : p.c; };
        g[i].y = pick(y[i]);
        g[i].dy = pick(dy[i]);
        g[i].xa = static_cast<float*>(pick(xa_use[i]));
        g[i].A = static_cast<const float*>(pick(A[i]));
        g[i].B = static_cast<const float*>(pick(B[i]));
        g[i].dA = with_dA ? static_cast<float*>(pick(dA[i])) : nullptr;
        g[i].dB = with_dB ? static_cast<float*>(pick(dB[i])) : nullptr;
        g[i].scale = scale[i];
        g[i].out = cs.outs[i];
      }
      return g;
    };
    {
      const auto gc = members(false, true, true, xa), gg = members(true, true, true, xa);
      cpu_->lora_group_forward(gc.data(), n, x.c, T, in, r, nullptr);
      gpu_->lora_group_forward(gg.data(), n, x.g, T, in, r, nullptr);
    }
    for (int m = 0; m < n; ++m) {
      const std::size_t i = static_cast<std::size_t>(m);
      expect_close(tag + "group xa " + std::to_string(m), xa[i], kF32Tol);
      expect_close(tag + "group y (+=) " + std::to_string(m), y[i], tol());
    }
    // Backward from the CPU's xa on both sides; dA, dB accumulate, dx adds. Then without dA, then only dB.
    std::vector<Pair> xa_ref;
    for (const Pair& p : xa) xa_ref.push_back(f32(cpu_values(p)));
    struct Variant {
      bool dx, dA;
      const char* name;
    };
    for (const Variant v : {Variant{true, true, ""}, Variant{true, false, " (no dA)"}, Variant{false, false, " (only dB)"}}) {
      const auto gc = members(false, v.dA, true, xa_ref), gg = members(true, v.dA, true, xa_ref);
      cpu_->lora_group_backward(v.dx ? dx.c : nullptr, gc.data(), n, x.c, T, in, r, nullptr);
      gpu_->lora_group_backward(v.dx ? dx.g : nullptr, gg.data(), n, x.g, T, in, r, nullptr);
      if (v.dx) expect_close(tag + "group dx (+=)" + v.name, dx, tol());
      for (int m = 0; m < n; ++m) {
        const std::size_t i = static_cast<std::size_t>(m);
        if (v.dA) expect_close(tag + "group dA " + std::to_string(m) + v.name, dA[i], kF32Tol);
        expect_close(tag + "group dB " + std::to_string(m) + v.name, dB[i], kF32Tol);
      }
    }
  }
}

// linear_lora_group_forward (MGRL_LORA_CONCAT=1: the linears and their adapters as one GEMM a member over
// concatenated operands) against the CPU's linear_forward of each member followed by lora_group_forward: y within
// one rounding, xa (kept for the backward) in f32. Without the switch the op must decline (the caller's two ops run),
// and it declines with it where the outputs are not wider than the input (the copy of x would not pay).
TEST_P(OpsCuda, LoraConcat) {
  const bool on = std::getenv("MGRL_LORA_CONCAT") && std::string(std::getenv("MGRL_LORA_CONCAT")) == "1";
  const char* lora_kernels = std::getenv("MGRL_CUDA_LORA");
  if (on && lora_kernels && std::string(lora_kernels) == "fused")
    GTEST_SKIP() << "MGRL_CUDA_LORA=fused: the custom LoRA kernels decline the concatenated path";
  struct Case {
    int T, in, r;
    std::vector<int> outs;
  };
  // The fourth case has an odd input width: K = in + 2nr odd, so every operand row after the first is only 2-byte
  // aligned (cuBLAS's unaligned kernels); the last declines (outputs not wider than x).
  for (const Case& cs : {Case{45, 32, 4, {59, 21}}, Case{70, 64, 16, {261, 261}}, Case{33, 48, 7, {40, 24, 24}},
                         Case{17, 33, 5, {50, 7, 9}}, Case{20, 40, 4, {40}}}) {
    const int T = cs.T, in = cs.in, r = cs.r, n = static_cast<int>(cs.outs.size());
    const std::string tag = "n" + std::to_string(n) + " r" + std::to_string(r) + " T" + std::to_string(T) + " ";
    Pair x = storage(randu(sz(T, in), 230));
    std::vector<Pair> W, A, B, y, xa;
    std::vector<float> scale;
    int outs = 0;
    for (int m = 0; m < n; ++m) {
      const int out = cs.outs[static_cast<std::size_t>(m)];
      outs += out;
      const std::uint32_t s0 = 240 + 10 * static_cast<std::uint32_t>(m);
      W.push_back(storage(randu(sz(out, in), s0, -0.3f, 0.3f)));
      A.push_back(f32(randu(sz(r, in), s0 + 1, -0.2f, 0.2f)));
      B.push_back(f32(randu(sz(out, r), s0 + 2, -0.2f, 0.2f)));
      y.push_back(storage(Vec(sz(T, out), 7.0f)));  // overwritten, not added to
      xa.push_back(f32(Vec(sz(T, r), 0.0f)));
      scale.push_back((2.0f + static_cast<float>(m)) / static_cast<float>(r));
    }
    const auto members = [&](bool gpu) {
      std::vector<LoraMember> g(static_cast<std::size_t>(n));
      std::vector<Ops::LinearMember> lm(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < g.size(); ++i) {
        const auto pick = [gpu](const Pair& p) { return gpu ? p.g : p.c; };
        g[i].y = pick(y[i]);
        g[i].xa = static_cast<float*>(pick(xa[i]));
        g[i].A = static_cast<const float*>(pick(A[i]));
        g[i].B = static_cast<const float*>(pick(B[i]));
        g[i].scale = scale[i];
        g[i].out = cs.outs[i];
        lm[i].y = g[i].y;
        lm[i].W = pick(W[i]);
        lm[i].out = cs.outs[i];
      }
      return std::make_pair(g, lm);
    };
    const auto [gc, lc] = members(false);
    const auto [gg, lg] = members(true);
    for (int m = 0; m < n; ++m) cpu_->linear_forward(lc[m].y, x.c, lc[m].W, nullptr, T, in, lc[m].out);
    cpu_->lora_group_forward(gc.data(), n, x.c, T, in, r, nullptr);
    const bool took = gpu_->linear_lora_group_forward(lg.data(), gg.data(), n, x.g, T, in, r);
    if (!on || outs <= in) {
      EXPECT_FALSE(took) << tag << "the op must decline " << (on ? "(outputs not wider than x)" : "(switch off)");
      continue;
    }
    ASSERT_TRUE(took) << tag;
    for (int m = 0; m < n; ++m) {
      const std::size_t i = static_cast<std::size_t>(m);
      expect_close(tag + "concat y " + std::to_string(m), y[i], tol());
      expect_close(tag + "concat xa " + std::to_string(m), xa[i], kF32Tol);
    }
  }
}

// lora_merge (generate.merge_lora): Wm = W + scale * B A. The CUDA kernel sums over k in the CPU reference's order
// with the same separately rounded products and adds, so its result is the reference's f32 value rounded once to
// the storage dtype: bit for bit (a mismatch count, with the worst relative difference for the diagnosis). The
// shapes of Qwen2.5-0.5B's projections (q/o 896 x 896, gate/up 4864 x 896, k/v 128 x 896, down 896 x 4864) and an odd
// one; ranks 8, 16, 64 and 5 (a partial chunk of ranks); out of place and in place.
TEST_P(OpsCuda, LoraMerge) {
  struct Case {
    int out, in;
  };
  for (const Case cs : {Case{896, 896}, Case{4864, 896}, Case{128, 896}, Case{896, 4864}, Case{70, 33}}) {
    for (const int r : {8, 16, 64, 5}) {
      const int out = cs.out, in = cs.in;
      const std::string tag = "merge " + std::to_string(out) + "x" + std::to_string(in) + " r" + std::to_string(r);
      const float scale = 32.0f / static_cast<float>(r);
      const float a_bound = 1.0f / std::sqrt(static_cast<float>(in));
      Pair W = storage(randu(sz(out, in), 90, -0.05f, 0.05f));
      Pair A = f32(randu(sz(r, in), 91, -a_bound, a_bound));
      Pair B = f32(randu(sz(out, r), 92, -0.02f, 0.02f));
      Pair Wm = storage(Vec(sz(out, in), 0.0f));
      cpu_->lora_merge(Wm.c, W.c, static_cast<const float*>(A.c), static_cast<const float*>(B.c), scale, out, in, r);
      gpu_->lora_merge(Wm.g, W.g, static_cast<const float*>(A.g), static_cast<const float*>(B.g), scale, out, in, r);
      const Vec want = rounded(cpu_values(Wm));
      const Vec got = gpu_values(Wm);
      std::size_t mismatches = 0;
      double worst = 0;
      for (std::size_t i = 0; i < want.size(); ++i)
        if (got[i] != want[i]) {
          ++mismatches;
          worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]) / std::max(1e-30, std::fabs(double(want[i]))));
        }
      EXPECT_EQ(mismatches, 0u) << tag << ": worst relative difference " << worst;
      expect_close_vec(tag, want, got, st() == DType::BF16 ? 4e-3 : 5e-4);
      // The merge changed W (the comparison is not of two copies of W).
      EXPECT_NE(got, gpu_values(W)) << tag;
      // In place (Wm = W) gives the same values.
      gpu_->lora_merge(W.g, W.g, static_cast<const float*>(A.g), static_cast<const float*>(B.g), scale, out, in, r);
      EXPECT_EQ(gpu_values(W), got) << tag << " in place";
    }
  }
  gpu_->synchronize();
}

TEST_P(OpsCuda, Dropout) {
  const int rows = 13, cols = 77;
  const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
  const float p = 0.3f;
  const std::uint64_t seed = 0x1234abcdull;
  // Row keys as the training executor makes them (random_bits of a sequence's key and a position), two rows alike.
  std::vector<std::uint64_t> keys;
  for (int t = 0; t < rows; ++t)
    keys.push_back(random_bits(static_cast<std::uint64_t>(t % 5), static_cast<std::uint64_t>(t / 5)));
  keys[7] = keys[2];
  Pair k;
  k.c = own(*cpu_, keys.size() * 8);
  k.g = own(*gpu_, keys.size() * 8);
  cpu_->upload(k.c, keys.data(), keys.size() * 8);
  gpu_->upload(k.g, keys.data(), keys.size() * 8);
  const auto* kc = static_cast<const std::uint64_t*>(k.c);
  const auto* kg = static_cast<const std::uint64_t*>(k.g);
  Pair x = storage(randu(sz(n), 40, 0.5f, 1.5f));  // no zeros: a zero output means dropped
  Pair out = storage(Vec(sz(n), 0.0f));
  cpu_->dropout(out.c, x.c, rows, cols, p, seed, kc);
  gpu_->dropout(out.g, x.g, rows, cols, p, seed, kg);
  const Vec c = cpu_values(out), g = gpu_values(out);
  int mismatched = 0, dropped = 0, same_rows = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    mismatched += (c[i] == 0.0f) != (g[i] == 0.0f);
    dropped += c[i] == 0.0f;
  }
  for (int j = 0; j < cols; ++j) same_rows += (c[sz(2 * cols + j)] == 0.0f) == (c[sz(7 * cols + j)] == 0.0f);
  EXPECT_EQ(mismatched, 0) << "dropout masks differ";
  EXPECT_EQ(same_rows, cols) << "rows of one key share a mask";
  EXPECT_GT(dropped, 200);
  EXPECT_LT(dropped, 400);
  expect_close("dropout out", out, tol());
  // In place.
  cpu_->dropout(x.c, x.c, rows, cols, p, seed + 1, kc);
  gpu_->dropout(x.g, x.g, rows, cols, p, seed + 1, kg);
  expect_close("dropout in place", x, tol());
}

// NEFTune's noise (Ops::add_uniform_noise): the same draws on both backends (a counter-based stream per row key),
// in place on the storage dtype, each row's magnitude its own.
TEST_P(OpsCuda, AddUniformNoiseMatchesCpu) {
  const int rows = 11, cols = 67;
  const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
  std::vector<std::uint64_t> keys;
  for (int t = 0; t < rows; ++t) keys.push_back(random_bits(static_cast<std::uint64_t>(t % 4), static_cast<std::uint64_t>(t)));
  Pair k;
  k.c = own(*cpu_, keys.size() * 8);
  k.g = own(*gpu_, keys.size() * 8);
  cpu_->upload(k.c, keys.data(), keys.size() * 8);
  gpu_->upload(k.g, keys.data(), keys.size() * 8);
  Vec scale_host(sz(rows));
  for (int t = 0; t < rows; ++t) scale_host[sz(t)] = 0.05f * static_cast<float>(t + 1);
  Pair scale = f32(scale_host);
  Pair x = storage(randu(sz(n), 41, -1.0f, 1.0f));
  const Vec before = cpu_values(x);
  cpu_->add_uniform_noise(x.c, rows, cols, static_cast<const float*>(scale.c), 77, static_cast<const std::uint64_t*>(k.c));
  gpu_->add_uniform_noise(x.g, rows, cols, static_cast<const float*>(scale.g), 77, static_cast<const std::uint64_t*>(k.g));
  const Vec after = cpu_values(x);
  double moved = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    const float bound = scale_host[i / sz(cols)];
    EXPECT_LE(std::fabs(after[i] - before[i]), bound * 1.0001f) << i;
    moved += std::fabs(after[i] - before[i]);
  }
  EXPECT_GT(moved, 0.0);
  expect_close("add_uniform_noise", x, tol());
}

TEST_P(OpsCuda, Rope) {
  const int T = 23, n_heads = 3, head_dim = 46;  // half = 23
  Vec inv(sz(head_dim / 2));
  for (int j = 0; j < head_dim / 2; ++j) inv[j] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * j / head_dim));
  Pair inv_freq = f32(inv);
  Ids pos_host;
  std::mt19937 gen(50);
  for (int t = 0; t < T; ++t) pos_host.push_back(t < 10 ? t : static_cast<std::int32_t>(gen() % 5000));
  Pair pos = i32(pos_host);
  Pair x = storage(randu(sz(T, n_heads, head_dim), 51));
  cpu_->rope_forward(x.c, static_cast<const std::int32_t*>(pos.c), static_cast<const float*>(inv_freq.c), T, n_heads,
                     head_dim);
  gpu_->rope_forward(x.g, static_cast<const std::int32_t*>(pos.g), static_cast<const float*>(inv_freq.g), T, n_heads,
                     head_dim);
  expect_close("rope forward", x, tol());
  Pair dx = storage(randu(sz(T, n_heads, head_dim), 52));
  cpu_->rope_backward(dx.c, static_cast<const std::int32_t*>(pos.c), static_cast<const float*>(inv_freq.c), T,
                      n_heads, head_dim);
  gpu_->rope_backward(dx.g, static_cast<const std::int32_t*>(pos.g), static_cast<const float*>(inv_freq.g), T,
                      n_heads, head_dim);
  expect_close("rope backward", dx, tol());
}

// Attention over packed variable-length sequences: each case lists B sequences' lengths (<= L); they are packed
// back to back (T = sum of lengths, cu_seqlens = prefix sums, max_len = L, which may exceed the longest length).
// head_dim 64 and 128 take tensor-core kernels (flash_attention.cu; on Volta flash_attention_sm70.cu), other
// head_dims the straightforward ones. MGRL_CUDA_ATTENTION selects a path for the reruns below: "naive" (fallback
// kernels at every head_dim), "mma_k8" (fp16: the m16n8k8 form that sm_75 runs, on this GPU) and "sm70" (fp16: the
// Volta wmma kernels, on this GPU).
struct AttnCase {
  int B, L, n_heads, n_kv, head_dim;
  Ids lengths;
};

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// The attention cases as fixture helpers, so that every kernel path runs the same ones.
class OpsCudaAttention : public OpsCuda {
 protected:
  // Tensor-core kernels: query/key blocks of 64, lengths not multiples of the tiles, lengths 0, 1, L and in between
  // (so sequences start at rows that are not multiples of 64 either).
  static const std::vector<AttnCase>& tiled_cases() {
    static const std::vector<AttnCase> cases = {
        {2, 33, 4, 2, 128, {33, 20}},           // shorter than one block
        {2, 77, 4, 2, 64, {77, 40}},            // GQA, groups of 2
        {4, 200, 14, 2, 64, {200, 0, 1, 131}},  // Qwen2.5-0.5B heads (groups of 7)
        {2, 130, 3, 3, 64, {130, 64}},          // MHA: dk/dv straight from the key-block kernel
        {4, 77, 14, 2, 128, {77, 0, 1, 50}},
        {3, 200, 4, 2, 128, {1, 200, 64}},
        {1, 128, 8, 1, 128, {128}},             // MQA, L a multiple of every tile
        {3, 140, 4, 2, 64, {70, 140, 5}},       // max_len 140 > the first sequence: blocks past its end exit
        {4, 97, 8, 2, 128, {31, 32, 33, 97}},   // GQA groups of 4; lengths about the 32-row tiles of the sm70 path
        {4, 97, 8, 2, 64, {97, 33, 32, 31}},
    };
    return cases;
  }

  // Runs one case against the CPU reference (out, lse, dq, dk, dv), checks the guard rows and determinism;
  // tolerance for the storage-dtype outputs (0: tol()).
  void run_case(const AttnCase& cs, const std::string& path, double tolerance = 0.0, const AttentionOptions& opt = {}) {
    if (tolerance == 0.0) tolerance = tol();
    constexpr int kGuard = 64;  // extra rows after the T packed rows of every tensor: no kernel may touch them
    const int B = cs.B, max_len = cs.L, nh = cs.n_heads, nkv = cs.n_kv, hd = cs.head_dim;
    Ids cu(static_cast<std::size_t>(B) + 1, 0);
    for (std::size_t b = 0; b < cs.lengths.size(); ++b) cu[b + 1] = cu[b] + cs.lengths[b];
    const int T = cu[static_cast<std::size_t>(B)];
    const int R = T + kGuard;  // rows allocated
    const std::string tag = path + "B" + std::to_string(B) + " T" + std::to_string(T) + " max_len" +
                            std::to_string(max_len) + " h" + std::to_string(nh) + "/" + std::to_string(nkv) + " d" +
                            std::to_string(hd) + " ";
    // The first n values must match the CPU; the rest (guard) must still hold the prefill on the GPU.
    auto check = [&](const std::string& what, const Pair& p, std::size_t n, float fill, double limit) {
      const Vec ref = cpu_values(p), got = gpu_values(p);
      expect_close_vec(tag + what, Vec(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(n)),
                       Vec(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(n)), limit);
      std::size_t touched = 0;
      for (std::size_t i = n; i < got.size(); ++i) touched += got[i] != fill;
      EXPECT_EQ(touched, 0u) << tag << what << ": values past the T packed rows were written";
    };
    Pair cus = i32(cu);
    const auto* cug = static_cast<const std::int32_t*>(cus.g);
    const auto* cuc = static_cast<const std::int32_t*>(cus.c);
    Pair q = storage(randu(sz(R, nh, hd), 60, -2.0f, 2.0f));
    Pair k = storage(randu(sz(R, nkv, hd), 61, -2.0f, 2.0f));
    Pair v = storage(randu(sz(R, nkv, hd), 62));
    Pair out = storage(Vec(sz(R, nh, hd), 3.0f));
    Pair lse = f32(Vec(sz(nh, T) + kGuard, 3.0f));  // [nh, T] and a guard
    cpu_->attention_forward(out.c, static_cast<float*>(lse.c), q.c, k.c, v.c, cuc, B, T, max_len, nh, nkv, hd, opt);
    gpu_->attention_forward(out.g, static_cast<float*>(lse.g), q.g, k.g, v.g, cug, B, T, max_len, nh, nkv, hd, opt);
    check("attention out", out, sz(T, nh, hd), 3.0f, tolerance);
    check("attention lse", lse, sz(nh, T), 3.0f, kF32Tol);

    // Backward from the CPU's lse on both sides (and each side's own out); dq/dk/dv prefilled with junk (every
    // row must be written, no row past T).
    Pair lse_ref = f32(cpu_values(lse));
    Pair dout = storage(randu(sz(R, nh, hd), 63));
    Pair dq = storage(Vec(sz(R, nh, hd), 7.0f));
    Pair dk = storage(Vec(sz(R, nkv, hd), 7.0f));
    Pair dv = storage(Vec(sz(R, nkv, hd), 7.0f));
    cpu_->attention_backward(dq.c, dk.c, dv.c, dout.c, out.c, q.c, k.c, v.c, static_cast<const float*>(lse_ref.c),
                             cuc, B, T, max_len, nh, nkv, hd, opt);
    gpu_->attention_backward(dq.g, dk.g, dv.g, dout.g, out.g, q.g, k.g, v.g, static_cast<const float*>(lse_ref.g),
                             cug, B, T, max_len, nh, nkv, hd, opt);
    check("attention dq", dq, sz(T, nh, hd), 7.0f, tolerance);
    check("attention dk", dk, sz(T, nkv, hd), 7.0f, tolerance);
    check("attention dv", dv, sz(T, nkv, hd), 7.0f, tolerance);
    gpu_->synchronize();  // no error bit set

    // Deterministic: the same backward again gives the same bits.
    std::vector<Vec> grads = {gpu_values(dq), gpu_values(dk), gpu_values(dv)};
    gpu_->attention_backward(dq.g, dk.g, dv.g, dout.g, out.g, q.g, k.g, v.g, static_cast<const float*>(lse_ref.g),
                             cug, B, T, max_len, nh, nkv, hd, opt);
    EXPECT_EQ(gpu_values(dq), grads[0]) << tag << "dq not deterministic";
    EXPECT_EQ(gpu_values(dk), grads[1]) << tag << "dk not deterministic";
    EXPECT_EQ(gpu_values(dv), grads[2]) << tag << "dv not deterministic";
  }

  // Malformed cu_seqlens for each head_dim, forward and backward (see Attention).
  void run_bad_cu_seqlens(const std::vector<int>& head_dims, const std::string& path) {
    struct BadCu {
      Ids cu;
      const char* what;
    };
    const std::vector<BadCu> bad = {
        {{0, 75, 80}, "a sequence longer than max_len"},
        {{0, 50, 40, 80}, "decreasing cu_seqlens"},
        {{0, 30, 60}, "cu_seqlens[B] != T"},
    };
    for (const int hd : head_dims) {
      for (const BadCu& bc : bad) {
        const int B = static_cast<int>(bc.cu.size()) - 1, T = 80, max_len = 70, nh = 2, nkv = 1;
        const std::string tag = path + "head_dim " + std::to_string(hd) + ", " + bc.what;
        Pair cus = i32(bc.cu);
        const auto* cug = static_cast<const std::int32_t*>(cus.g);
        Pair q = storage(randu(sz(T, nh, hd), 64));
        Pair kv = storage(randu(sz(T, nkv, hd), 65));
        Pair out = storage(Vec(sz(T, nh, hd), 0.0f));
        Pair lse = f32(Vec(sz(nh, T), 0.0f));
        gpu_->attention_forward(out.g, static_cast<float*>(lse.g), q.g, kv.g, kv.g, cug, B, T, max_len, nh, nkv, hd);
        EXPECT_THROW(gpu_->synchronize(), FatalError) << tag << " (forward)";
        gpu_->synchronize();  // the error word was cleared
        Pair dq = storage(Vec(sz(T, nh, hd), 0.0f));
        Pair dk = storage(Vec(sz(T, nkv, hd), 0.0f));
        Pair dv = storage(Vec(sz(T, nkv, hd), 0.0f));
        gpu_->attention_backward(dq.g, dk.g, dv.g, q.g, out.g, q.g, kv.g, kv.g, static_cast<const float*>(lse.g), cug,
                                 B, T, max_len, nh, nkv, hd);
        EXPECT_THROW(gpu_->synchronize(), FatalError) << tag << " (backward)";
        gpu_->synchronize();
      }
    }
  }
};

TEST_P(OpsCudaAttention, Attention) {
  const std::vector<AttnCase> fallback = {
      {3, 19, 6, 2, 40, {19, 11, 1}},   // GQA (groups of 3), head_dim not a multiple of 32, length 1
      {2, 8, 4, 4, 24, {0, 5}},          // MHA, an empty sequence, max_len above the longest
      {2, 13, 5, 1, 72, {13, 9}},        // MQA
      {2, 21, 4, 2, 10, {21, 6}},        // a small head_dim
      {2, 30, 4, 2, 33, {30, 17}},       // an odd head_dim
  };
  const std::vector<AttnCase>& tiled = tiled_cases();
  // fp16 at head_dim 64 runs tensor cores on every GPU the backend takes (sm_70+): the mma.sync kernels, or the
  // Volta ones on sm_7.0 and where the code was compiled for compute_70 only. A build with code for this GPU's own
  // architecture (CMAKE_CUDA_ARCHITECTURES naming it, or "native") runs the mma.sync kernels from sm_75 (fp16) and
  // sm_80 (bf16) on.
  std::printf("  [%s] attention kernels at head_dim 64: %s (built for %s)\n", dtype_name(st()),
              cuda_attention_kernels(st(), 64), build_info().cuda_architectures);
  if (st() == DType::F16) {
    EXPECT_STRNE(cuda_attention_kernels(st(), 64), "naive");
  }
  {
    int major = 0, minor = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
    const int cc = major * 10 + minor;
    bool own_code = false;
    std::string archs = build_info().cuda_architectures;
    for (std::size_t a = 0; a <= archs.size();) {
      const std::size_t b = std::min(archs.find(';', a), archs.size());
      const std::string arch = archs.substr(a, b - a);  // "90", "90-real", "90-virtual", "native"
      own_code = own_code || arch == "native" || arch.substr(0, arch.find('-')) == std::to_string(cc);
      a = b + 1;
    }
    if (own_code && cc >= (st() == DType::BF16 ? 80 : 75)) {
      EXPECT_STREQ(cuda_attention_kernels(st(), 64), "tiled");
    }
  }
  EXPECT_STREQ(cuda_attention_kernels(st(), 40), "naive");
  for (const AttnCase& cs : fallback) run_case(cs, "");
  for (const AttnCase& cs : tiled) run_case(cs, "");
  {
    const ScopedEnv env("MGRL_CUDA_ATTENTION", "naive");
    EXPECT_STREQ(cuda_attention_kernels(st(), 64), "naive");
    run_case(tiled[1], "naive ");
    run_case(tiled[4], "naive ");
    run_case(tiled[7], "naive ");
  }
  if (st() == DType::F16) {
    const ScopedEnv env("MGRL_CUDA_ATTENTION", "mma_k8");
    for (const AttnCase& cs : tiled) run_case(cs, "k8 ");
  }

  // Malformed cu_seqlens (the host cannot see them: device memory) are flagged by the kernels and reported at the
  // next synchronisation, on both paths, forward and backward: a sequence longer than max_len, a decreasing entry,
  // and an end other than T. T <= B * max_len holds in each, so the host-side checks pass.
  run_bad_cu_seqlens({64, 24}, "");
}

// The Volta kernels (flash_attention_sm70.cu: wmma, fp16), forced by MGRL_CUDA_ATTENTION=sm70 on whatever GPU this
// is (compute capability 7.0 or newer; on an H100 the same code the V100 runs): the tensor-core cases and the
// malformed cu_seqlens, against the CPU reference. On sm_70/sm_72 they are also the default path for fp16.
TEST_P(OpsCudaAttention, AttentionSm70) {
  if (st() != DType::F16) GTEST_SKIP() << "the Volta kernels store fp16";
  int major = 0, minor = 0, smem = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
  if (major * 10 + minor < 75) {
    EXPECT_STREQ(cuda_attention_kernels(DType::F16, 64), "sm70");
    EXPECT_STREQ(cuda_attention_kernels(DType::F16, 128), "sm70");
  }
  const ScopedEnv env("MGRL_CUDA_ATTENTION", "sm70");
  // head_dim 128 needs 71.25 KB of shared memory per block (sm_75's 64 KB is too little; sm_70 has 96 KB).
  const bool hd128 = smem >= cuda::sm70::max_smem(128);
  ASSERT_STREQ(cuda_attention_kernels(DType::F16, 64), "sm70") << "the Volta kernels do not run here";
  EXPECT_STREQ(cuda_attention_kernels(DType::F16, 128), hd128 ? "sm70" : "naive");
  EXPECT_STREQ(cuda_attention_kernels(DType::F16, 40), "naive");
  // Tighter than tol(): rounding the outputs and P / dS to fp16 gives about 3e-4 on these cases, while an online
  // softmax that forgot to rescale O when a later key tile raises a row's maximum gives about 8e-3 on some of them.
  for (const AttnCase& cs : tiled_cases())
    if (cs.head_dim == 64 || hd128) run_case(cs, "sm70 ", 3e-3);
  run_bad_cu_seqlens(hd128 ? std::vector<int>{64, 128} : std::vector<int>{64}, "sm70 ");
}

// Attention with the model-family options (kernels/attention_options.h) against the CPU reference: a score scale
// alone (Gemma's query_pre_attn_scalar), sliding windows shorter and longer than the sequences and than the 64-row
// tiles (Mistral, Gemma: key tiles before a block's window are skipped), soft-capping (Gemma 2) and all together; on
// the tiled kernels (head_dim 64, 128), the straightforward ones (head_dim 40, and MGRL_CUDA_ATTENTION=naive), and
// with fp16 the Volta selection (options: the straightforward kernels).
TEST_P(OpsCudaAttention, AttentionWindowSoftcapScale) {
  const std::vector<AttnCase> cases = {
      {3, 77, 4, 2, 64, {77, 40, 1}},
      {2, 97, 8, 2, 128, {97, 33}},
      {2, 230, 4, 2, 64, {230, 150}},
      {2, 200, 4, 1, 128, {200, 131}},
      {3, 19, 6, 2, 40, {19, 11, 1}},
  };
  const std::vector<AttentionOptions> options = {
      AttentionOptions{0.1f, 0, 0.0f}, AttentionOptions{0, 16, 0.0f},  AttentionOptions{0, 1, 0.0f},
      AttentionOptions{0, 70, 0.0f},   AttentionOptions{0, 500, 0.0f}, AttentionOptions{0, 0, 2.0f},
      AttentionOptions{0.2f, 5, 1.5f}, AttentionOptions{0.15f, 100, 3.0f}};
  auto tag_of = [](const AttentionOptions& o) {
    return "scale " + std::to_string(o.scale).substr(0, 4) + " window " + std::to_string(o.window) + " cap " +
           std::to_string(o.softcap).substr(0, 3) + " ";
  };
  for (const AttentionOptions& o : options)
    for (const AttnCase& cs : cases) run_case(cs, tag_of(o), 0.0, o);
  {
    const ScopedEnv env("MGRL_CUDA_ATTENTION", "naive");
    for (const AttentionOptions& o : options) run_case(cases[2], "naive " + tag_of(o), 0.0, o);
  }
  if (st() == DType::F16) {
    const ScopedEnv env("MGRL_CUDA_ATTENTION", "sm70");
    for (const AttentionOptions& o : options) run_case(cases[2], "sm70 selected " + tag_of(o), 0.0, o);
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, OpsCudaAttention, ::testing::Values(DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(info.param == DType::BF16 ? "bf16" : "fp16");
                         });

// NF4 dequantization (QLoRA base weights): the GPU writes code * absmax rounded once to the storage dtype, which is
// the CPU reference's f32 value rounded: equal bits, for plain and double-quantized absmax, whole and row ranges
// (an odd start too). Written without a GPU at hand: compiled for sm_80, never run (see the nf4 branch's report).
TEST_P(OpsCuda, DequantizeNf4) {
  const std::int64_t rows = 300, cols = 333;  // 99900 values: 1561 blocks (a tail of 60), 7 nested groups
  const std::int64_t n = rows * cols;
  Vec w = randu(sz(n), 41, -0.05f, 0.05f);
  for (std::int64_t r = 0; r < rows; r += 17) w[sz(r * cols)] = 0.4f;  // uneven absmax
  std::vector<std::uint8_t> codes(sz(cpu::nf4_code_bytes(n)));
  Vec absmax(sz(cpu::nf4_blocks(n)));
  cpu::nf4_quantize(w.data(), n, codes.data(), absmax.data());
  std::vector<std::uint8_t> qabsmax(absmax.size());
  Vec nested(sz(cpu::nf4_nested_blocks(n)));
  float offset = 0.0f;
  cpu::nf4_double_quantize(absmax.data(), static_cast<std::int64_t>(absmax.size()), qabsmax.data(), nested.data(),
                           &offset);
  auto bytes = [&](const std::vector<std::uint8_t>& v) {
    Pair p{own(*cpu_, v.size()), own(*gpu_, v.size()), v.size(), false};
    cpu_->upload(p.c, v.data(), v.size());
    gpu_->upload(p.g, v.data(), v.size());
    return p;
  };
  Pair pc = bytes(codes), pq = bytes(qabsmax);
  Pair pa = f32(absmax), pn = f32(nested);
  Pair code = f32(Vec(cpu::nf4_code(), cpu::nf4_code() + 16));
  Pair dyn = f32(Vec(cpu::dynamic_code(), cpu::dynamic_code() + 256));
  for (const bool dq : {false, true}) {
    Nf4Weight wc, wg;
    wc.codes = static_cast<const std::uint8_t*>(pc.c);
    wg.codes = static_cast<const std::uint8_t*>(pc.g);
    wc.code = static_cast<const float*>(code.c);
    wg.code = static_cast<const float*>(code.g);
    if (dq) {
      wc.qabsmax = static_cast<const std::uint8_t*>(pq.c);
      wg.qabsmax = static_cast<const std::uint8_t*>(pq.g);
      wc.nested_absmax = static_cast<const float*>(pn.c);
      wg.nested_absmax = static_cast<const float*>(pn.g);
      wc.nested_code = static_cast<const float*>(dyn.c);
      wg.nested_code = static_cast<const float*>(dyn.g);
      wc.offset = wg.offset = offset;
    } else {
      wc.absmax = static_cast<const float*>(pa.c);
      wg.absmax = static_cast<const float*>(pa.g);
    }
    const std::pair<std::int64_t, std::int64_t> ranges[] = {{0, n}, {7 * cols, 123 * cols}, {61, 5000}};
    for (const auto& [b, e] : ranges) {
      Pair out = storage(Vec(sz(e - b), 0.0f));
      cpu_->dequantize_nf4(out.c, wc, b, e);
      gpu_->dequantize_nf4(out.g, wg, b, e);
      EXPECT_EQ(gpu_values(out), rounded(cpu_values(out))) << (dq ? "double-quantized " : "plain ") << b << ".." << e;
    }
  }
  gpu_->synchronize();
}

TEST_P(OpsCuda, Swiglu) {
  const std::int64_t n = 1003;
  Pair gate = storage(randu(sz(n), 70, -4.0f, 4.0f));
  Pair up = storage(randu(sz(n), 71));
  Pair out = storage(Vec(sz(n), 0.0f));
  cpu_->swiglu_forward(out.c, gate.c, up.c, n);
  gpu_->swiglu_forward(out.g, gate.g, up.g, n);
  expect_close("swiglu out", out, tol());
  Pair dout = storage(randu(sz(n), 72));
  Pair dgate = storage(Vec(sz(n), 0.0f));
  Pair dup = storage(Vec(sz(n), 0.0f));
  cpu_->swiglu_backward(dgate.c, dup.c, dout.c, gate.c, up.c, n);
  gpu_->swiglu_backward(dgate.g, dup.g, dout.g, gate.g, up.g, n);
  expect_close("swiglu dgate", dgate, tol());
  expect_close("swiglu dup", dup, tol());
}

TEST_P(OpsCuda, Geglu) {
  const std::int64_t n = 1003;
  Pair gate = storage(randu(sz(n), 73, -4.0f, 4.0f));
  Pair up = storage(randu(sz(n), 74));
  Pair out = storage(Vec(sz(n), 0.0f));
  cpu_->geglu_forward(out.c, gate.c, up.c, n);
  gpu_->geglu_forward(out.g, gate.g, up.g, n);
  expect_close("geglu out", out, tol());
  Pair dout = storage(randu(sz(n), 75));
  Pair dgate = storage(Vec(sz(n), 0.0f));
  Pair dup = storage(Vec(sz(n), 0.0f));
  cpu_->geglu_backward(dgate.c, dup.c, dout.c, gate.c, up.c, n);
  gpu_->geglu_backward(dgate.g, dup.g, dout.g, gate.g, up.g, n);
  expect_close("geglu dgate", dgate, tol());
  expect_close("geglu dup", dup, tol());
}

// Gemma's RMSNorm scale (1 + w), forward and backward, and its embeddings scaled by sqrt(hidden) (the scale rounded
// to the storage dtype on the GPU: compared against the CPU with the same rounded scale).
TEST_P(OpsCuda, GemmaNormAndScaledEmbedding) {
  const int rows = 29, dim = 203;
  Pair x = storage(randu(sz(rows, dim), 15, -2.0f, 2.0f));
  Pair w = storage(randu(sz(dim), 16, -0.5f, 0.5f));
  Pair out = storage(Vec(sz(rows, dim), 0.0f));
  Pair rstd = f32(Vec(sz(rows), 0.0f));
  cpu_->rmsnorm_forward(out.c, static_cast<float*>(rstd.c), x.c, w.c, rows, dim, 1e-6f, true);
  gpu_->rmsnorm_forward(out.g, static_cast<float*>(rstd.g), x.g, w.g, rows, dim, 1e-6f, true);
  expect_close("rmsnorm (1 + w) out", out, tol());
  Pair rs = f32(cpu_values(rstd));
  Pair dout = storage(randu(sz(rows, dim), 17));
  Pair dx = storage(Vec(sz(rows, dim), 0.0f));
  Pair dw = f32(Vec(sz(dim), 0.0f));
  cpu_->rmsnorm_backward(dx.c, static_cast<float*>(dw.c), dout.c, x.c, w.c, static_cast<const float*>(rs.c), rows,
                         dim, false, true);
  gpu_->rmsnorm_backward(dx.g, static_cast<float*>(dw.g), dout.g, x.g, w.g, static_cast<const float*>(rs.g), rows,
                         dim, false, true);
  expect_close("rmsnorm (1 + w) dx", dx, tol());
  expect_close("rmsnorm (1 + w) dw", dw, kF32Tol);

  const int V = 101, D = 67, T = 23;
  Ids ids;
  for (int t = 0; t < T; ++t) ids.push_back(static_cast<std::int32_t>((t * 37) % V));
  Pair id = i32(ids);
  Pair table = storage(randu(sz(V, D), 18));
  Pair emb = storage(Vec(sz(T, D), 0.0f));
  const float scale = rounded({std::sqrt(2304.0f)})[0];
  cpu_->embedding_forward(emb.c, static_cast<const std::int32_t*>(id.c), table.c, T, V, D, scale);
  gpu_->embedding_forward(emb.g, static_cast<const std::int32_t*>(id.g), table.g, T, V, D, std::sqrt(2304.0f));
  expect_close("scaled embedding", emb, tol());
  Pair demb = storage(randu(sz(T, D), 19));
  Pair dtable = f32(Vec(sz(V, D), 0.0f));
  cpu_->embedding_backward(static_cast<float*>(dtable.c), demb.c, static_cast<const std::int32_t*>(id.c), T, V, D,
                           scale);
  gpu_->embedding_backward(static_cast<float*>(dtable.g), demb.g, static_cast<const std::int32_t*>(id.g), T, V, D,
                           std::sqrt(2304.0f));
  expect_close("scaled embedding dtable", dtable, kF32Tol);
}

// Final-logit soft-capping (Gemma 2) in the LM head: log-probs, their backward and full logits.
TEST_P(OpsCuda, LmHeadSoftcap) {
  const int T = 300, D = 67, V = 1012;
  const float cap = 2.5f;
  Ids tg;
  std::mt19937 gen(97);
  for (int t = 0; t < T; ++t) tg.push_back(t % 7 == 3 ? -1 : static_cast<std::int32_t>(gen() % V));
  Pair targets = i32(tg);
  Pair h = storage(randu(sz(T, D), 98));
  Pair W = storage(randu(sz(V, D), 99, -1.0f, 1.0f));
  for (const float logit_scale : {1.0f, 0.7f}) {
    Pair lp = f32(Vec(sz(T), 9.0f)), lse = f32(Vec(sz(T), 9.0f));
    cpu_->lm_head_logprob_forward(static_cast<float*>(lp.c), static_cast<float*>(lse.c), h.c, W.c,
                                  static_cast<const std::int32_t*>(targets.c), T, D, V, logit_scale, nullptr, cap);
    gpu_->lm_head_logprob_forward(static_cast<float*>(lp.g), static_cast<float*>(lse.g), h.g, W.g,
                                  static_cast<const std::int32_t*>(targets.g), T, D, V, logit_scale, nullptr, cap);
    expect_close("softcapped lm_head logprob", lp, kGemmF32Tol);
    expect_close("softcapped lm_head lse", lse, kF32Tol);
    Pair lse_ref = f32(cpu_values(lse));
    Pair weights = f32(randu(sz(T), 100));
    Pair dh = storage(Vec(sz(T, D), 0.0f));
    Pair dW = f32(Vec(sz(V, D), 0.0f));
    cpu_->lm_head_logprob_backward(dh.c, static_cast<float*>(dW.c), static_cast<const float*>(weights.c), h.c, W.c,
                                   static_cast<const std::int32_t*>(targets.c), static_cast<const float*>(lse_ref.c),
                                   T, D, V, logit_scale, nullptr, cap);
    gpu_->lm_head_logprob_backward(dh.g, static_cast<float*>(dW.g), static_cast<const float*>(weights.g), h.g, W.g,
                                   static_cast<const std::int32_t*>(targets.g), static_cast<const float*>(lse_ref.g),
                                   T, D, V, logit_scale, nullptr, cap);
    expect_close("softcapped lm_head dh", dh, tol());
    expect_close("softcapped lm_head dW", dW, tol());
    Pair logits = f32(Vec(sz(45, V), 0.0f));
    cpu_->lm_head_logits(static_cast<float*>(logits.c), h.c, W.c, 45, D, V, logit_scale, cap);
    gpu_->lm_head_logits(static_cast<float*>(logits.g), h.g, W.g, 45, D, V, logit_scale, cap);
    expect_close("softcapped lm_head logits", logits, kGemmF32Tol);
  }
}

// GRPO's entropy bonus in the head's backward (entropy weights beside the forward's per-row entropies): dh and dW
// against the CPU, plain, tempered and soft-capped, with rows of zero entropy weight (computed as without) among them.
TEST_P(OpsCuda, LmHeadBackwardEntropyTermMatchesCpu) {
  const int T = 1100, D = 67, V = 1012;  // more rows than a chunk (1024 at this V): the second chunk's offsets too
  Ids tg;
  std::mt19937 gen(31);
  for (int t = 0; t < T; ++t) tg.push_back(t % 9 == 4 ? -1 : static_cast<std::int32_t>(gen() % V));
  Pair targets = i32(tg);
  Pair h = storage(randu(sz(T, D), 32));
  Pair W = storage(randu(sz(V, D), 33, -1.0f, 1.0f));
  Vec ew_host = randu(sz(T), 34, 0.0f, 0.2f);
  for (int t = 0; t < T; t += 5) ew_host[sz(t)] = 0.0f;
  Pair ew = f32(ew_host);
  for (const float cap : {0.0f, 2.5f})
    for (const float logit_scale : {1.0f, 0.7f}) {
      Pair lp = f32(Vec(sz(T), 0.0f)), lse = f32(Vec(sz(T), 0.0f)), stats = f32(Vec(sz(4 * T), 0.0f));
      cpu_->lm_head_logprob_forward(static_cast<float*>(lp.c), static_cast<float*>(lse.c), h.c, W.c,
                                    static_cast<const std::int32_t*>(targets.c), T, D, V, logit_scale, nullptr, cap,
                                    static_cast<float*>(stats.c));
      Pair lse_ref = f32(cpu_values(lse));
      Pair ent = f32(cpu_values(stats));  // the CPU's entropies on both sides (their first T values)
      Pair weights = f32(randu(sz(T), 35));
      Pair dh = storage(Vec(sz(T, D), 0.0f));
      Pair dW = f32(Vec(sz(V, D), 0.0f));
      cpu_->lm_head_logprob_backward(dh.c, static_cast<float*>(dW.c), static_cast<const float*>(weights.c), h.c, W.c,
                                     static_cast<const std::int32_t*>(targets.c), static_cast<const float*>(lse_ref.c),
                                     T, D, V, logit_scale, nullptr, cap, static_cast<const float*>(ew.c),
                                     static_cast<const float*>(ent.c));
      gpu_->lm_head_logprob_backward(dh.g, static_cast<float*>(dW.g), static_cast<const float*>(weights.g), h.g, W.g,
                                     static_cast<const std::int32_t*>(targets.g), static_cast<const float*>(lse_ref.g),
                                     T, D, V, logit_scale, nullptr, cap, static_cast<const float*>(ew.g),
                                     static_cast<const float*>(ent.g));
      expect_close("lm_head dh with the entropy term", dh, tol());
      expect_close("lm_head dW with the entropy term", dW, tol());
    }
}

// trl's metrics from the head's row pass (entropy, top-1 hit, mean logit, log sum p^2), fused forward-backward included, against the CPU:
// entropies within the GEMM tolerance, top-1 hits equal except on rows whose two best logits are closer than the
// GEMMs' rounding can tell apart; lp and lse as without them.
TEST_P(OpsCuda, LmHeadStats) {
  for (const int V : {1012, 1024}) {
    const int T = 300, D = 67;
    Pair h = storage(randu(sz(T, D), 91));
    Pair W = storage(randu(sz(V, D), 92, -1.0f, 1.0f));
    // Targets: the CPU's argmax on even rows (hits), random elsewhere, some ignored.
    Pair full = f32(Vec(sz(T, V), 0.0f));
    cpu_->lm_head_logits(static_cast<float*>(full.c), h.c, W.c, T, D, V, 1.0f);
    const Vec logits = cpu_values(full);
    Ids tg;
    std::mt19937 gen(93);
    std::vector<float> gap(static_cast<std::size_t>(T));
    for (int t = 0; t < T; ++t) {
      const float* l = logits.data() + sz(t, V);
      int best = 0;
      for (int v = 1; v < V; ++v)
        if (l[v] > l[best]) best = v;
      float second = -INFINITY;
      for (int v = 0; v < V; ++v)
        if (v != best) second = std::max(second, l[v]);
      gap[static_cast<std::size_t>(t)] = l[best] - second;
      tg.push_back(t % 9 == 4 ? -1 : (t % 2 == 0 ? best : static_cast<std::int32_t>(gen() % V)));
    }
    Pair targets = i32(tg);
    for (const bool fused : {false, true}) {
      Pair lp = f32(Vec(sz(T), 9.0f)), lse = f32(Vec(sz(T), 9.0f)), stats = f32(Vec(sz(4, T), 9.0f));
      Pair weights = f32(randu(sz(T), 94));
      Pair dh = storage(Vec(sz(T, D), 0.0f));
      if (fused) {
        cpu_->lm_head_logprob_forward_backward(static_cast<float*>(lp.c), static_cast<float*>(lse.c), dh.c, nullptr,
                                               static_cast<const float*>(weights.c), h.c, W.c,
                                               static_cast<const std::int32_t*>(targets.c), T, D, V, 1.0f, nullptr,
                                               0.0f, static_cast<float*>(stats.c));
        gpu_->lm_head_logprob_forward_backward(static_cast<float*>(lp.g), static_cast<float*>(lse.g), dh.g, nullptr,
                                               static_cast<const float*>(weights.g), h.g, W.g,
                                               static_cast<const std::int32_t*>(targets.g), T, D, V, 1.0f, nullptr,
                                               0.0f, static_cast<float*>(stats.g));
      } else {
        cpu_->lm_head_logprob_forward(static_cast<float*>(lp.c), static_cast<float*>(lse.c), h.c, W.c,
                                      static_cast<const std::int32_t*>(targets.c), T, D, V, 1.0f, nullptr, 0.0f,
                                      static_cast<float*>(stats.c));
        gpu_->lm_head_logprob_forward(static_cast<float*>(lp.g), static_cast<float*>(lse.g), h.g, W.g,
                                      static_cast<const std::int32_t*>(targets.g), T, D, V, 1.0f, nullptr, 0.0f,
                                      static_cast<float*>(stats.g));
      }
      expect_close("lm_head logprob with stats", lp, kGemmF32Tol);
      expect_close("lm_head lse with stats", lse, kF32Tol);
      const Vec sc = cpu_values(stats), sg = gpu_values(stats);
      int hits = 0;
      for (int t = 0; t < T; ++t) {
        EXPECT_NEAR(sg[sz(t)], sc[sz(t)], 1e-3 + 1e-3 * std::fabs(sc[sz(t)])) << "entropy of row " << t << " V " << V;
        EXPECT_NEAR(sg[sz(2 * T + t)], sc[sz(2 * T + t)], 1e-3) << "mean logit of row " << t << " V " << V;
        EXPECT_NEAR(sg[sz(3 * T + t)], sc[sz(3 * T + t)], 1e-3 + 1e-3 * std::fabs(sc[sz(3 * T + t)]))
            << "log sum p^2 of row " << t << " V " << V;
        const float hc = sc[sz(T) + sz(t)], hg = sg[sz(T) + sz(t)];
        if (gap[static_cast<std::size_t>(t)] > 1e-2f) {
          EXPECT_EQ(hg, hc) << "top-1 of row " << t << " V " << V;
        }
        hits += hc > 0.5f ? 1 : 0;
        if (tg[static_cast<std::size_t>(t)] < 0) {
          EXPECT_EQ(sg[sz(t)], 0.0f) << t;
        }
      }
      EXPECT_GT(hits, T / 3) << "too few hits: the test checks little";
    }
  }
}

// Cached attention with a window and soft-capping: long caches (decode split over the KV length, splits before the
// window empty) and short ones, against the CPU; with a window the blocks before it may be absent (-1).
TEST_P(OpsCuda, KvCacheWindowSoftcap) {
  for (const int max_len : {40, 1000}) {
    const int nh = 8, nkv = 2, hd = 64, bs = 16, slots = 2, per_slot = (max_len + bs - 1) / bs;
    Ids table_h(static_cast<std::size_t>(slots * per_slot));
    std::iota(table_h.begin(), table_h.end(), 0);
    Pair table = i32(table_h);
    const KvPages pc{static_cast<const std::int32_t*>(table.c), slots, per_slot, bs, slots * per_slot};
    const KvPages pg{static_cast<const std::int32_t*>(table.g), slots, per_slot, bs, slots * per_slot};
    const int len = max_len - 2;
    Ids slot_h, pos_h;
    for (int s = 0; s < slots; ++s)
      for (int t = 0; t < len; ++t) {
        slot_h.push_back(s);
        pos_h.push_back(t);
      }
    const int T = static_cast<int>(slot_h.size());
    Pair slot = i32(slot_h), pos = i32(pos_h);
    Pair k = storage(randu(sz(T, nkv, hd), 130, -2.0f, 2.0f)), v = storage(randu(sz(T, nkv, hd), 131));
    Pair q = storage(randu(sz(T, nh, hd), 132, -2.0f, 2.0f));
    Pair ck = storage(Vec(sz(slots * per_slot, bs, nkv, hd), 0.0f)), cv = storage(Vec(ck.n, 0.0f));
    const auto *sc = static_cast<const std::int32_t*>(slot.c), *sg = static_cast<const std::int32_t*>(slot.g);
    const auto *pcp = static_cast<const std::int32_t*>(pos.c), *pgp = static_cast<const std::int32_t*>(pos.g);
    cpu_->kv_store(ck.c, cv.c, k.c, v.c, sc, pcp, T, pc, nkv, hd);
    gpu_->kv_store(ck.g, cv.g, k.g, v.g, sg, pgp, T, pg, nkv, hd);
    for (const AttentionOptions& o : {AttentionOptions{0, 7, 0.0f}, AttentionOptions{0.1f, 100, 1.5f}}) {
      const std::string tag = "len " + std::to_string(max_len) + " window " + std::to_string(o.window) + " ";
      Pair out = storage(Vec(sz(T, nh, hd), 3.0f));
      cpu_->attention_cached(out.c, q.c, ck.c, cv.c, sc, pcp, T, pc, nh, nkv, hd, o);
      gpu_->attention_cached(out.g, q.g, ck.g, cv.g, sg, pgp, T, pg, nh, nkv, hd, o);
      expect_close(tag + "attention_cached prefill", out, tol());
      // One decode row per slot at the last position, with every block before the window cut from the table.
      Ids cut = table_h;
      const int last = len - 1, first_block = std::max(0, last - o.window + 1) / bs;
      for (int s = 0; s < slots; ++s)
        for (int b = 0; b < first_block; ++b) cut[static_cast<std::size_t>(s * per_slot + b)] = -1;
      Pair cut_table = i32(cut);
      const KvPages cc{static_cast<const std::int32_t*>(cut_table.c), slots, per_slot, bs, slots * per_slot};
      const KvPages cg{static_cast<const std::int32_t*>(cut_table.g), slots, per_slot, bs, slots * per_slot};
      Pair ds = i32({0, 1}), dp = i32({last, last});
      Pair dq = storage(randu(sz(2, nh, hd), 133, -2.0f, 2.0f));
      Pair dout = storage(Vec(sz(2, nh, hd), 3.0f));
      cpu_->attention_cached(dout.c, dq.c, ck.c, cv.c, static_cast<const std::int32_t*>(ds.c),
                             static_cast<const std::int32_t*>(dp.c), 2, cc, nh, nkv, hd, o);
      gpu_->attention_cached(dout.g, dq.g, ck.g, cv.g, static_cast<const std::int32_t*>(ds.g),
                             static_cast<const std::int32_t*>(dp.g), 2, cg, nh, nkv, hd, o);
      expect_close(tag + "attention_cached decode (blocks before the window absent)", dout, tol());
      EXPECT_NO_THROW(gpu_->synchronize()) << tag;
    }
  }
}

TEST_P(OpsCuda, Residual) {
  const std::int64_t n = 1003;
  Pair x = storage(randu(sz(n), 80));
  Pair y = storage(randu(sz(n), 81));
  cpu_->residual_forward(x.c, y.c, n);
  gpu_->residual_forward(x.g, y.g, n);
  expect_close("residual x += y", x, tol());
}

TEST_P(OpsCuda, LmHead) {
  const int D = 67;
  // V 1009: the row kernels' scalar path; 1012 (a multiple of 4): their 16-byte loads. 2500 rows: three chunks of
  // the GPU's 1024 (lm_head_chunk_rows at these V), the last partial; 300: several of the CPU's 32.
  for (const auto& [T, V] : {std::pair<int, int>{45, 1009}, {300, 1009}, {300, 1012}, {2500, 1012}}) {
    for (const float logit_scale : {1.0f, 0.7f}) {
      const std::string tag =
          "T" + std::to_string(T) + " V" + std::to_string(V) + " s" + std::to_string(logit_scale).substr(0, 3) + " ";
      Ids tg;
      std::mt19937 gen(90 + T);
      for (int t = 0; t < T; ++t) tg.push_back(t % 7 == 3 ? -1 : static_cast<std::int32_t>(gen() % V));
      Pair targets = i32(tg);
      Pair h = storage(randu(sz(T, D), 91));
      Pair W = storage(randu(sz(V, D), 92, -0.5f, 0.5f));
      void* scratch_c = own(*cpu_, cpu_->lm_head_scratch_bytes(V));
      void* scratch_g = own(*gpu_, gpu_->lm_head_scratch_bytes(V));
      Pair lp = f32(Vec(sz(T), 9.0f));
      Pair lse = f32(Vec(sz(T), 9.0f));
      for (bool own_scratch : {true, false}) {
        cpu_->lm_head_logprob_forward(static_cast<float*>(lp.c), static_cast<float*>(lse.c), h.c, W.c,
                                      static_cast<const std::int32_t*>(targets.c), T, D, V, logit_scale,
                                      own_scratch ? scratch_c : nullptr);
        gpu_->lm_head_logprob_forward(static_cast<float*>(lp.g), static_cast<float*>(lse.g), h.g, W.g,
                                      static_cast<const std::int32_t*>(targets.g), T, D, V, logit_scale,
                                      own_scratch ? scratch_g : nullptr);
        const std::string s = own_scratch ? "" : " (op scratch)";
        expect_close(tag + "lm_head logprob" + s, lp, kGemmF32Tol);
        expect_close(tag + "lm_head lse" + s, lse, kF32Tol);
      }

      // Backward from the CPU's lse; weights with zeros; dW accumulates onto small random values, so its
      // increment is compared (dlogits are rounded to the storage dtype before the GEMMs: storage tolerance).
      Pair lse_ref = f32(cpu_values(lse));
      Vec wv = randu(sz(T), 93, -1.0f, 1.0f);
      for (int t = 0; t < T; t += 5) wv[static_cast<std::size_t>(t)] = 0.0f;
      Pair weights = f32(wv);
      Pair dh = storage(Vec(sz(T, D), 7.0f));
      const Vec dW0 = randu(sz(V, D), 94, -0.01f, 0.01f);
      Pair dW = f32(dW0);
      cpu_->lm_head_logprob_backward(dh.c, static_cast<float*>(dW.c), static_cast<const float*>(weights.c), h.c, W.c,
                                     static_cast<const std::int32_t*>(targets.c),
                                     static_cast<const float*>(lse_ref.c), T, D, V, logit_scale, scratch_c);
      gpu_->lm_head_logprob_backward(dh.g, static_cast<float*>(dW.g), static_cast<const float*>(weights.g), h.g, W.g,
                                     static_cast<const std::int32_t*>(targets.g),
                                     static_cast<const float*>(lse_ref.g), T, D, V, logit_scale, scratch_g);
      expect_close(tag + "lm_head dh", dh, tol());
      Vec inc_c = cpu_values(dW), inc_g = gpu_values(dW);
      for (std::size_t i = 0; i < dW0.size(); ++i) {
        inc_c[i] -= dW0[i];
        inc_g[i] -= dW0[i];
      }
      expect_close_vec(tag + "lm_head dW increment", inc_c, inc_g, tol());
      // Without dW, and with the op's own scratch.
      cpu_->lm_head_logprob_backward(dh.c, nullptr, static_cast<const float*>(weights.c), h.c, W.c,
                                     static_cast<const std::int32_t*>(targets.c),
                                     static_cast<const float*>(lse_ref.c), T, D, V, logit_scale, nullptr);
      gpu_->lm_head_logprob_backward(dh.g, nullptr, static_cast<const float*>(weights.g), h.g, W.g,
                                     static_cast<const std::int32_t*>(targets.g),
                                     static_cast<const float*>(lse_ref.g), T, D, V, logit_scale, nullptr);
      expect_close(tag + "lm_head dh (no dW)", dh, tol());
    }
  }
  // Full logits.
  const int T = 45, V = 1009;
  Pair h = storage(randu(sz(T, D), 95));
  Pair W = storage(randu(sz(V, D), 96, -0.5f, 0.5f));
  Pair logits = f32(Vec(sz(T, V), 0.0f));
  cpu_->lm_head_logits(static_cast<float*>(logits.c), h.c, W.c, T, D, V, 0.7f);
  gpu_->lm_head_logits(static_cast<float*>(logits.g), h.g, W.g, T, D, V, 0.7f);
  expect_close("lm_head logits", logits, kGemmF32Tol);

  // A target >= V is reported at the next synchronisation.
  Pair bad = i32({V});
  Pair lp = f32({0.0f}), lse = f32({0.0f});
  gpu_->lm_head_logprob_forward(static_cast<float*>(lp.g), static_cast<float*>(lse.g), h.g, W.g,
                                static_cast<const std::int32_t*>(bad.g), 1, D, V, 1.0f, nullptr);
  EXPECT_THROW(gpu_->synchronize(), FatalError);
  EXPECT_NO_THROW(gpu_->synchronize());
}

// SFT's fused LM head (forward and backward in one pass over each chunk of logits) against the CPU reference, and
// bitwise against the GPU's own forward then backward (the same launches in the same order): 300 rows (one GPU
// chunk) and 2500 (three, the last partial), V a multiple of 4 and not, soft-cap and logit_scale, ignored rows and
// zero weights, dW accumulated or null.
TEST_P(OpsCuda, LmHeadForwardBackward) {
  const int D = 67;
  for (const auto& shape :
       {std::tuple<int, int, float, float>{300, 1009, 0.0f, 1.0f}, {2500, 1012, 0.0f, 0.7f}, {300, 1012, 2.5f, 0.7f},
        {2500, 1009, 2.5f, 1.0f}}) {
    // Plain variables, not a structured binding: the lambdas below capture them (C++17, clang).
    const int T = std::get<0>(shape), V = std::get<1>(shape);
    const float cap = std::get<2>(shape), logit_scale = std::get<3>(shape);
    const std::string tag = "T" + std::to_string(T) + " V" + std::to_string(V) + " cap" +
                            std::to_string(cap).substr(0, 3) + " s" + std::to_string(logit_scale).substr(0, 3) + " ";
    Ids tg;
    std::mt19937 gen(190 + T + V);
    for (int t = 0; t < T; ++t) tg.push_back(t % 7 == 3 ? -1 : static_cast<std::int32_t>(gen() % V));
    Pair targets = i32(tg);
    const auto* tc = static_cast<const std::int32_t*>(targets.c);
    const auto* tgp = static_cast<const std::int32_t*>(targets.g);
    Pair h = storage(randu(sz(T, D), 191));
    Pair W = storage(randu(sz(V, D), 192, -1.0f, 1.0f));
    Vec wv = randu(sz(T), 193, -1.0f, 1.0f);
    for (int t = 0; t < T; t += 5) wv[static_cast<std::size_t>(t)] = 0.0f;
    Pair weights = f32(wv);
    const auto* wc = static_cast<const float*>(weights.c);
    const auto* wg = static_cast<const float*>(weights.g);
    void* scratch_c = own(*cpu_, cpu_->lm_head_scratch_bytes(V));
    void* scratch_g = own(*gpu_, gpu_->lm_head_scratch_bytes(V));
    const Vec dW0 = randu(sz(V, D), 194, -0.01f, 0.01f);
    // The four outputs, filled with values every op must overwrite (dW: a start it must add to).
    auto outputs = [&] {
      return std::array<Pair, 4>{f32(Vec(sz(T), 9.0f)), f32(Vec(sz(T), 9.0f)), storage(Vec(sz(T, D), 7.0f)), f32(dW0)};
    };
    // Forward then backward on one backend: the CPU's pointers (.c) or the GPU's (.g).
    auto forward_then_backward = [&](bool gpu, std::array<Pair, 4>& o, bool with_dW, void* scratch) {
      Ops& ops = gpu ? *gpu_ : *cpu_;
      auto at = [gpu](const Pair& p) { return gpu ? p.g : p.c; };
      const auto* tp = gpu ? tgp : tc;
      ops.lm_head_logprob_forward(static_cast<float*>(at(o[0])), static_cast<float*>(at(o[1])), at(h), at(W), tp, T,
                                  D, V, logit_scale, scratch, cap);
      ops.lm_head_logprob_backward(at(o[2]), with_dW ? static_cast<float*>(at(o[3])) : nullptr, gpu ? wg : wc, at(h),
                                   at(W), tp, static_cast<const float*>(at(o[1])), T, D, V, logit_scale, scratch, cap);
    };
    for (const bool with_dW : {true, false}) {
      const std::string t2 = tag + (with_dW ? "dW " : "no dW ");
      // The CPU reference: forward then backward. The GPU: the fused op.
      std::array<Pair, 4> o = outputs();
      Pair &lp = o[0], &lse = o[1], &dh = o[2], &dW = o[3];
      forward_then_backward(false, o, with_dW, scratch_c);
      gpu_->lm_head_logprob_forward_backward(static_cast<float*>(lp.g), static_cast<float*>(lse.g), dh.g,
                                             with_dW ? static_cast<float*>(dW.g) : nullptr, wg, h.g, W.g, tgp, T, D,
                                             V, logit_scale, scratch_g, cap);
      expect_close(t2 + "fused lm_head logprob", lp, kGemmF32Tol);
      expect_close(t2 + "fused lm_head lse", lse, kF32Tol);
      expect_close(t2 + "fused lm_head dh", dh, tol());
      Vec inc_c = cpu_values(dW), inc_g = gpu_values(dW);
      for (std::size_t i = 0; i < dW0.size(); ++i) {
        inc_c[i] -= dW0[i];
        inc_g[i] -= dW0[i];
      }
      expect_close_vec(t2 + "fused lm_head dW increment", inc_c, inc_g, tol());
      // The GPU's forward then backward (the op's own scratch) give the same bits as its fused pass.
      std::array<Pair, 4> o2 = outputs();
      const Pair &lp2 = o2[0], &lse2 = o2[1], &dh2 = o2[2], &dW2 = o2[3];
      forward_then_backward(true, o2, with_dW, nullptr);
      EXPECT_EQ(gpu_values(lp), gpu_values(lp2)) << t2 << "GPU logprob: fused vs forward then backward";
      EXPECT_EQ(gpu_values(lse), gpu_values(lse2)) << t2 << "GPU lse: fused vs forward then backward";
      EXPECT_EQ(gpu_values(dh), gpu_values(dh2)) << t2 << "GPU dh: fused vs forward then backward";
      EXPECT_EQ(gpu_values(dW), gpu_values(dW2)) << t2 << "GPU dW: fused vs forward then backward";
    }
  }
}

// Knowledge distillation's divergence fused with the student's LM head against the CPU: forward KL (beta 0), reverse
// KL (beta 1) and the generalized JSD (beta 0.4), plain and soft-capped (the teacher with a cap of its own), tempered
// (logit_scale = t_logit_scale = 1 / 0.8), a teacher of another width (Dt != D), 37 rows, V not a multiple of 4 (the
// row kernels' scalar path) and a multiple (their 16-byte loads), rows of weight 0 (dh rows exactly 0). div, entropy,
// dh and the increment of dW; then div, entropy and dW null (dh bitwise as with them), and the forward alone (div and
// entropy bitwise as with the backward).
TEST_P(OpsCuda, LmHeadDivergenceMatchesCpu) {
  const int T = 37, D = 67, Dt = 45;
  const float inv_t = 1.0f / 0.8f;
  Vec wv = randu(sz(T), 305, 0.1f, 1.0f);
  for (int t = 0; t < T; t += 5) wv[sz(t)] = 0.0f;
  Pair weights = f32(wv);
  Pair h = storage(randu(sz(T, D), 301));
  Pair th = storage(randu(sz(T, Dt), 303));
  for (const int V : {301, 304}) {
    Pair W = storage(randu(sz(V, D), 302 + V));
    Pair tW = storage(randu(sz(V, Dt), 304 + V));
    const Vec dW0 = randu(sz(V, D), 306, -0.01f, 0.01f);
    for (const float beta : {0.0f, 1.0f, 0.4f})
      for (const float cap : {0.0f, 2.5f}) {
        const float t_cap = cap > 0.0f ? 3.0f : 0.0f;
        const std::string tag = "V" + std::to_string(V) + " beta" + std::to_string(beta).substr(0, 3) + " cap" +
                                std::to_string(cap).substr(0, 3) + " ";
        // The op on one backend: the CPU's pointers (.c) or the GPU's (.g); a null Pair* passes null.
        auto run = [&](bool gpu, const Pair* div, const Pair* ent, const Pair* dh, const Pair* dW) {
          Ops& ops = gpu ? *gpu_ : *cpu_;
          auto at = [gpu](const Pair* p) -> void* { return p ? (gpu ? p->g : p->c) : nullptr; };
          ops.lm_head_divergence(static_cast<float*>(at(div)), static_cast<float*>(at(ent)), at(dh),
                                 static_cast<float*>(at(dW)), dh ? static_cast<const float*>(at(&weights)) : nullptr,
                                 at(&h), at(&W), T, D, V, inv_t, cap, at(&th), at(&tW), Dt, inv_t, t_cap, beta);
        };
        // Everything: outputs filled with values the op must overwrite (dW: a start it must add to).
        Pair div = f32(Vec(sz(T), 9.0f)), ent = f32(Vec(sz(T), 9.0f));
        Pair dh = storage(Vec(sz(T, D), 7.0f));
        Pair dW = f32(dW0);
        run(false, &div, &ent, &dh, &dW);
        run(true, &div, &ent, &dh, &dW);
        expect_close(tag + "divergence", div, kGemmF32Tol);
        expect_close(tag + "divergence entropy", ent, kGemmF32Tol);
        expect_close(tag + "divergence dh", dh, tol());
        Vec inc_c = cpu_values(dW), inc_g = gpu_values(dW);
        for (std::size_t i = 0; i < dW0.size(); ++i) {
          inc_c[i] -= dW0[i];
          inc_g[i] -= dW0[i];
        }
        expect_close_vec(tag + "divergence dW increment", inc_c, inc_g, tol());
        const Vec dh_g = gpu_values(dh);
        for (int t = 0; t < T; t += 5)
          for (int d = 0; d < D; ++d) ASSERT_EQ(dh_g[sz(t, D) + sz(d)], 0.0f) << tag << "dh of row " << t << " (weight 0)";
        for (const float x : cpu_values(div)) EXPECT_GT(x, 1e-3f) << tag << "the CPU's divergences: the test checks little";
        // No div, entropy or dW: dh as above.
        Pair dh2 = storage(Vec(sz(T, D), 7.0f));
        run(false, nullptr, nullptr, &dh2, nullptr);
        run(true, nullptr, nullptr, &dh2, nullptr);
        expect_close(tag + "divergence dh (no div, dW)", dh2, tol());
        EXPECT_EQ(gpu_values(dh2), dh_g) << tag << "GPU dh: without div, entropy and dW vs with";
        // The forward alone: div and entropy as with the backward.
        Pair div3 = f32(Vec(sz(T), 9.0f)), ent3 = f32(Vec(sz(T), 9.0f));
        run(false, &div3, &ent3, nullptr, nullptr);
        run(true, &div3, &ent3, nullptr, nullptr);
        expect_close(tag + "divergence (forward alone)", div3, kGemmF32Tol);
        expect_close(tag + "divergence entropy (forward alone)", ent3, kGemmF32Tol);
        EXPECT_EQ(gpu_values(div3), gpu_values(div)) << tag << "GPU div: forward alone vs with the backward";
        EXPECT_EQ(gpu_values(ent3), gpu_values(ent)) << tag << "GPU entropy: forward alone vs with the backward";
      }
  }
  // No rows: nothing to do (null pointers untouched); beta outside [0, 1]: refused.
  EXPECT_NO_THROW(gpu_->lm_head_divergence(nullptr, nullptr, nullptr, nullptr, nullptr, h.g, h.g, 0, D, 301, 1.0f,
                                           0.0f, th.g, th.g, Dt, 1.0f, 0.0f, 0.5f));
  EXPECT_THROW(gpu_->lm_head_divergence(nullptr, nullptr, nullptr, nullptr, nullptr, h.g, h.g, T, D, 301, 1.0f, 0.0f,
                                        th.g, th.g, Dt, 1.0f, 0.0f, 1.5f),
               FatalError);
  gpu_->synchronize();
}

// KV cache: store (exact copy), cached attention over interleaved rows of several slots (prefill), then one
// decode row per slot, through a block table (one block per slot, or blocks of 8 and 16 positions scattered over a
// pool with spare blocks); a position outside the cache is reported at the next synchronisation.
TEST_P(OpsCuda, KvCache) {
  struct Case {
    int n_heads, n_kv, head_dim, block, max_len;  // block 0: one block of max_len per slot
  };
  const int slots = 3;
  const Ids slot_of = {2, 0, 1};  // the slot each sequence lives in
  // Short caches (one split of the keys), long ones (decode rows split over the KV length and combined), groups
  // of 1 to 7 query heads per KV head, and a group of 20 beyond the register tiles (the two-pass kernel).
  for (const Case cs : {Case{4, 4, 40, 0, 40}, Case{6, 2, 128, 8, 40}, Case{5, 1, 72, 16, 40},
                        Case{4, 2, 256, 8, 40}, Case{14, 2, 64, 16, 40}, Case{14, 2, 64, 16, 1000},
                        Case{12, 2, 128, 16, 700}, Case{4, 4, 40, 0, 300}, Case{20, 1, 128, 8, 300}}) {
    const int nh = cs.n_heads, nkv = cs.n_kv, hd = cs.head_dim, max_len = cs.max_len;
    const Ids len = {max_len - 3, max_len / 2, 5};  // prefill lengths of sequences 0, 1, 2
    const int bs = cs.block == 0 ? max_len : cs.block, per_slot = (max_len + bs - 1) / bs;
    const std::string tag = "h" + std::to_string(nh) + "/" + std::to_string(nkv) + " d" + std::to_string(hd) +
                            " block " + std::to_string(bs) + " len " + std::to_string(max_len) + " ";
    // Pool blocks in a shuffled order, plus spares.
    const int n_blocks = slots * per_slot + 3;
    Ids pool(static_cast<std::size_t>(n_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::mt19937 shuffle_gen(120);
    if (cs.block != 0) std::shuffle(pool.begin(), pool.end(), shuffle_gen);
    Ids table_h(pool.begin(), pool.begin() + slots * per_slot);
    Pair table = i32(table_h);
    const KvPages pc_pages{static_cast<const std::int32_t*>(table.c), slots, per_slot, bs, n_blocks};
    const KvPages pg_pages{static_cast<const std::int32_t*>(table.g), slots, per_slot, bs, n_blocks};
    const std::size_t pool_elems = sz(n_blocks, bs, nkv, hd);
    // Prefill rows: every (sequence, position), shuffled so that slots interleave and positions come out of order.
    std::vector<std::pair<int, int>> rows;
    for (int b = 0; b < 3; ++b)
      for (int t = 0; t < len[static_cast<std::size_t>(b)]; ++t) rows.emplace_back(b, t);
    std::mt19937 gen(110);
    std::shuffle(rows.begin(), rows.end(), gen);
    Ids slot_h, pos_h;
    for (const auto& [b, t] : rows) {
      slot_h.push_back(slot_of[static_cast<std::size_t>(b)]);
      pos_h.push_back(t);
    }
    const int T = static_cast<int>(rows.size());
    Pair slot = i32(slot_h), pos = i32(pos_h);
    Pair k = storage(randu(sz(T, nkv, hd), 111, -2.0f, 2.0f));
    Pair v = storage(randu(sz(T, nkv, hd), 112));
    Pair q = storage(randu(sz(T, nh, hd), 113, -2.0f, 2.0f));
    Pair ck = storage(Vec(pool_elems, 0.0f));
    Pair cv = storage(Vec(pool_elems, 0.0f));
    const auto* sc = static_cast<const std::int32_t*>(slot.c);
    const auto* sg = static_cast<const std::int32_t*>(slot.g);
    const auto* pc = static_cast<const std::int32_t*>(pos.c);
    const auto* pg = static_cast<const std::int32_t*>(pos.g);
    cpu_->kv_store(ck.c, cv.c, k.c, v.c, sc, pc, T, pc_pages, nkv, hd);
    gpu_->kv_store(ck.g, cv.g, k.g, v.g, sg, pg, T, pg_pages, nkv, hd);
    expect_close(tag + "kv_store cache_k (exact)", ck, 0.0);
    expect_close(tag + "kv_store cache_v (exact)", cv, 0.0);
    Pair out = storage(Vec(sz(T, nh, hd), 3.0f));
    cpu_->attention_cached(out.c, q.c, ck.c, cv.c, sc, pc, T, pc_pages, nh, nkv, hd);
    gpu_->attention_cached(out.g, q.g, ck.g, cv.g, sg, pg, T, pg_pages, nh, nkv, hd);
    expect_close(tag + "attention_cached prefill", out, tol());

    // Decode: one new row per slot at its next position, stored first, then attended.
    Ids dslot_h, dpos_h;
    for (int b = 2; b >= 0; --b) {
      dslot_h.push_back(slot_of[static_cast<std::size_t>(b)]);
      dpos_h.push_back(len[static_cast<std::size_t>(b)]);
    }
    Pair dslot = i32(dslot_h), dpos = i32(dpos_h);
    const auto* dsc = static_cast<const std::int32_t*>(dslot.c);
    const auto* dsg = static_cast<const std::int32_t*>(dslot.g);
    const auto* dpc = static_cast<const std::int32_t*>(dpos.c);
    const auto* dpg = static_cast<const std::int32_t*>(dpos.g);
    Pair dk = storage(randu(sz(3, nkv, hd), 114, -2.0f, 2.0f));
    Pair dv = storage(randu(sz(3, nkv, hd), 115));
    Pair dq = storage(randu(sz(3, nh, hd), 116, -2.0f, 2.0f));
    Pair dout = storage(Vec(sz(3, nh, hd), 3.0f));
    cpu_->kv_store(ck.c, cv.c, dk.c, dv.c, dsc, dpc, 3, pc_pages, nkv, hd);
    gpu_->kv_store(ck.g, cv.g, dk.g, dv.g, dsg, dpg, 3, pg_pages, nkv, hd);
    cpu_->attention_cached(dout.c, dq.c, ck.c, cv.c, dsc, dpc, 3, pc_pages, nh, nkv, hd);
    gpu_->attention_cached(dout.g, dq.g, ck.g, cv.g, dsg, dpg, 3, pg_pages, nh, nkv, hd);
    expect_close(tag + "kv_store decode cache_k (exact)", ck, 0.0);
    expect_close(tag + "attention_cached decode", dout, tol());
  }
  // A position outside the cache, or one whose table entry has no block, cannot throw inside a kernel: the next
  // synchronisation reports it.
  const int nkv = 2, hd = 8;
  Pair ck = storage(Vec(sz(1, 4, nkv, hd), 0.0f)), cv = storage(Vec(sz(1, 4, nkv, hd), 0.0f));
  Pair k = storage(randu(sz(1, nkv, hd), 117)), q = storage(randu(sz(1, 2, hd), 118));
  Pair out = storage(Vec(sz(1, 2, hd), 0.0f));
  Pair slot = i32({0}), bad = i32({4}), two = i32({2}), table = i32({0}), holes = i32({0, -1});
  const KvPages one{static_cast<const std::int32_t*>(table.g), 1, 1, 4, 1};
  const KvPages holed{static_cast<const std::int32_t*>(holes.g), 1, 2, 2, 2};
  const auto* sg = static_cast<const std::int32_t*>(slot.g);
  gpu_->kv_store(ck.g, cv.g, k.g, k.g, sg, static_cast<const std::int32_t*>(bad.g), 1, one, nkv, hd);
  EXPECT_THROW(gpu_->synchronize(), FatalError);
  EXPECT_NO_THROW(gpu_->synchronize());
  gpu_->attention_cached(out.g, q.g, ck.g, cv.g, sg, static_cast<const std::int32_t*>(bad.g), 1, one, 2, nkv, hd);
  EXPECT_THROW(gpu_->synchronize(), FatalError);
  EXPECT_NO_THROW(gpu_->synchronize());
  gpu_->kv_store(ck.g, cv.g, k.g, k.g, sg, static_cast<const std::int32_t*>(two.g), 1, holed, nkv, hd);
  EXPECT_THROW(gpu_->synchronize(), FatalError);
  EXPECT_NO_THROW(gpu_->synchronize());
  gpu_->attention_cached(out.g, q.g, ck.g, cv.g, sg, static_cast<const std::int32_t*>(two.g), 1, holed, 2, nkv, hd);
  EXPECT_THROW(gpu_->synchronize(), FatalError);
  EXPECT_NO_THROW(gpu_->synchronize());
}

// Ops::rope_kv_store (kv_cache.cu's fused kernel): bit for bit the three ops it replaces (rope_forward of q and of k,
// kv_store) on this backend, and the CPU reference within tolerance; with and without GQA, head_dim 64, 128 and 256,
// pool blocks in a shuffled order holding earlier values (a store touches only its rows), a prefill running past
// several blocks into a partly filled one, and decode rows at a block's first and a slot's last position. A row
// outside the cache is flagged at the next synchronisation.
TEST_P(OpsCuda, RopeKvStore) {
  struct Case {
    int nh, nkv, hd, bs;
  };
  for (const Case cs : {Case{14, 2, 64, 16}, Case{12, 2, 128, 16}, Case{8, 8, 128, 8}, Case{28, 4, 128, 16},
                        Case{4, 1, 256, 4}, Case{8, 1, 256, 16}}) {
    const int nh = cs.nh, nkv = cs.nkv, hd = cs.hd, bs = cs.bs, slots = 3, per_slot = 6;
    const int n_blocks = slots * per_slot + 2;
    const std::string tag = "h" + std::to_string(nh) + "/" + std::to_string(nkv) + " d" + std::to_string(hd) +
                            " block " + std::to_string(bs) + " ";
    Ids pool(static_cast<std::size_t>(n_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::mt19937 gen(140 + hd);
    std::shuffle(pool.begin(), pool.end(), gen);
    Pair table = i32(Ids(pool.begin(), pool.begin() + slots * per_slot));
    const KvPages pc{static_cast<const std::int32_t*>(table.c), slots, per_slot, bs, n_blocks};
    const KvPages pg{static_cast<const std::int32_t*>(table.g), slots, per_slot, bs, n_blocks};
    Ids slot_h, pos_h;
    const int prefill = 2 * bs + bs / 2 + 1;  // slot 1's positions 0 .. prefill - 1: the last block partial
    for (int t = 0; t < prefill; ++t) {
      slot_h.push_back(1);
      pos_h.push_back(t);
    }
    slot_h.insert(slot_h.end(), {0, 2, 0});
    pos_h.insert(pos_h.end(), {bs, per_slot * bs - 1, 3 * bs + 1});  // decode rows
    const int T = static_cast<int>(slot_h.size());
    Pair slot = i32(slot_h), pos = i32(pos_h);
    Vec inv(sz(hd / 2));
    for (int j = 0; j < hd / 2; ++j) inv[j] = static_cast<float>(1.0 / std::pow(1000000.0, 2.0 * j / hd));
    Pair inv_freq = f32(inv);
    const Vec qv = randu(sz(T, nh, hd), 141, -2.0f, 2.0f), kv = randu(sz(T, nkv, hd), 142, -2.0f, 2.0f);
    const Vec vv = randu(sz(T, nkv, hd), 143), pool_k = randu(sz(n_blocks, bs, nkv, hd), 144);
    const Vec pool_v = randu(sz(n_blocks, bs, nkv, hd), 145);
    // The fused op (and the CPU reference's composition) on one set, the GPU's separate ops on a copy.
    Pair q = storage(qv), k = storage(kv), v = storage(vv), ck = storage(pool_k), cv = storage(pool_v);
    Pair q2 = storage(qv), k2 = storage(kv), ck2 = storage(pool_k), cv2 = storage(pool_v);
    const auto *sc = static_cast<const std::int32_t*>(slot.c), *sg = static_cast<const std::int32_t*>(slot.g);
    const auto *pcp = static_cast<const std::int32_t*>(pos.c), *pgp = static_cast<const std::int32_t*>(pos.g);
    const auto *fc = static_cast<const float*>(inv_freq.c), *fg = static_cast<const float*>(inv_freq.g);
    cpu_->rope_kv_store(q.c, k.c, v.c, ck.c, cv.c, sc, pcp, fc, T, pc, nh, nkv, hd);
    gpu_->rope_kv_store(q.g, k.g, v.g, ck.g, cv.g, sg, pgp, fg, T, pg, nh, nkv, hd);
    gpu_->rope_forward(q2.g, pgp, fg, T, nh, hd);
    gpu_->rope_forward(k2.g, pgp, fg, T, nkv, hd);
    gpu_->kv_store(ck2.g, cv2.g, k2.g, v.g, sg, pgp, T, pg, nkv, hd);
    EXPECT_EQ(gpu_values(q), gpu_values(q2)) << tag << "q: not the bits of rope_forward";
    EXPECT_EQ(gpu_values(k), gpu_values(k2)) << tag << "k: not the bits of rope_forward";
    EXPECT_EQ(gpu_values(ck), gpu_values(ck2)) << tag << "cache k: not the bits of rope_forward + kv_store";
    EXPECT_EQ(gpu_values(cv), gpu_values(cv2)) << tag << "cache v: not the bits of kv_store";
    expect_close(tag + "rope_kv_store q", q, tol());
    expect_close(tag + "rope_kv_store k", k, tol());
    expect_close(tag + "rope_kv_store cache k", ck, tol());
    expect_close(tag + "rope_kv_store cache v (exact)", cv, 0.0);
    EXPECT_NO_THROW(gpu_->synchronize()) << tag;
  }
  // A position past the slot's blocks: flagged, the row not stored.
  const int nkv = 2, hd = 8;
  Pair ck = storage(Vec(sz(1, 4, nkv, hd), 0.0f)), cv = storage(Vec(sz(1, 4, nkv, hd), 0.0f));
  Pair k = storage(randu(sz(1, nkv, hd), 146)), q = storage(randu(sz(1, 2, hd), 147));
  Pair slot = i32({0}), bad = i32({4}), table = i32({0}), inv = f32(Vec(sz(hd / 2), 0.5f));
  const KvPages one{static_cast<const std::int32_t*>(table.g), 1, 1, 4, 1};
  gpu_->rope_kv_store(q.g, k.g, k.g, ck.g, cv.g, static_cast<const std::int32_t*>(slot.g),
                      static_cast<const std::int32_t*>(bad.g), static_cast<const float*>(inv.g), 1, one, 2, nkv, hd);
  EXPECT_THROW(gpu_->synchronize(), FatalError);
  EXPECT_NO_THROW(gpu_->synchronize());
  EXPECT_EQ(gpu_values(ck), Vec(ck.n, 0.0f));
}

// The GEMV ops (gemv.cu) against the CPU reference: T = 1..8 rows (the kernels), 9 and 64 (the composition: cuBLAS),
// at Qwen2.5-0.5B's and 7B's shapes and an odd one (a width not a multiple of 8: the composition), with x at a
// 16-byte aligned address and (T = 1, 8) at one element past it (the composition). x is a view into one buffer.
struct GemvShape {
  const char* name;
  int D, q, kv, I;
};
const GemvShape kGemvShapes[] = {{"0.5B", 896, 896, 128, 4864}, {"7B", 3584, 3584, 512, 18944},
                                 {"odd", 900, 904, 12, 1001}};
const int kGemvRows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 64};

// Ops::linear_group_forward for q|k|v with biases on q and k (Qwen2 has all three; a null one is allowed). Also: a
// row's output does not depend on the other rows (row 0 alone = row 0 of 8, bit for bit) where the kernels run.
TEST_P(OpsCuda, LinearGroupForward) {
  for (const GemvShape& sh : kGemvShapes) {
    const int in = sh.D;
    Pair Wq = storage(randu(sz(sh.q, in), 150, -0.1f, 0.1f)), Wk = storage(randu(sz(sh.kv, in), 151, -0.1f, 0.1f));
    Pair Wv = storage(randu(sz(sh.kv, in), 152, -0.1f, 0.1f));
    Pair bq = storage(randu(sz(sh.q), 153)), bk = storage(randu(sz(sh.kv), 154));
    Pair xb = storage(randu(sz(64 * in + 8), 155));
    Vec row0;  // q of x's row 0 alone
    for (const int T : kGemvRows)
      for (const std::size_t off : {std::size_t{0}, std::size_t{1}}) {
        if (off == 1 && T != 1 && T != 8) continue;
        const std::string tag = std::string(sh.name) + " T" + std::to_string(T) + (off ? " misaligned" : "") + " ";
        const Pair x = view(xb, off);
        Pair yq = storage(Vec(sz(T, sh.q), 3.0f)), yk = storage(Vec(sz(T, sh.kv), 3.0f));
        Pair yv = storage(Vec(sz(T, sh.kv), 3.0f));
        const Ops::LinearMember mc[] = {
            {yq.c, Wq.c, bq.c, sh.q}, {yk.c, Wk.c, bk.c, sh.kv}, {yv.c, Wv.c, nullptr, sh.kv}};
        const Ops::LinearMember mg[] = {
            {yq.g, Wq.g, bq.g, sh.q}, {yk.g, Wk.g, bk.g, sh.kv}, {yv.g, Wv.g, nullptr, sh.kv}};
        cpu_->linear_group_forward(mc, 3, x.c, T, in);
        gpu_->linear_group_forward(mg, 3, x.g, T, in);
        expect_close(tag + "group q (bias)", yq, tol());
        expect_close(tag + "group k (bias)", yk, tol());
        expect_close(tag + "group v", yv, tol());
        if (off != 0 || in % 8 != 0) continue;
        const Vec got = gpu_values(yq);
        if (T == 1) row0 = got;
        if (T == 8) {
          EXPECT_EQ(Vec(got.begin(), got.begin() + sh.q), row0) << tag << "row 0 depends on the other rows";
        }
      }
  }
}

// Ops::gated_mlp_forward, SwiGLU and GeGLU: act only (the kernels leave gate and up as they were).
TEST_P(OpsCuda, GatedMlpForward) {
  for (const GemvShape& sh : kGemvShapes) {
    const int in = sh.D, I = sh.I;
    Pair Wg = storage(randu(sz(I, in), 160, -0.1f, 0.1f)), Wu = storage(randu(sz(I, in), 161, -0.1f, 0.1f));
    Pair xb = storage(randu(sz(64 * in + 8), 162));
    for (const int T : kGemvRows)
      for (const std::size_t off : {std::size_t{0}, std::size_t{1}})
        for (const bool geglu : {false, true}) {
          if (off == 1 && T != 1 && T != 8) continue;
          const std::string tag = std::string(sh.name) + " T" + std::to_string(T) + (off ? " misaligned" : "") +
                                  (geglu ? " geglu " : " swiglu ");
          const Pair x = view(xb, off);
          Pair act = storage(Vec(sz(T, I), 3.0f)), gate = storage(Vec(sz(T, I), 0.0f));
          Pair up = storage(Vec(sz(T, I), 0.0f));
          cpu_->gated_mlp_forward(act.c, gate.c, up.c, x.c, Wg.c, Wu.c, T, in, I, geglu);
          gpu_->gated_mlp_forward(act.g, gate.g, up.g, x.g, Wg.g, Wu.g, T, in, I, geglu);
          expect_close(tag + "act", act, tol());
        }
    // Wu right after Wg in memory (as the base arena stacks gate_proj and up_proj): beyond the GEMV's rows, with
    // MGRL_GATE_UP_STACKED=1 (gpu.ops_cuda_pdl), one GEMM of x against the [2I, in] stack and the activation from its
    // halves (kernels/cuda/swiglu.cuh); else the two GEMMs.
    Pair W2 = storage(randu(sz(2 * I, in), 163, -0.1f, 0.1f));
    const Pair g2 = view(W2, 0), u2 = view(W2, sz(I, in));
    for (const int T : {9, 64})
      for (const bool geglu : {false, true}) {
        const std::string tag = std::string(sh.name) + " T" + std::to_string(T) + " stacked gate|up" +
                                (geglu ? " geglu " : " swiglu ");
        const Pair x = view(xb, 0);
        Pair act = storage(Vec(sz(T, I), 3.0f)), gate = storage(Vec(sz(T, I), 0.0f));
        Pair up = storage(Vec(sz(T, I), 0.0f));
        cpu_->gated_mlp_forward(act.c, gate.c, up.c, x.c, g2.c, u2.c, T, in, I, geglu);
        gpu_->gated_mlp_forward(act.g, gate.g, up.g, x.g, g2.g, u2.g, T, in, I, geglu);
        expect_close(tag + "act", act, tol());
      }
  }
}

// Ops::linear_residual_forward into a separate y and in place on the residual (y == r).
TEST_P(OpsCuda, LinearResidualForward) {
  for (const GemvShape& sh : kGemvShapes) {
    const int in = sh.I, out = sh.D;
    Pair W = storage(randu(sz(out, in), 170, -0.05f, 0.05f));
    Pair xb = storage(randu(sz(64 * in + 8), 171));
    for (const int T : kGemvRows)
      for (const std::size_t off : {std::size_t{0}, std::size_t{1}}) {
        if (off == 1 && T != 1 && T != 8) continue;
        const std::string tag = std::string(sh.name) + " T" + std::to_string(T) + (off ? " misaligned" : "") + " ";
        const Pair x = view(xb, off);
        const Vec rv = randu(sz(T, out), 172);
        Pair r = storage(rv), y = storage(Vec(sz(T, out), 3.0f)), tmp = storage(Vec(sz(T, out), 0.0f));
        cpu_->linear_residual_forward(y.c, r.c, x.c, W.c, T, in, out, tmp.c);
        gpu_->linear_residual_forward(y.g, r.g, x.g, W.g, T, in, out, tmp.g);
        expect_close(tag + "y = r + x W^T", y, tol());
        EXPECT_EQ(gpu_values(r), rounded(rv)) << tag << "r changed";
        cpu_->linear_residual_forward(r.c, r.c, x.c, W.c, T, in, out, tmp.c);
        gpu_->linear_residual_forward(r.g, r.g, x.g, W.g, T, in, out, tmp.g);
        expect_close(tag + "r += x W^T (in place)", r, tol());
        EXPECT_EQ(gpu_values(r), gpu_values(y)) << tag << "in place differs from out of place";
      }
  }
}

// The RMSNorm folded into the decode GEMVs (Ops::rmsnorm_linear_group_forward, rmsnorm_gated_mlp_forward) against the
// CPU's composition (rmsnorm_forward, then linear_group_forward / gated_mlp_forward on the rounded h): within the
// storage tolerance (the GPU keeps h in fp32). Where the kernels cannot take the call (more than 8 rows, x not
// 16-byte aligned, 7B's gate|up beyond 2 rows) the ops decline: false, nothing written, and rmsnorm_gated_mlp_fits
// says so beforehand. Norm weights around 1 and, with the unit offset (Gemma's 1 + w), around 0.
TEST_P(OpsCuda, RmsnormFoldedIntoGemv) {
  const float eps = 1e-6f;
  for (const GemvShape& sh : kGemvShapes) {
    const int in = sh.D, I = sh.I;
    Pair Wq = storage(randu(sz(sh.q, in), 180, -0.1f, 0.1f)), Wk = storage(randu(sz(sh.kv, in), 181, -0.1f, 0.1f));
    Pair Wv = storage(randu(sz(sh.kv, in), 182, -0.1f, 0.1f)), bq = storage(randu(sz(sh.q), 183));
    Pair Wg = storage(randu(sz(I, in), 184, -0.1f, 0.1f)), Wu = storage(randu(sz(I, in), 185, -0.1f, 0.1f));
    Pair xb = storage(randu(sz(64 * in + 8), 186, -3.0f, 3.0f));
    for (const bool unit : {false, true}) {
      Pair w = storage(randu(sz(in), 187, unit ? -0.5f : 0.5f, unit ? 0.5f : 1.5f));
      for (const int T : {1, 2, 5, 8, 9})
        for (const std::size_t off : {std::size_t{0}, std::size_t{1}}) {
          if (off == 1 && T != 1) continue;
          const std::string tag = std::string(sh.name) + " T" + std::to_string(T) + (off ? " misaligned" : "") +
                                  (unit ? " (1 + w) " : " ");
          const Pair x = view(xb, off);
          const bool fits = T <= 8 && off == 0 && in % 8 == 0;
          Pair h = storage(Vec(sz(T, in), 0.0f)), rstd = f32(Vec(sz(T), 0.0f));
          cpu_->rmsnorm_forward(h.c, static_cast<float*>(rstd.c), x.c, w.c, T, in, eps, unit);
          Pair yq = storage(Vec(sz(T, sh.q), 3.0f)), yk = storage(Vec(sz(T, sh.kv), 3.0f));
          Pair yv = storage(Vec(sz(T, sh.kv), 3.0f));
          const Ops::LinearMember mc[] = {
              {yq.c, Wq.c, bq.c, sh.q}, {yk.c, Wk.c, nullptr, sh.kv}, {yv.c, Wv.c, nullptr, sh.kv}};
          const Ops::LinearMember mg[] = {
              {yq.g, Wq.g, bq.g, sh.q}, {yk.g, Wk.g, nullptr, sh.kv}, {yv.g, Wv.g, nullptr, sh.kv}};
          cpu_->linear_group_forward(mc, 3, h.c, T, in);
          const bool took = gpu_->rmsnorm_linear_group_forward(mg, 3, x.g, w.g, eps, unit, T, in);
          EXPECT_EQ(took, fits) << tag << "rmsnorm_linear_group_forward";
          if (took) {
            expect_close(tag + "norm + q (bias)", yq, tol());
            expect_close(tag + "norm + k", yk, tol());
            expect_close(tag + "norm + v", yv, tol());
          } else {
            EXPECT_EQ(gpu_values(yq), Vec(sz(T, sh.q), 3.0f)) << tag << "declined, yet q written";
          }
          const bool gated_fits = fits && (T <= 2 || 2 * static_cast<std::int64_t>(I) * in * 2 <= (64 << 20));
          EXPECT_EQ(gpu_->rmsnorm_gated_mlp_fits(x.g, w.g, Wg.g, Wu.g, T, in, I), gated_fits) << tag << "fits";
          for (const bool geglu : {false, true}) {
            Pair act = storage(Vec(sz(T, I), 3.0f)), gate = storage(Vec(sz(T, I), 0.0f));
            Pair up = storage(Vec(sz(T, I), 0.0f));
            cpu_->gated_mlp_forward(act.c, gate.c, up.c, h.c, Wg.c, Wu.c, T, in, I, geglu);
            const bool g_took =
                gpu_->rmsnorm_gated_mlp_forward(act.g, x.g, w.g, eps, unit, Wg.g, Wu.g, T, in, I, geglu);
            EXPECT_EQ(g_took, gated_fits) << tag << "rmsnorm_gated_mlp_forward";
            if (g_took)
              expect_close(tag + (geglu ? "norm + geglu act" : "norm + swiglu act"), act, tol());
            else
              EXPECT_EQ(gpu_values(act), Vec(sz(T, I), 3.0f)) << tag << "declined, yet act written";
          }
        }
    }
  }
}

TEST_P(OpsCuda, GatherRows) {
  const int rows = 37, width = 203;
  Pair src = storage(randu(sz(rows, width), 120));
  const Ids idx_h = {36, 0, 5, 5, 17, 36, 2, 9, 9, 9, 30};
  const int n = static_cast<int>(idx_h.size());
  Pair idx = i32(idx_h);
  Pair dst = storage(Vec(sz(n, width), 4.0f));
  cpu_->gather_rows(dst.c, src.c, static_cast<const std::int32_t*>(idx.c), n, width);
  gpu_->gather_rows(dst.g, src.g, static_cast<const std::int32_t*>(idx.g), n, width);
  expect_close("gather_rows (exact)", dst, 0.0);
}

TEST_P(OpsCuda, ScatterRows) {
  const int rows = 41, width = 203;
  const Ids idx_h = {40, 0, 5, 17, 2, 9, 30, 39};  // distinct, any order
  const int n = static_cast<int>(idx_h.size());
  Pair src = storage(randu(sz(n, width), 121));
  Pair idx = i32(idx_h);
  Pair dst = storage(randu(sz(rows, width), 122));  // the rows not written keep these values
  cpu_->scatter_rows(dst.c, src.c, static_cast<const std::int32_t*>(idx.c), n, width);
  gpu_->scatter_rows(dst.g, src.g, static_cast<const std::int32_t*>(idx.g), n, width);
  expect_close("scatter_rows (exact)", dst, 0.0);
  Pair bad = i32({3, -1});
  gpu_->scatter_rows(dst.g, src.g, static_cast<const std::int32_t*>(bad.g), 2, width);
  EXPECT_THROW(gpu_->synchronize(), FatalError);
  EXPECT_NO_THROW(gpu_->synchronize());
}

// Sampling: the same token for the same seeds, and log-probs within 1e-4, on logits with well separated values
// (a near-tie could fall either way under a different summation order; exact ties fall the same way on both).
TEST_P(OpsCuda, Sample) {
  if (st() == DType::F16) GTEST_SKIP() << "f32 logits: no storage dtype involved (run once, under bf16)";
  struct Params {
    float temperature;
    int top_k;
    float top_p, min_p;
  };
  const std::vector<Params> settings = {
      {0.0f, 0, 1.0f, 0.0f},  {1.0f, 0, 1.0f, 0.0f},       {0.7f, 50, 1.0f, 0.0f}, {1.2f, 0, 0.9f, 0.0f},
      {1.0f, 0, 1.0f, 0.05f}, {0.8f, 40, 0.8f, 0.02f},     {1.0f, 1, 1.0f, 0.0f},  {1.0f, 0, 0.0f, 0.0f},
      {1.5f, 5, 0.97f, 0.1f}, {1.0f, 1 << 30, 1.0f, 0.0f},
  };
  const int B = 48;
  for (const int V : {7, 1000, 50001, 151936}) {
    // Row b: a random permutation of evenly spaced values, scaled per row (sharp to flat distributions).
    Vec logits(sz(B, V));
    std::mt19937 gen(130 + V);
    std::vector<int> perm(static_cast<std::size_t>(V));
    for (int b = 0; b < B; ++b) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), gen);
      const float range = 4.0f + 2.0f * static_cast<float>(b % 8);
      for (int i = 0; i < V; ++i)
        logits[sz(b, V) + static_cast<std::size_t>(i)] =
            range * (static_cast<float>(perm[static_cast<std::size_t>(i)]) / static_cast<float>(V) - 0.5f);
    }
    if (V >= 1000) {  // exact ties: row 0's max twice (greedy: the lower index), row 1 ten tied maxima (kept
                      // together by top_k 1, 5, top_p 0; within top_k 40, 50)
      logits[sz(0, V) + 3] = logits[sz(0, V) + 900] = 100.0f;
      for (int i = 10; i < 20; ++i) logits[sz(1, V) + static_cast<std::size_t>(i)] = 50.0f;
    }
    Pair z = f32(logits);
    std::vector<std::uint64_t> seeds_h(static_cast<std::size_t>(B));
    for (int b = 0; b < B; ++b)
      seeds_h[static_cast<std::size_t>(b)] =
          0x9e3779b9ull * static_cast<std::uint64_t>(b + 1) + static_cast<unsigned>(V);
    void* seeds_c = own(*cpu_, seeds_h.size() * 8);
    void* seeds_g = own(*gpu_, seeds_h.size() * 8);
    cpu_->upload(seeds_c, seeds_h.data(), seeds_h.size() * 8);
    gpu_->upload(seeds_g, seeds_h.data(), seeds_h.size() * 8);
    Pair tok = i32(Ids(static_cast<std::size_t>(B), -7));
    Pair lp = f32(Vec(static_cast<std::size_t>(B), 9.0f));
    for (const Params& pr : settings) {
      Ops::Sampling sp;
      sp.temperature = pr.temperature;
      sp.top_k = pr.top_k;
      sp.top_p = pr.top_p;
      sp.min_p = pr.min_p;
      const std::string tag = "V" + std::to_string(V) + " T" + std::to_string(pr.temperature).substr(0, 3) + " k" +
                              std::to_string(pr.top_k) + " p" + std::to_string(pr.top_p).substr(0, 4) + " m" +
                              std::to_string(pr.min_p).substr(0, 4);
      cpu_->sample(static_cast<std::int32_t*>(tok.c), static_cast<float*>(lp.c), static_cast<const float*>(z.c),
                   static_cast<const std::uint64_t*>(seeds_c), B, V, sp);
      gpu_->sample(static_cast<std::int32_t*>(tok.g), static_cast<float*>(lp.g), static_cast<const float*>(z.g),
                   static_cast<const std::uint64_t*>(seeds_g), B, V, sp);
      Ids tc(static_cast<std::size_t>(B)), tg(static_cast<std::size_t>(B));
      cpu_->download(tc.data(), tok.c, tc.size() * 4);
      gpu_->download(tg.data(), tok.g, tg.size() * 4);
      {  // deterministic: a second call gives the same bits (no floating-point atomics in the thresholds' sums)
        const Vec lg1 = gpu_values(lp);
        gpu_->sample(static_cast<std::int32_t*>(tok.g), static_cast<float*>(lp.g), static_cast<const float*>(z.g),
                     static_cast<const std::uint64_t*>(seeds_g), B, V, sp);
        Ids tg2(static_cast<std::size_t>(B));
        gpu_->download(tg2.data(), tok.g, tg2.size() * 4);
        const Vec lg2 = gpu_values(lp);
        EXPECT_EQ(tg2, tg) << tag << ": a second call samples other tokens";
        EXPECT_EQ(0, std::memcmp(lg1.data(), lg2.data(), lg1.size() * sizeof(float))) << tag;
      }
      int differ = 0;
      for (int b = 0; b < B; ++b) differ += tc[static_cast<std::size_t>(b)] != tg[static_cast<std::size_t>(b)];
      EXPECT_EQ(differ, 0) << tag << ": tokens differ in " << differ << " of " << B << " rows";
      if (pr.temperature == 0.0f && V >= 1000) {
        EXPECT_EQ(tg[0], 3) << tag << ": greedy takes the lowest index of a tie";
        EXPECT_EQ(tg[1], 10) << tag << ": greedy takes the lowest index of a tie";
      }
      if (V >= 1000 && pr.top_p == 0.0f) {
        EXPECT_TRUE(tg[1] >= 10 && tg[1] < 20) << tag << ": top_p 0 keeps the max and its ties";
      }
      const Vec lc = cpu_values(lp), lg = gpu_values(lp);
      double worst = 0.0;
      for (int b = 0; b < B; ++b)
        if (tc[static_cast<std::size_t>(b)] == tg[static_cast<std::size_t>(b)])
          worst = std::max(
              worst, std::abs(static_cast<double>(lc[static_cast<std::size_t>(b)]) - lg[static_cast<std::size_t>(b)]));
      std::printf("  [%s] sample %-30s tokens differ %d/%d, log-prob max diff %.2e\n", dtype_name(st()), tag.c_str(),
                  differ, B, worst);
      EXPECT_LE(worst, 1e-4) << tag;
    }
  }
}

// Ops::decode_advance on the GPU does what the CPU reference does, exactly (integers and copies only): 300 rows, some
// done before, EOS ids, rows reaching the length, two steps into a ring.
TEST_P(OpsCuda, DecodeAdvanceMatchesCpu) {
  const int R = 300, max_count = 6;
  std::mt19937 gen(5);
  Ids ids(R), pos(R), count(R), done(R), tok(R), eos = {3, 17, 29};
  Vec lp(R);
  std::vector<std::uint64_t> seeds(R), streams(R);
  for (int r = 0; r < R; ++r) {
    const auto i = static_cast<std::size_t>(r);
    ids[i] = static_cast<std::int32_t>(gen() % 50);
    pos[i] = static_cast<std::int32_t>(gen() % 100);
    count[i] = static_cast<std::int32_t>(gen() % max_count);
    done[i] = gen() % 5 == 0;
    tok[i] = static_cast<std::int32_t>(gen() % 40);
    lp[i] = -static_cast<float>(gen() % 1000) / 100.0f;
    seeds[i] = gen();
    streams[i] = (static_cast<std::uint64_t>(gen()) << 32) | gen();
  }
  Pair d_ids = i32(ids), d_pos = i32(pos), d_count = i32(count), d_done = i32(done), d_tok = i32(tok), d_eos = i32(eos);
  Pair d_lp = f32(lp), ring_t = i32(Ids(2 * R, -1)), ring_l = f32(Vec(2 * R, 0.0f));
  void* seeds_c = own(*cpu_, seeds.size() * 8);
  void* seeds_g = own(*gpu_, seeds.size() * 8);
  void* streams_c = own(*cpu_, streams.size() * 8);
  void* streams_g = own(*gpu_, streams.size() * 8);
  cpu_->upload(seeds_c, seeds.data(), seeds.size() * 8);
  gpu_->upload(seeds_g, seeds.data(), seeds.size() * 8);
  cpu_->upload(streams_c, streams.data(), streams.size() * 8);
  gpu_->upload(streams_g, streams.data(), streams.size() * 8);
  for (int step = 0; step < 2; ++step) {
    const bool on_gpu[2] = {false, true};
    for (bool g : on_gpu) {
      Ops& ops = g ? *gpu_ : *cpu_;
      auto P = [g](const Pair& p) { return g ? p.g : p.c; };
      ops.decode_advance(static_cast<std::int32_t*>(P(d_ids)), static_cast<std::int32_t*>(P(d_pos)),
                         static_cast<std::int32_t*>(P(d_count)), static_cast<std::int32_t*>(P(d_done)),
                         static_cast<std::uint64_t*>(g ? seeds_g : seeds_c),
                         static_cast<std::int32_t*>(P(ring_t)) + step * R, static_cast<float*>(P(ring_l)) + step * R,
                         static_cast<const std::int32_t*>(P(d_tok)), static_cast<const float*>(P(d_lp)),
                         static_cast<const std::uint64_t*>(g ? streams_g : streams_c),
                         static_cast<const std::int32_t*>(P(d_eos)), 3, max_count, R);
    }
  }
  auto ints = [&](const Pair& p, bool g) {
    Ids v(p.n);
    (g ? *gpu_ : *cpu_).download(v.data(), g ? p.g : p.c, v.size() * 4);
    return v;
  };
  for (const Pair* p : {&d_ids, &d_pos, &d_count, &d_done, &ring_t}) EXPECT_EQ(ints(*p, false), ints(*p, true));
  EXPECT_EQ(cpu_values(ring_l), gpu_values(ring_l));
  std::vector<std::uint64_t> sc(seeds.size()), sg(seeds.size());
  cpu_->download(sc.data(), seeds_c, sc.size() * 8);
  gpu_->download(sg.data(), seeds_g, sg.size() * 8);
  EXPECT_EQ(sc, sg);
  int finished = 0;
  for (int v : ints(d_done, false)) finished += v;
  EXPECT_GT(finished, R / 5) << "some rows end in the test";
}

// The repetition penalty's ops on the GPU against the CPU reference: the penalised logits exactly (an IEEE multiply or
// divide per logit), the tables after mark_seen exactly, and token_logprobs to 1e-5 (its double sums in another
// order): 70 rows over 40 slots of a 50000-token vocabulary, logits of both signs and zeros, some rows sharing a slot.
TEST_P(OpsCuda, RepetitionPenaltyOpsMatchCpu) {
  const int R = 70, S = 40, V = 50000;
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  Vec z(static_cast<std::size_t>(R) * V);
  for (auto& x : z) x = gen() % 97 == 0 ? 0.0f : normal(gen);
  std::vector<std::uint8_t> seen(static_cast<std::size_t>(S) * V);
  for (auto& b : seen) b = gen() % 7 == 0;
  Ids rows(R), tok(R);
  for (int r = 0; r < R; ++r) {
    rows[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(gen() % S);
    tok[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(gen() % V);
  }
  Pair d_z = f32(z), d_out = f32(Vec(z.size(), -1.0f)), d_rows = i32(rows), d_tok = i32(tok), d_lp = f32(Vec(R, 0.0f));
  void* seen_c = own(*cpu_, seen.size());
  void* seen_g = own(*gpu_, seen.size());
  cpu_->upload(seen_c, seen.data(), seen.size());
  gpu_->upload(seen_g, seen.data(), seen.size());
  for (const bool g : {false, true}) {
    Ops& ops = g ? *gpu_ : *cpu_;
    auto P = [g](const Pair& p) { return g ? p.g : p.c; };
    auto* table = static_cast<std::uint8_t*>(g ? seen_g : seen_c);
    ops.repetition_penalty(static_cast<float*>(P(d_out)), static_cast<const float*>(P(d_z)), table,
                           static_cast<const std::int32_t*>(P(d_rows)), R, V, 1.3f);
    ops.token_logprobs(static_cast<float*>(P(d_lp)), static_cast<const float*>(P(d_z)),
                       static_cast<const std::int32_t*>(P(d_tok)), R, V);
    ops.mark_seen(table, static_cast<const std::int32_t*>(P(d_rows)), static_cast<const std::int32_t*>(P(d_tok)), R, V);
  }
  EXPECT_EQ(cpu_values(d_out), gpu_values(d_out));
  const Vec lc = cpu_values(d_lp), lg = gpu_values(d_lp);
  for (int r = 0; r < R; ++r) EXPECT_NEAR(lc[static_cast<std::size_t>(r)], lg[static_cast<std::size_t>(r)], 1e-5) << r;
  std::vector<std::uint8_t> tc(seen.size()), tg(seen.size());
  cpu_->download(tc.data(), seen_c, tc.size());
  gpu_->download(tg.data(), seen_g, tg.size());
  EXPECT_EQ(tc, tg);
  EXPECT_NE(tc, seen) << "mark_seen set no new entry";
}

INSTANTIATE_TEST_SUITE_P(Storage, OpsCuda, ::testing::Values(DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(info.param == DType::BF16 ? "bf16" : "fp16");
                         });

}  // namespace
}  // namespace mgrl::kernels

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("test_ops_cuda: no usable CUDA device (%s): skipped\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
