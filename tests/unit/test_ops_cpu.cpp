// test_ops_cpu.cpp: the fp32 CPU reference ops: forwards against naive double loops, backwards against
// central finite differences, padding and GQA behaviour of attention, chunked lm_head against full logits
// (its fused forward-and-backward pass bitwise against the two ops), the residual add fused into RMSNorm bitwise
// against the separate ops.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
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
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

namespace mgrl::kernels::cpu {
namespace {

using Vec = std::vector<float>;

Vec randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// sum(out * w) in double: the scalar loss the finite differences are taken of.
double dot(const Vec& out, const Vec& w) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
  return s;
}

// Checks grad (analytic dloss/dparam) against central differences of loss() in param. The perturbation is the
// fp32-representable step actually taken. A coordinate passes when
//   |numeric - analytic| <= rtol * (|analytic| + rms(analytic))
// i.e. relative for large entries and relative to the gradient's scale for entries near zero. All coordinates
// are checked up to max_coords, a fixed random sample beyond.
void check_grad(const std::string& name, Vec& param, const Vec& grad, const std::function<double()>& loss,
                double eps = 1e-3, double rtol = 1e-2, size_t max_coords = 2000) {
  ASSERT_EQ(param.size(), grad.size()) << name;
  std::vector<size_t> idx(param.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  if (idx.size() > max_coords) {
    std::mt19937 gen(1234);
    std::shuffle(idx.begin(), idx.end(), gen);
    idx.resize(max_coords);
  }
  double ss = 0.0;
  for (size_t i : idx) ss += static_cast<double>(grad[i]) * grad[i];
  const double rms = std::sqrt(ss / static_cast<double>(idx.size()));
  ASSERT_GT(rms, 0.0) << name << ": analytic gradient is all zero";
  int failures = 0;
  double worst = 0.0;
  for (size_t i : idx) {
    const float orig = param[i];
    const float xp = static_cast<float>(orig + eps), xm = static_cast<float>(orig - eps);
    param[i] = xp;
    const double lp = loss();
    param[i] = xm;
    const double lm = loss();
    param[i] = orig;
    const double num = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
    const double err = std::abs(num - grad[i]) / (std::abs(grad[i]) + rms);
    worst = std::max(worst, err);
    if (err > rtol && failures++ < 5) {
      ADD_FAILURE() << name << "[" << i << "]: numeric " << num << " vs analytic " << grad[i];
    }
  }
  if (std::getenv("MGRL_TEST_VERBOSE"))
    std::printf("  %-18s %5zu coords, worst %.2e\n", name.c_str(), idx.size(), worst);
  EXPECT_EQ(failures, 0) << name << ": " << failures << " of " << idx.size() << " coordinates off (worst " << worst
                         << ")";
}

// Relative tolerance of the finite-difference checks: 2e-3 for the ops built from products and elementwise
// functions, 1e-2 (the default) for attention and lm_head, whose softmax sums add fp32 noise to the loss.
constexpr double kTightRtol = 2e-3;

void expect_near_vec(const Vec& got, const std::vector<double>& want, double atol, const std::string& name) {
  ASSERT_EQ(got.size(), want.size()) << name;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) > atol * (1.0 + std::abs(want[i])) && bad++ < 5) {
      ADD_FAILURE() << name << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << name;
}

// ---------------------------------------------------------------------------------------------------------------
// embedding

TEST(OpsCpu, EmbeddingForwardGathersAndPaddingIsZero) {
  const int V = 11, D = 7;
  const std::vector<int32_t> ids = {3, 0, 10, 3, -1, 5, 3, 7, -1};
  const int T = static_cast<int>(ids.size());
  Vec table = randn(static_cast<size_t>(V) * D, 1);
  Vec out(static_cast<size_t>(T) * D, 42.0f);
  embedding_forward(out.data(), ids.data(), table.data(), T, V, D);
  for (int t = 0; t < T; ++t) {
    for (int d = 0; d < D; ++d) {
      const float want = ids[t] < 0 ? 0.0f : table[static_cast<size_t>(ids[t]) * D + d];
      EXPECT_EQ(out[static_cast<size_t>(t) * D + d], want) << t << "," << d;
    }
  }
  const std::vector<int32_t> bad = {V};
  EXPECT_THROW(embedding_forward(out.data(), bad.data(), table.data(), 1, V, D), FatalError);
}

TEST(OpsCpu, EmbeddingBackwardScatterAddsMatchesFiniteDifferences) {
  const int V = 11, D = 7;
  const std::vector<int32_t> ids = {3, 0, 10, 3, -1, 5, 3, 7, -1};
  const int T = static_cast<int>(ids.size());
  Vec table = randn(static_cast<size_t>(V) * D, 2);
  const Vec rw = randn(static_cast<size_t>(T) * D, 3);
  Vec out(rw.size());
  auto loss = [&] {
    embedding_forward(out.data(), ids.data(), table.data(), T, V, D);
    return dot(out, rw);
  };
  Vec dtable(table.size(), 0.5f);  // accumulates onto what is there
  embedding_backward(dtable.data(), rw.data(), ids.data(), T, V, D);
  for (auto& g : dtable) g -= 0.5f;
  // id 3 appears three times: its row is the sum of three dout rows.
  for (int d = 0; d < D; ++d) {
    const double want = static_cast<double>(rw[0 * D + d]) + rw[3 * D + d] + rw[6 * D + d];
    EXPECT_NEAR(dtable[3 * D + d], want, 1e-5);
  }
  check_grad("dtable", table, dtable, loss, 1e-3, kTightRtol);
}

// ---------------------------------------------------------------------------------------------------------------
// rmsnorm

std::vector<double> naive_rmsnorm(const Vec& x, const Vec& w, int rows, int dim, double eps) {
  std::vector<double> y(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double s = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * s * w[i];
  }
  return y;
}

void rmsnorm_case(int rows, int dim, uint32_t seed) {
  const float eps = 1e-5f;
  Vec x = randn(static_cast<size_t>(rows) * dim, seed);
  Vec w = randn(static_cast<size_t>(dim), seed + 1, 0.5f);
  for (auto& v : w) v += 1.0f;
  const Vec rw = randn(x.size(), seed + 2);
  Vec out(x.size()), rstd(static_cast<size_t>(rows));
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, dim, eps);
  expect_near_vec(out, naive_rmsnorm(x, w, rows, dim, eps), 1e-6, "rmsnorm out");

  Vec dx(x.size()), dw(w.size(), 0.0f);
  rmsnorm_backward(dx.data(), dw.data(), rw.data(), x.data(), w.data(), rstd.data(), rows, dim, false);
  auto loss = [&] {
    Vec o(x.size()), r(static_cast<size_t>(rows));
    rmsnorm_forward(o.data(), r.data(), x.data(), w.data(), rows, dim, eps);
    return dot(o, rw);
  };
  check_grad("rmsnorm dx", x, dx, loss, 1e-3, kTightRtol);
  check_grad("rmsnorm dw", w, dw, loss, 1e-3, kTightRtol);

  // accumulate: dx += ..., dw += ... again
  Vec dx2(x.size(), 1.0f), dw2 = dw;
  rmsnorm_backward(dx2.data(), dw2.data(), rw.data(), x.data(), w.data(), rstd.data(), rows, dim, true);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx2[i], 1.0f + dx[i], 1e-5);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw2[i], 2.0f * dw[i], 1e-4 * (1 + std::abs(dw[i])));
}

TEST(OpsCpu, RmsnormForwardAndBackward) { rmsnorm_case(5, 13, 10); }

// Qwen3 q_norm / k_norm: rows of head_dim, one weight of head_dim shared by every head.
TEST(OpsCpu, RmsnormPerHead) {
  const int T = 3, n_heads = 4, head_dim = 6;
  rmsnorm_case(T * n_heads, head_dim, 20);
}

TEST(OpsCpu, RmsnormInPlace) {
  const int rows = 3, dim = 9;
  Vec x = randn(static_cast<size_t>(rows) * dim, 30), w = randn(static_cast<size_t>(dim), 31);
  Vec out(x.size()), r1(rows), r2(rows);
  rmsnorm_forward(out.data(), r1.data(), x.data(), w.data(), rows, dim, 1e-6f);
  rmsnorm_forward(x.data(), r2.data(), x.data(), w.data(), rows, dim, 1e-6f);
  EXPECT_EQ(out, x);
}

// The residual add fused into the norm: bit for bit copy + residual_forward + rmsnorm_forward, at several shapes
// (per-head 64 and 128, hidden 896, odd 100 and 13), with and without Gemma's unit offset, x_out apart from x_in and
// in place (the inference engine's residual stream).
bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

TEST(OpsCpu, ResidualRmsnormIsResidualThenRmsnormBitwise) {
  struct Case {
    int rows, dim;
  };
  uint32_t seed = 40;
  for (const Case cs : {Case{1, 64}, Case{9, 128}, Case{5, 896}, Case{3, 100}, Case{4, 13}}) {
    for (bool unit : {false, true}) {
      for (bool in_place : {false, true}) {
        const std::string tag = std::to_string(cs.rows) + "x" + std::to_string(cs.dim) + (unit ? " unit" : "") +
                                (in_place ? " in place" : "");
        const size_t n = static_cast<size_t>(cs.rows) * cs.dim;
        const Vec x_in = randn(n, seed++, 3.0f), y = randn(n, seed++), w = randn(static_cast<size_t>(cs.dim), seed++);
        // The old sequence.
        Vec x_mid = x_in, h(n), rstd(static_cast<size_t>(cs.rows));
        residual_forward(x_mid.data(), y.data(), static_cast<int64_t>(n));
        rmsnorm_forward(h.data(), rstd.data(), x_mid.data(), w.data(), cs.rows, cs.dim, 1e-6f, unit);
        // The fused op.
        Vec x_out = in_place ? x_in : Vec(n, 7.0f), h2(n, 7.0f), rstd2(rstd.size(), 7.0f);
        const Vec x_src = x_in;
        residual_rmsnorm_forward(x_out.data(), h2.data(), rstd2.data(), in_place ? x_out.data() : x_src.data(),
                                 y.data(), w.data(), cs.rows, cs.dim, 1e-6f, unit);
        EXPECT_TRUE(same_bits(x_out, x_mid)) << tag << ": x_out";
        EXPECT_TRUE(same_bits(h2, h)) << tag << ": h";
        EXPECT_TRUE(same_bits(rstd2, rstd)) << tag << ": rstd";
        EXPECT_TRUE(same_bits(x_src, x_in)) << tag << ": x_in was written";
      }
    }
  }
}

TEST(OpsCpu, ResidualAddIsCopyThenResidualBitwise) {
  const int64_t n = 1003;
  const Vec a = randn(static_cast<size_t>(n), 60, 5.0f), b = randn(static_cast<size_t>(n), 61);
  Vec ref = a;
  residual_forward(ref.data(), b.data(), n);
  Vec out(static_cast<size_t>(n), 7.0f);
  residual_add(out.data(), a.data(), b.data(), n);
  EXPECT_TRUE(same_bits(out, ref));
  Vec in_a = a, in_b = b;  // out aliasing a, then b
  residual_add(in_a.data(), in_a.data(), b.data(), n);
  residual_add(in_b.data(), a.data(), in_b.data(), n);
  EXPECT_TRUE(same_bits(in_a, ref));
  EXPECT_TRUE(same_bits(in_b, ref));
}

// ---------------------------------------------------------------------------------------------------------------
// linear and LoRA

std::vector<double> naive_linear(const Vec& x, const Vec& W, const float* bias, int T, int in, int out) {
  std::vector<double> y(static_cast<size_t>(T) * out);
  for (int t = 0; t < T; ++t) {
    for (int o = 0; o < out; ++o) {
      double s = bias ? bias[o] : 0.0;
      for (int i = 0; i < in; ++i) s += static_cast<double>(x[t * in + i]) * W[o * in + i];
      y[t * out + o] = s;
    }
  }
  return y;
}

TEST(OpsCpu, LinearForwardAndBackward) {
  const int T = 7, in = 9, out = 5;
  Vec x = randn(static_cast<size_t>(T) * in, 40), W = randn(static_cast<size_t>(out) * in, 41),
      bias = randn(static_cast<size_t>(out), 42);
  const Vec rw = randn(static_cast<size_t>(T) * out, 43);
  Vec y(rw.size(), 99.0f);
  linear_forward(y.data(), x.data(), W.data(), bias.data(), T, in, out);
  expect_near_vec(y, naive_linear(x, W, bias.data(), T, in, out), 1e-5, "linear y (bias)");
  linear_forward(y.data(), x.data(), W.data(), nullptr, T, in, out);
  expect_near_vec(y, naive_linear(x, W, nullptr, T, in, out), 1e-5, "linear y (no bias)");

  auto loss = [&] {
    Vec o(rw.size());
    linear_forward(o.data(), x.data(), W.data(), bias.data(), T, in, out);
    return dot(o, rw);
  };
  Vec dx(x.size(), 7.0f), dW(W.size(), 0.0f), db(bias.size(), 0.0f);
  linear_backward(dx.data(), dW.data(), db.data(), rw.data(), x.data(), W.data(), T, in, out, false);
  check_grad("linear dx", x, dx, loss, 1e-3, kTightRtol);
  check_grad("linear dW", W, dW, loss, 1e-3, kTightRtol);
  check_grad("linear dbias", bias, db, loss, 1e-3, kTightRtol);

  // accumulate_dx adds; dW/dbias accumulate; null outputs are skipped.
  Vec dx2(x.size(), 1.0f), dW2 = dW;
  linear_backward(dx2.data(), dW2.data(), nullptr, rw.data(), x.data(), W.data(), T, in, out, true);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx2[i], 1.0f + dx[i], 1e-5);
  for (size_t i = 0; i < dW.size(); ++i) EXPECT_NEAR(dW2[i], 2.0f * dW[i], 1e-5 * (1 + std::abs(dW[i])));
  Vec dW3(W.size(), 0.0f);
  linear_backward(nullptr, dW3.data(), nullptr, rw.data(), x.data(), W.data(), T, in, out, false);
  for (size_t i = 0; i < dW.size(); ++i) EXPECT_FLOAT_EQ(dW3[i], dW[i]);
}

TEST(OpsCpu, LoraForwardAndBackward) {
  const int T = 7, in = 9, r = 3, out = 5;
  const float scale = 16.0f / 3.0f;  // lora_alpha / r
  Vec x = randn(static_cast<size_t>(T) * in, 50), A = randn(static_cast<size_t>(r) * in, 51, 0.3f),
      B = randn(static_cast<size_t>(out) * r, 52, 0.3f);
  const Vec base = randn(static_cast<size_t>(T) * out, 53);
  const Vec rw = randn(base.size(), 54);

  Vec y = base, xa(static_cast<size_t>(T) * r);
  lora_forward(y.data(), xa.data(), x.data(), A.data(), B.data(), scale, T, in, r, out);
  const std::vector<double> xa_want = naive_linear(x, A, nullptr, T, in, r);
  expect_near_vec(xa, xa_want, 1e-5, "lora xa");
  std::vector<double> y_want(base.size());
  for (int t = 0; t < T; ++t) {
    for (int o = 0; o < out; ++o) {
      double s = 0.0;
      for (int j = 0; j < r; ++j) s += xa_want[t * r + j] * B[o * r + j];
      y_want[t * out + o] = base[t * out + o] + scale * s;
    }
  }
  expect_near_vec(y, y_want, 1e-5, "lora y");

  auto loss = [&] {
    Vec o = base, s(static_cast<size_t>(T) * r);
    lora_forward(o.data(), s.data(), x.data(), A.data(), B.data(), scale, T, in, r, out);
    return dot(o, rw);
  };
  const Vec dx0 = randn(x.size(), 55);  // the base layer's dx: LoRA adds to it
  Vec dx = dx0, dA(A.size(), 0.0f), dB(B.size(), 0.0f), scratch(static_cast<size_t>(T) * r);
  lora_backward(dx.data(), dA.data(), dB.data(), rw.data(), x.data(), xa.data(), A.data(), B.data(), scale, T, in, r,
                out, scratch.data());
  Vec dx_lora(dx.size());
  for (size_t i = 0; i < dx.size(); ++i) dx_lora[i] = dx[i] - dx0[i];
  check_grad("lora dx", x, dx_lora, loss, 1e-3, kTightRtol);
  check_grad("lora dA", A, dA, loss, 1e-3, kTightRtol);
  check_grad("lora dB", B, dB, loss, 1e-3, kTightRtol);

  // Without a scratch buffer (allocated inside) the result is the same.
  Vec dx2 = dx0, dA2(A.size(), 0.0f), dB2(B.size(), 0.0f);
  lora_backward(dx2.data(), dA2.data(), dB2.data(), rw.data(), x.data(), xa.data(), A.data(), B.data(), scale, T, in, r,
                out, nullptr);
  EXPECT_EQ(dx2, dx);
  EXPECT_EQ(dA2, dA);
  EXPECT_EQ(dB2, dB);
}

// lora_merge: Wm = W + scale * B A against the product in double (the only error the f32 sum and the final rounding
// add: relative ~1e-6), bitwise against the documented order (k = 0 .. r-1, products and adds rounded one by one,
// then one add to W), in place as well; a merge with B = 0 leaves W as it is.
TEST(OpsCpu, LoraMergeMatchesDoubleAndItsOrder) {
  struct Shape {
    int out, in, r;
  };
  for (const Shape sh : {Shape{5, 9, 3}, Shape{33, 70, 16}, Shape{64, 17, 1}}) {
    SCOPED_TRACE("out " + std::to_string(sh.out) + " in " + std::to_string(sh.in) + " r " + std::to_string(sh.r));
    const float scale = 16.0f / static_cast<float>(sh.r);
    const Vec W = randn(static_cast<size_t>(sh.out) * sh.in, 60), A = randn(static_cast<size_t>(sh.r) * sh.in, 61, 0.3f),
              B = randn(static_cast<size_t>(sh.out) * sh.r, 62, 0.3f);
    Vec Wm(W.size());
    lora_merge(Wm.data(), W.data(), A.data(), B.data(), scale, sh.out, sh.in, sh.r);
    std::vector<double> want(W.size());
    Vec ordered(W.size());
    double worst = 0;
    for (int o = 0; o < sh.out; ++o)
      for (int i = 0; i < sh.in; ++i) {
        double d = 0;
        float acc = 0.0f;
        for (int k = 0; k < sh.r; ++k) {
          d += static_cast<double>(B[o * sh.r + k]) * A[k * sh.in + i];
          const volatile float p = B[o * sh.r + k] * A[k * sh.in + i];
          acc += p;
        }
        const size_t at = static_cast<size_t>(o) * sh.in + i;
        want[at] = W[at] + static_cast<double>(scale) * d;
        const volatile float sd = scale * acc;
        ordered[at] = W[at] + sd;
        worst = std::max(worst, std::abs(Wm[at] - want[at]));
      }
    expect_near_vec(Wm, want, 2e-5, "lora_merge vs double");
    EXPECT_GT(worst, 0.0);  // the f32 result is not the double one: the comparison above is not vacuous
    EXPECT_EQ(Wm, ordered) << "lora_merge does not sum in its documented order";
    Vec inplace = W;
    lora_merge(inplace.data(), inplace.data(), A.data(), B.data(), scale, sh.out, sh.in, sh.r);
    EXPECT_EQ(inplace, Wm);
    const Vec B0(B.size(), 0.0f);
    lora_merge(inplace.data(), W.data(), A.data(), B0.data(), scale, sh.out, sh.in, sh.r);
    EXPECT_EQ(inplace, W);
  }
}

// A LoRA group (lora_group_forward / lora_group_backward) against its members run one by one with lora_forward /
// lora_backward. Both are f32 BLAS; the group's products over x are other GEMM shapes (N = n r instead of r, K = n r
// for dx), which BLAS blocks differently, so a sum may be added in another order: each value agrees within
// kGroupRtol of the largest value of its tensor (the reordering of an f32 sum of K terms moves it by about
// sqrt(K) 2^-24 of the terms' magnitudes, ~1e-7 here; 1e-6 leaves room and still fails on an error of 1e-5, as the
// planted-error check below shows). The inputs are scaled to make every tensor O(1).
constexpr double kGroupRtol = 1e-6;

void expect_group_near(const Vec& got, const Vec& want, const std::string& name) {
  ASSERT_EQ(got.size(), want.size()) << name;
  double big = 0.0;
  for (float w : want) big = std::max(big, std::abs(static_cast<double>(w)));
  int bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::abs(static_cast<double>(got[i]) - want[i]) > kGroupRtol * big && ++bad <= 3)
      first += " [" + std::to_string(i) + "] " + std::to_string(got[i]) + " vs " + std::to_string(want[i]);
  EXPECT_EQ(bad, 0) << name << ": values beyond " << kGroupRtol << " of the largest (" << big << "):" << first;
}

struct GroupCase {
  std::vector<int> outs;  // one member per output width
  int T, in, r;
  bool with_dx = true, with_dA = true;
};

void check_lora_group(const GroupCase& gc, uint32_t seed) {
  const int n = static_cast<int>(gc.outs.size()), T = gc.T, in = gc.in, r = gc.r;
  const Vec x = randn(static_cast<size_t>(T) * in, seed);
  std::vector<Vec> A, B, y0, dy, dA0, dB0;
  std::vector<float> scale;
  for (int m = 0; m < n; ++m) {
    const int out = gc.outs[m];
    A.push_back(randn(static_cast<size_t>(r) * in, seed + 10 * m + 1, 1.0f / std::sqrt(static_cast<float>(in))));
    B.push_back(randn(static_cast<size_t>(out) * r, seed + 10 * m + 2, 0.5f));
    y0.push_back(randn(static_cast<size_t>(T) * out, seed + 10 * m + 3));
    dy.push_back(randn(static_cast<size_t>(T) * out, seed + 10 * m + 4));
    dA0.push_back(randn(A.back().size(), seed + 10 * m + 5, 0.1f));  // gradients accumulate onto what is there
    dB0.push_back(randn(B.back().size(), seed + 10 * m + 6, 0.1f));
    scale.push_back(2.0f - 0.25f * static_cast<float>(m));  // each member its own scale
  }
  const Vec dx0 = randn(x.size(), seed + 99);
  // The members one by one.
  std::vector<Vec> y_ref = y0, xa_ref, dA_ref = dA0, dB_ref = dB0;
  Vec dx_ref = dx0;
  for (int m = 0; m < n; ++m) {
    xa_ref.emplace_back(static_cast<size_t>(T) * r);
    lora_forward(y_ref[m].data(), xa_ref[m].data(), x.data(), A[m].data(), B[m].data(), scale[m], T, in, r,
                 gc.outs[m]);
    lora_backward(gc.with_dx ? dx_ref.data() : nullptr, gc.with_dA ? dA_ref[m].data() : nullptr, dB_ref[m].data(),
                  dy[m].data(), x.data(), xa_ref[m].data(), A[m].data(), B[m].data(), scale[m], T, in, r, gc.outs[m],
                  nullptr);
  }
  // The group, with the caller's scratch and with its own.
  for (const bool own_scratch : {false, true}) {
    SCOPED_TRACE("n = " + std::to_string(n) + ", T = " + std::to_string(T) + (own_scratch ? ", own scratch" : ""));
    std::vector<Vec> y = y0, xa, dA = dA0, dB = dB0;
    Vec dx = dx0, scratch(lora_group_scratch_floats(T, in, r, n), std::nanf(""));
    std::vector<LoraMember> g(static_cast<size_t>(n));
    for (int m = 0; m < n; ++m) {
      xa.emplace_back(static_cast<size_t>(T) * r, std::nanf(""));  // written, not read, by the forward
      g[m].y = y[m].data();
      g[m].dy = dy[m].data();
      g[m].xa = xa[m].data();
      g[m].A = A[m].data();
      g[m].B = B[m].data();
      g[m].dA = gc.with_dA ? dA[m].data() : nullptr;
      g[m].dB = dB[m].data();
      g[m].scale = scale[m];
      g[m].out = gc.outs[m];
    }
    float* sc = own_scratch ? nullptr : scratch.data();
    lora_group_forward(g.data(), n, x.data(), T, in, r, sc);
    lora_group_backward(gc.with_dx ? dx.data() : nullptr, g.data(), n, x.data(), T, in, r, sc);
    for (int m = 0; m < n; ++m) {
      const std::string tag = " of member " + std::to_string(m);
      expect_group_near(xa[m], xa_ref[m], "xa" + tag);
      expect_group_near(y[m], y_ref[m], "y" + tag);
      expect_group_near(dA[m], dA_ref[m], "dA" + tag);
      expect_group_near(dB[m], dB_ref[m], "dB" + tag);
    }
    expect_group_near(dx, dx_ref, "dx");
  }
}

TEST(OpsCpu, LoraGroupEqualsItsMembersOneByOne) {
  check_lora_group({{24}, 7, 32, 4}, 300);                        // a group of one
  check_lora_group({{40, 16}, 33, 32, 4}, 310);                   // gate|up-like: two members (or q, v of q|k|v)
  check_lora_group({{32, 16, 16}, 65, 32, 4}, 320);               // q|k|v with GQA widths
  check_lora_group({{48, 8, 24}, 130, 96, 8}, 330);               // wider rows, higher rank
  check_lora_group({{16, 16}, 9, 24, 3, false, false}, 340);      // no dx, no dA: only dB
  check_lora_group({{16, 16, 8}, 9, 24, 3, true, false}, 350);    // dx without dA
  check_lora_group({{16, 16, 8}, 9, 24, 3, false, true}, 360);    // dA without dx
}

// The tolerance is not loose: an error of 1e-5 of a tensor's largest value is reported.
TEST(OpsCpu, LoraGroupToleranceCatchesASmallError) {
  Vec want = randn(64, 370), got = want;
  double big = 0.0;
  for (float w : want) big = std::max(big, std::abs(static_cast<double>(w)));
  got[17] += static_cast<float>(1e-5 * big);
  EXPECT_NONFATAL_FAILURE(expect_group_near(got, want, "planted"), "planted");
}

// ---------------------------------------------------------------------------------------------------------------
// rope


std::vector<double> naive_rope(const Vec& x, const std::vector<int32_t>& pos, const Vec& inv_freq, int T, int nh,
                               int hd) {
  std::vector<double> y(x.size());
  const int half = hd / 2;
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < nh; ++h) {
      const size_t base = (static_cast<size_t>(t) * nh + h) * hd;
      for (int i = 0; i < hd; ++i) {
        // q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q2, q1), cos/sin = cat(freqs, freqs)
        const double a = static_cast<double>(pos[t]) * inv_freq[i % half];
        const double rot = i < half ? -static_cast<double>(x[base + i + half]) : x[base + i - half];
        y[base + i] = x[base + i] * std::cos(a) + rot * std::sin(a);
      }
    }
  }
  return y;
}

TEST(OpsCpu, RopeForwardBackwardAndRoundTrip) {
  const int T = 5, hd = 8;
  const std::vector<int32_t> pos = {0, 3, 1, 17, 250};
  Vec inv(hd / 2);  // the plain inverse frequencies 10000^(-2j/hd) (src/model/rope_freq.h computes the model's)
  for (int j = 0; j < hd / 2; ++j) inv[j] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * j / hd));
  for (int nh : {6, 2}) {  // q with 6 heads, k with 2
    Vec x = randn(static_cast<size_t>(T) * nh * hd, 60 + nh);
    Vec y = x;
    rope_forward(y.data(), pos.data(), inv.data(), T, nh, hd);
    // The op takes the angle as an fp32 product (like transformers): |error| <= pos * inv * 2^-24.
    expect_near_vec(y, naive_rope(x, pos, inv, T, nh, hd), 3e-5, "rope");
    for (int i = 0; i < nh * hd; ++i) EXPECT_EQ(y[i], x[i]) << "position 0 is the identity";

    Vec back = y;
    rope_backward(back.data(), pos.data(), inv.data(), T, nh, hd);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-5);

    const Vec rw = randn(x.size(), 70 + nh);
    Vec dx = rw;
    rope_backward(dx.data(), pos.data(), inv.data(), T, nh, hd);
    auto loss = [&] {
      Vec o = x;
      rope_forward(o.data(), pos.data(), inv.data(), T, nh, hd);
      return dot(o, rw);
    };
    check_grad("rope dx", x, dx, loss, 1e-3, kTightRtol);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// attention

// A packed batch: sequences of the given lengths back to back.
struct AttnShape {
  int nh, nkv, hd;
  std::vector<int32_t> lengths;
  int B() const { return static_cast<int>(lengths.size()); }
  std::vector<int32_t> cu() const {
    std::vector<int32_t> c{0};
    for (const int32_t n : lengths) c.push_back(c.back() + n);
    return c;
  }
  int T() const { return cu().back(); }
  int max_len() const { return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end()); }
  size_t nq() const { return static_cast<size_t>(T()) * nh * hd; }
  size_t nk() const { return static_cast<size_t>(T()) * nkv * hd; }
  size_t nl() const { return static_cast<size_t>(nh) * T(); }
};

void attn_fwd(const AttnShape& s, Vec& out, Vec& lse, const Vec& q, const Vec& k, const Vec& v) {
  const auto cu = s.cu();
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), cu.data(), s.B(), s.T(), s.max_len(), s.nh,
                    s.nkv, s.hd);
}

void attn_bwd(const AttnShape& s, Vec& dq, Vec& dk, Vec& dv, const Vec& dout, const Vec& q, const Vec& k,
              const Vec& v, const Vec& lse) {
  const auto cu = s.cu();
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), lse.data(), cu.data(),
                     s.B(), s.T(), s.max_len(), s.nh, s.nkv, s.hd);
}

// Explicit loops in double: out and lse.
void naive_attention(const AttnShape& s, const Vec& q, const Vec& k, const Vec& v, std::vector<double>& out,
                     std::vector<double>& lse) {
  const int group = s.nh / s.nkv, T = s.T();
  const auto cu = s.cu();
  out.assign(s.nq(), 0.0);
  lse.assign(s.nl(), 0.0);
  auto qi = [&](int r, int h, int d) { return q[(static_cast<size_t>(r) * s.nh + h) * s.hd + d]; };
  auto ki = [&](int r, int h, int d) { return k[(static_cast<size_t>(r) * s.nkv + h) * s.hd + d]; };
  auto vi = [&](int r, int h, int d) { return v[(static_cast<size_t>(r) * s.nkv + h) * s.hd + d]; };
  for (int b = 0; b < s.B(); ++b) {
    for (int h = 0; h < s.nh; ++h) {
      const int kh = h / group;
      for (int t = 0; t < s.lengths[b]; ++t) {
        const int r = cu[b] + t;
        std::vector<double> sc(static_cast<size_t>(t) + 1);
        double m = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          double d = 0.0;
          for (int e = 0; e < s.hd; ++e) d += static_cast<double>(qi(r, h, e)) * ki(cu[b] + u, kh, e);
          sc[u] = d / std::sqrt(static_cast<double>(s.hd));
          m = std::max(m, sc[u]);
        }
        double z = 0.0;
        for (int u = 0; u <= t; ++u) z += std::exp(sc[u] - m);
        lse[static_cast<size_t>(h) * T + r] = m + std::log(z);
        for (int u = 0; u <= t; ++u) {
          const double p = std::exp(sc[u] - m) / z;
          for (int e = 0; e < s.hd; ++e) out[(static_cast<size_t>(r) * s.nh + h) * s.hd + e] += p * vi(cu[b] + u, kh, e);
        }
      }
    }
  }
}

TEST(OpsCpu, AttentionForwardMatchesNaiveGqaMhaMqa) {
  const std::vector<AttnShape> shapes = {
      {6, 2, 5, {7, 4, 1, 0, 3}},  // GQA, groups of 3; different lengths, an empty sequence
      {3, 3, 4, {5, 3}},           // MHA
      {4, 1, 3, {2, 6}},           // MQA
  };
  uint32_t seed = 100;
  for (const auto& s : shapes) {
    const Vec q = randn(s.nq(), seed++), k = randn(s.nk(), seed++), v = randn(s.nk(), seed++);
    Vec out(s.nq(), 5.0f), lse(s.nl(), 5.0f);
    attn_fwd(s, out, lse, q, k, v);
    std::vector<double> out_want, lse_want;
    naive_attention(s, q, k, v, out_want, lse_want);
    expect_near_vec(out, out_want, 2e-6, "attention out nh=" + std::to_string(s.nh));
    expect_near_vec(lse, lse_want, 2e-6, "attention lse nh=" + std::to_string(s.nh));
  }
  Vec buf(64);
  const std::vector<int32_t> cu = {0, 3};
  // n_heads not a multiple of n_kv; cu_seqlens not ending at T; a sequence longer than max_len.
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), cu.data(), 1, 3, 3, 4, 3,
                                 2),
               FatalError);
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), cu.data(), 1, 4, 3, 2, 1,
                                 2),
               FatalError);
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), cu.data(), 1, 3, 2, 2, 1,
                                 2),
               FatalError);
}

// Each sequence of a packed batch gives exactly what it gives alone: no row of another sequence is read, and
// garbage (even NaN) there changes nothing, forward or backward.
TEST(OpsCpu, AttentionPackedSequencesAreIsolated) {
  const AttnShape s = {6, 2, 4, {6, 2, 4}};
  const auto cu = s.cu();
  const Vec q = randn(s.nq(), 200), k = randn(s.nk(), 201), v = randn(s.nk(), 202), dout = randn(s.nq(), 203);
  Vec out(s.nq(), 3.0f), lse(s.nl(), 3.0f);
  attn_fwd(s, out, lse, q, k, v);
  Vec dq(s.nq(), 1.0f), dk(s.nk(), 1.0f), dv(s.nk(), 1.0f);
  attn_bwd(s, dq, dk, dv, dout, q, k, v, lse);
  const size_t qw = static_cast<size_t>(s.nh) * s.hd, kw = static_cast<size_t>(s.nkv) * s.hd;
  for (int b = 0; b < s.B(); ++b) {
    const AttnShape one = {s.nh, s.nkv, s.hd, {s.lengths[b]}};
    const size_t r0 = static_cast<size_t>(cu[b]), n = static_cast<size_t>(s.lengths[b]);
    auto rows = [&](const Vec& x, size_t w) { return Vec(x.begin() + r0 * w, x.begin() + (r0 + n) * w); };
    const Vec q1 = rows(q, qw), k1 = rows(k, kw), v1 = rows(v, kw), g1 = rows(dout, qw);
    Vec o1(one.nq()), l1(one.nl());
    attn_fwd(one, o1, l1, q1, k1, v1);
    EXPECT_EQ(rows(out, qw), o1) << "sequence " << b;
    for (int h = 0; h < s.nh; ++h)
      for (size_t t = 0; t < n; ++t) EXPECT_EQ(lse[static_cast<size_t>(h) * s.T() + r0 + t], l1[h * n + t]);
    Vec dq1(one.nq()), dk1(one.nk()), dv1(one.nk());
    attn_bwd(one, dq1, dk1, dv1, g1, q1, k1, v1, l1);
    EXPECT_EQ(rows(dq, qw), dq1) << "sequence " << b;
    EXPECT_EQ(rows(dk, kw), dk1) << "sequence " << b;
    EXPECT_EQ(rows(dv, kw), dv1) << "sequence " << b;
  }
  // NaN in the other sequences' rows: the middle sequence's results are unchanged.
  Vec q2 = q, k2 = k, v2 = v, dout2 = dout;
  for (int r = 0; r < s.T(); ++r) {
    if (r >= cu[1] && r < cu[2]) continue;
    for (size_t i = 0; i < qw; ++i) q2[r * qw + i] = dout2[r * qw + i] = NAN;
    for (size_t i = 0; i < kw; ++i) k2[r * kw + i] = v2[r * kw + i] = NAN;
  }
  Vec out2(s.nq()), lse2(s.nl()), dq2(s.nq()), dk2(s.nk()), dv2(s.nk());
  attn_fwd(s, out2, lse2, q2, k2, v2);
  attn_bwd(s, dq2, dk2, dv2, dout2, q2, k2, v2, lse2);
  for (int r = cu[1]; r < cu[2]; ++r) {
    for (size_t i = 0; i < qw; ++i) {
      EXPECT_EQ(out2[r * qw + i], out[r * qw + i]);
      EXPECT_EQ(dq2[r * qw + i], dq[r * qw + i]);
    }
    for (size_t i = 0; i < kw; ++i) {
      EXPECT_EQ(dk2[r * kw + i], dk[r * kw + i]);
      EXPECT_EQ(dv2[r * kw + i], dv[r * kw + i]);
    }
  }
}

TEST(OpsCpu, AttentionBackwardMatchesFiniteDifferences) {
  const AttnShape s = {6, 2, 5, {7, 4, 1}};  // GQA 6 / 2, different lengths
  Vec q = randn(s.nq(), 300), k = randn(s.nk(), 301), v = randn(s.nk(), 302);
  const Vec rw = randn(s.nq(), 303);
  Vec out(s.nq()), lse(s.nl());
  attn_fwd(s, out, lse, q, k, v);
  Vec dq(s.nq()), dk(s.nk()), dv(s.nk());
  attn_bwd(s, dq, dk, dv, rw, q, k, v, lse);
  auto loss = [&] {
    Vec o(s.nq()), l(s.nl());
    attn_fwd(s, o, l, q, k, v);
    return dot(o, rw);
  };
  check_grad("attention dq", q, dq, loss);
  check_grad("attention dk", k, dk, loss);
  check_grad("attention dv", v, dv, loss);
}

// ---------------------------------------------------------------------------------------------------------------
// swiglu and residual

TEST(OpsCpu, WeightedSumAccumulates) {
  const Vec x = randn(101, 500), w = randn(101, 501);
  double want = 0;
  for (size_t i = 0; i < x.size(); ++i) want += static_cast<double>(x[i]) * w[i];
  double acc = 1.5;
  weighted_sum_accumulate(&acc, x.data(), w.data(), x.size(), -2.0);
  EXPECT_NEAR(acc, 1.5 - 2.0 * want, 1e-12 * (1 + std::abs(want)));
  weighted_sum_accumulate(&acc, x.data(), w.data(), 0, 3.0);  // nothing to add
  EXPECT_NEAR(acc, 1.5 - 2.0 * want, 1e-12 * (1 + std::abs(want)));
}

TEST(OpsCpu, SwigluForwardAndBackward) {
  const int n = 37;
  Vec gate = randn(n, 400, 2.0f), up = randn(n, 401);
  gate[0] = 30.0f;  // saturated sigmoid both ways: no inf / NaN
  gate[1] = -30.0f;
  const Vec rw = randn(n, 402);
  Vec out(n);
  swiglu_forward(out.data(), gate.data(), up.data(), n);
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) want[i] = gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i];
  expect_near_vec(out, want, 1e-6, "swiglu");
  Vec dg(n), du(n);
  swiglu_backward(dg.data(), du.data(), rw.data(), gate.data(), up.data(), n);
  for (int i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(dg[i]) && std::isfinite(du[i])) << i;
  auto loss = [&] {
    Vec o(n);
    swiglu_forward(o.data(), gate.data(), up.data(), n);
    return dot(o, rw);
  };
  check_grad("swiglu dgate", gate, dg, loss, 1e-3, kTightRtol);
  check_grad("swiglu dup", up, du, loss, 1e-3, kTightRtol);
  // dgate / dup may alias dout.
  Vec d1 = rw, d2(n);
  swiglu_backward(d1.data(), d2.data(), d1.data(), gate.data(), up.data(), n);
  EXPECT_EQ(d1, dg);
  EXPECT_EQ(d2, du);
}

TEST(OpsCpu, ResidualForwardAndIdentityBackward) {
  const int n = 13;
  const Vec x0 = randn(n, 500), y = randn(n, 501), dout = randn(n, 502);
  Vec x = x0;
  residual_forward(x.data(), y.data(), n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(x[i], x0[i] + y[i]);
  Vec dy(n, 9.0f);
  residual_backward(dy.data(), dout.data(), n, false);
  EXPECT_EQ(dy, dout);
  residual_backward(dy.data(), dout.data(), n, true);
  for (int i = 0; i < n; ++i) EXPECT_EQ(dy[i], 2.0f * dout[i]);
}

// ---------------------------------------------------------------------------------------------------------------
// lm_head + log-softmax

// Full logits and log_softmax in double.
void naive_logprob(const Vec& h, const Vec& W, const std::vector<int32_t>& targets, int T, int D, int V, double scale,
                   std::vector<double>& logprob, std::vector<double>& lse) {
  logprob.assign(T, 0.0);
  lse.assign(T, 0.0);
  for (int t = 0; t < T; ++t) {
    std::vector<double> l(V);
    double m = -INFINITY;
    for (int v = 0; v < V; ++v) {
      double s = 0.0;
      for (int d = 0; d < D; ++d) s += static_cast<double>(h[t * D + d]) * W[v * D + d];
      l[v] = scale * s;
      m = std::max(m, l[v]);
    }
    double z = 0.0;
    for (int v = 0; v < V; ++v) z += std::exp(l[v] - m);
    lse[t] = m + std::log(z);
    logprob[t] = targets[t] < 0 ? 0.0 : l[targets[t]] - lse[t];
  }
}

struct LmHeadCase {
  int T = 45, D = 19, V = 37;  // 45 rows: one full chunk of 32 and a partial one of 13
  Vec h, W, weights;
  std::vector<int32_t> targets;
  explicit LmHeadCase(uint32_t seed) {
    h = randn(static_cast<size_t>(T) * D, seed);
    W = randn(static_cast<size_t>(V) * D, seed + 1, 0.5f);
    weights = randn(static_cast<size_t>(T), seed + 2);  // GRPO-like: either sign
    std::mt19937 gen(seed + 3);
    for (int t = 0; t < T; ++t) targets.push_back(static_cast<int32_t>(gen() % V));
    for (int t : {0, 5, 33, 44}) targets[t] = -1;  // ignored, in both chunks
    weights[7] = 0.0f;
  }
};

TEST(OpsCpu, LmHeadChunkedMatchesFullLogSoftmax) {
  LmHeadCase c(600);
  for (float scale : {1.0f, 1.0f / 0.7f}) {
    Vec logprob(c.T, 9.0f), lse(c.T, 9.0f);
    lm_head_logprob_forward(logprob.data(), lse.data(), c.h.data(), c.W.data(), c.targets.data(), c.T, c.D, c.V, scale,
                            nullptr);
    std::vector<double> lp_want, lse_want;
    naive_logprob(c.h, c.W, c.targets, c.T, c.D, c.V, scale, lp_want, lse_want);
    expect_near_vec(logprob, lp_want, 2e-6, "lm_head logprob");
    expect_near_vec(lse, lse_want, 2e-6, "lm_head lse");
    for (int t : {0, 5, 33, 44}) EXPECT_EQ(logprob[t], 0.0f);

    // A caller-provided scratch buffer gives the same numbers.
    Vec scratch(static_cast<size_t>(lm_head_scratch_floats(c.V)));
    Vec lp2(c.T), lse2(c.T);
    lm_head_logprob_forward(lp2.data(), lse2.data(), c.h.data(), c.W.data(), c.targets.data(), c.T, c.D, c.V, scale,
                            scratch.data());
    EXPECT_EQ(lp2, logprob);
    EXPECT_EQ(lse2, lse);

    // Full logits for a few rows.
    const int rows = 3;
    Vec logits(static_cast<size_t>(rows) * c.V);
    lm_head_logits(logits.data(), c.h.data(), c.W.data(), rows, c.D, c.V, scale);
    std::vector<double> lw = naive_linear(c.h, c.W, nullptr, rows, c.D, c.V);
    for (auto& x : lw) x *= scale;
    expect_near_vec(logits, lw, 2e-6, "lm_head logits");
  }
  std::vector<int32_t> bad(c.T, 0);
  bad[40] = c.V;
  Vec a(c.T), b(c.T);
  EXPECT_THROW(
      lm_head_logprob_forward(a.data(), b.data(), c.h.data(), c.W.data(), bad.data(), c.T, c.D, c.V, 1.0f, nullptr),
      FatalError);
}

// trl's metrics from the head's pass: each row's entropy, whether its target is the most likely token and its mean logit,
// against
// the full log-softmax in double; the same from the fused forward-backward; lp and lse unchanged by asking for them.
TEST(OpsCpu, LmHeadStatsAreEntropyAndTop1) {
  LmHeadCase c(650);
  for (float scale : {1.0f, 1.0f / 0.7f}) {
    std::vector<double> lw = naive_linear(c.h, c.W, nullptr, c.T, c.D, c.V);
    for (auto& x : lw) x *= scale;
    // Half of the targets made the argmax, so that both outcomes are checked.
    std::vector<int32_t> targets = c.targets;
    for (int t = 1; t < c.T; t += 2) {
      if (targets[t] < 0) continue;
      int best = 0;
      for (int v = 1; v < c.V; ++v)
        if (lw[static_cast<size_t>(t) * c.V + v] > lw[static_cast<size_t>(t) * c.V + best]) best = v;
      targets[t] = best;
    }
    Vec lp(c.T), lse(c.T), stats(4 * static_cast<size_t>(c.T), 9.0f), lp0(c.T), lse0(c.T);
    lm_head_logprob_forward(lp.data(), lse.data(), c.h.data(), c.W.data(), targets.data(), c.T, c.D, c.V, scale,
                            nullptr, 0.0f, stats.data());
    lm_head_logprob_forward(lp0.data(), lse0.data(), c.h.data(), c.W.data(), targets.data(), c.T, c.D, c.V, scale,
                            nullptr);
    EXPECT_EQ(lp, lp0);
    EXPECT_EQ(lse, lse0);
    int hits = 0, misses = 0;
    for (int t = 0; t < c.T; ++t) {
      const double* l = lw.data() + static_cast<size_t>(t) * c.V;
      double m = -INFINITY;
      int best = 0;
      for (int v = 0; v < c.V; ++v)
        if (l[v] > m) m = l[v], best = v;
      double z = 0, pz = 0;
      for (int v = 0; v < c.V; ++v) z += std::exp(l[v] - m);
      for (int v = 0; v < c.V; ++v) pz += std::exp(l[v] - m) / z * l[v];
      const double entropy = m + std::log(z) - pz;
      double mean = 0, sq = 0;
      for (int v = 0; v < c.V; ++v) mean += l[v] / c.V;
      for (int v = 0; v < c.V; ++v) sq += std::exp(2 * (l[v] - m)) / (z * z);  // sum of p^2
      if (targets[t] < 0) {
        EXPECT_EQ(stats[t], 0.0f) << t;
        EXPECT_EQ(stats[c.T + t], 0.0f) << t;
        EXPECT_EQ(stats[2 * c.T + t], 0.0f) << t;
        EXPECT_EQ(stats[3 * c.T + t], 0.0f) << t;
        continue;
      }
      EXPECT_NEAR(stats[2 * c.T + t], mean, 2e-6) << "mean logit of row " << t;
      EXPECT_NEAR(stats[3 * c.T + t], std::log(sq), 5e-6) << "log sum p^2 of row " << t;
      EXPECT_LT(stats[3 * c.T + t], 0.0f);
      EXPECT_NEAR(stats[t], entropy, 5e-6) << "entropy of row " << t;
      EXPECT_GT(stats[t], 0.0f);
      EXPECT_EQ(stats[c.T + t], targets[t] == best ? 1.0f : 0.0f) << "top-1 of row " << t;
      (targets[t] == best ? hits : misses) += 1;
    }
    EXPECT_GT(hits, 10);
    EXPECT_GT(misses, 5);
    Vec lp2(c.T), lse2(c.T), stats2(stats.size(), 7.0f), dh(c.h.size()), dW(c.W.size(), 0.0f);
    lm_head_logprob_forward_backward(lp2.data(), lse2.data(), dh.data(), dW.data(), c.weights.data(), c.h.data(),
                                     c.W.data(), targets.data(), c.T, c.D, c.V, scale, nullptr, 0.0f, stats2.data());
    EXPECT_EQ(stats2, stats);
  }
}

TEST(OpsCpu, LmHeadBackwardMatchesFiniteDifferences) {
  LmHeadCase c(700);
  const float scale = 1.0f / 0.9f;
  Vec logprob(c.T), lse(c.T);
  lm_head_logprob_forward(logprob.data(), lse.data(), c.h.data(), c.W.data(), c.targets.data(), c.T, c.D, c.V, scale,
                          nullptr);
  Vec dh(c.h.size(), 5.0f), dW(c.W.size(), 0.0f);
  lm_head_logprob_backward(dh.data(), dW.data(), c.weights.data(), c.h.data(), c.W.data(), c.targets.data(), lse.data(),
                           c.T, c.D, c.V, scale, nullptr);
  auto loss = [&] {  // -sum_t w_t * logprob_t
    Vec lp(c.T), l(c.T);
    lm_head_logprob_forward(lp.data(), l.data(), c.h.data(), c.W.data(), c.targets.data(), c.T, c.D, c.V, scale,
                            nullptr);
    return -dot(lp, c.weights);
  };
  check_grad("lm_head dh", c.h, dh, loss);
  check_grad("lm_head dW", c.W, dW, loss);
  for (int t : {0, 5, 7, 33, 44}) {  // ignored or zero weight: no gradient
    for (int d = 0; d < c.D; ++d) EXPECT_EQ(dh[static_cast<size_t>(t) * c.D + d], 0.0f) << t;
  }
  // dW accumulates and may be skipped; a caller scratch buffer gives the same numbers.
  Vec scratch(static_cast<size_t>(lm_head_scratch_floats(c.V)));
  Vec dh2(c.h.size()), dW2 = dW;
  lm_head_logprob_backward(dh2.data(), dW2.data(), c.weights.data(), c.h.data(), c.W.data(), c.targets.data(),
                           lse.data(), c.T, c.D, c.V, scale, scratch.data());
  EXPECT_EQ(dh2, dh);
  for (size_t i = 0; i < dW.size(); ++i) EXPECT_NEAR(dW2[i], 2.0f * dW[i], 1e-5 * (1 + std::abs(dW[i])));
  Vec dh3(c.h.size());
  lm_head_logprob_backward(dh3.data(), nullptr, c.weights.data(), c.h.data(), c.W.data(), c.targets.data(), lse.data(),
                           c.T, c.D, c.V, scale, scratch.data());
  EXPECT_EQ(dh3, dh);
}

// GRPO's entropy bonus: the backward of -sum_t w_t logprob_t - sum_t u_t H_t (H_t from the forward's stats), plain
// and soft-capped, against finite differences of that loss; a row with u_t = 0 is bitwise as without the term.
TEST(OpsCpu, LmHeadBackwardEntropyTermMatchesFiniteDifferences) {
  for (const float cap : {0.0f, 3.0f}) {
    LmHeadCase c(701);
    const float scale = 1.0f / 0.8f;
    Vec u(c.T);
    for (int t = 0; t < c.T; ++t) u[static_cast<size_t>(t)] = t % 4 == 1 ? 0.0f : 0.05f * static_cast<float>(1 + t % 3);
    Vec logprob(c.T), lse(c.T), stats(4 * static_cast<size_t>(c.T));
    lm_head_logprob_forward(logprob.data(), lse.data(), c.h.data(), c.W.data(), c.targets.data(), c.T, c.D, c.V, scale,
                            nullptr, cap, stats.data());
    Vec dh(c.h.size(), 0.0f), dW(c.W.size(), 0.0f);
    lm_head_logprob_backward(dh.data(), dW.data(), c.weights.data(), c.h.data(), c.W.data(), c.targets.data(),
                             lse.data(), c.T, c.D, c.V, scale, nullptr, cap, u.data(), stats.data());
    auto loss = [&] {
      Vec lp(c.T), l(c.T), st(4 * static_cast<size_t>(c.T));
      lm_head_logprob_forward(lp.data(), l.data(), c.h.data(), c.W.data(), c.targets.data(), c.T, c.D, c.V, scale,
                              nullptr, cap, st.data());
      double ent = 0;
      for (int t = 0; t < c.T; ++t) ent += static_cast<double>(u[static_cast<size_t>(t)]) * st[static_cast<size_t>(t)];
      return -dot(lp, c.weights) - ent;
    };
    check_grad(cap > 0 ? "softcapped lm_head dh, entropy term" : "lm_head dh, entropy term", c.h, dh, loss);
    check_grad(cap > 0 ? "softcapped lm_head dW, entropy term" : "lm_head dW, entropy term", c.W, dW, loss);
    Vec plain(c.h.size(), 0.0f), zero(c.T, 0.0f), with_zero(c.h.size(), 0.0f);
    lm_head_logprob_backward(plain.data(), nullptr, c.weights.data(), c.h.data(), c.W.data(), c.targets.data(),
                             lse.data(), c.T, c.D, c.V, scale, nullptr, cap);
    lm_head_logprob_backward(with_zero.data(), nullptr, c.weights.data(), c.h.data(), c.W.data(), c.targets.data(),
                             lse.data(), c.T, c.D, c.V, scale, nullptr, cap, zero.data(), stats.data());
    EXPECT_EQ(with_zero, plain);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// the checker itself: a gradient that is 3% off, or one wrong coordinate, does not pass.

void check_wrong_gradient(float factor, int wrong_coord) {
  const int n = 37;
  Vec gate = randn(n, 800, 2.0f), up = randn(n, 801);
  const Vec rw = randn(n, 802);
  Vec dg(n), du(n);
  swiglu_backward(dg.data(), du.data(), rw.data(), gate.data(), up.data(), n);
  for (auto& g : dg) g *= factor;
  if (wrong_coord >= 0) dg[wrong_coord] += 0.05f;
  auto loss = [&] {
    Vec o(n);
    swiglu_forward(o.data(), gate.data(), up.data(), n);
    return dot(o, rw);
  };
  check_grad("wrong dgate", gate, dg, loss, 1e-3, kTightRtol);
}

// The failures check_grad reports for a wrong gradient, intercepted.
std::string intercepted_failures(float factor, int wrong_coord) {
  testing::TestPartResultArray results;
  {
    testing::ScopedFakeTestPartResultReporter reporter(
        testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    check_wrong_gradient(factor, wrong_coord);
  }
  std::string all;
  for (int i = 0; i < results.size(); ++i) all += results.GetTestPartResult(i).message();
  return all;
}

TEST(OpsCpu, FiniteDifferenceCheckCatchesWrongGradients) {
  EXPECT_EQ(intercepted_failures(1.0f, -1), "");  // the right gradient passes
  EXPECT_NE(intercepted_failures(1.03f, -1).find("coordinates off"), std::string::npos);
  const std::string one = intercepted_failures(1.0f, 11);
  EXPECT_NE(one.find("wrong dgate[11]"), std::string::npos) << one;
  EXPECT_NE(one.find("1 of 37 coordinates off"), std::string::npos) << one;
}

// ---------------------------------------------------------------------------------------------------------------
// model-family variants: attention with a score scale, a sliding window and soft-capping (Gemma 2/3, Mistral);
// (1 + w) RMSNorm, GeGLU, final-logit soft-capping and scaled embeddings (Gemma)

// Explicit loops in double, with the options: key u seen by query t iff t - window < u <= t.
void naive_attention_opt(const AttnShape& s, const Vec& q, const Vec& k, const Vec& v, const AttentionOptions& o,
                         std::vector<double>& out, std::vector<double>& lse) {
  const int group = s.nh / s.nkv, T = s.T();
  const auto cu = s.cu();
  const double scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(s.hd));
  out.assign(s.nq(), 0.0);
  lse.assign(s.nl(), 0.0);
  for (int b = 0; b < s.B(); ++b) {
    for (int h = 0; h < s.nh; ++h) {
      for (int t = 0; t < s.lengths[b]; ++t) {
        const int r = cu[b] + t;
        std::vector<double> sc;
        std::vector<int> keys;
        for (int u = 0; u <= t; ++u) {
          if (o.window > 0 && !(t - o.window < u)) continue;
          double d = 0.0;
          for (int e = 0; e < s.hd; ++e)
            d += static_cast<double>(q[(static_cast<size_t>(r) * s.nh + h) * s.hd + e]) *
                 k[(static_cast<size_t>(cu[b] + u) * s.nkv + h / group) * s.hd + e];
          d *= scale;
          if (o.softcap > 0) d = o.softcap * std::tanh(d / o.softcap);
          sc.push_back(d);
          keys.push_back(u);
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double z = 0.0;
        for (double x : sc) z += std::exp(x - m);
        lse[static_cast<size_t>(h) * T + r] = m + std::log(z);
        for (size_t i = 0; i < keys.size(); ++i) {
          const double p = std::exp(sc[i] - m) / z;
          for (int e = 0; e < s.hd; ++e)
            out[(static_cast<size_t>(r) * s.nh + h) * s.hd + e] +=
                p * v[(static_cast<size_t>(cu[b] + keys[i]) * s.nkv + h / group) * s.hd + e];
        }
      }
    }
  }
}

void attn_fwd_opt(const AttnShape& s, Vec& out, Vec& lse, const Vec& q, const Vec& k, const Vec& v,
                  const AttentionOptions& o) {
  const auto cu = s.cu();
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), cu.data(), s.B(), s.T(), s.max_len(), s.nh,
                    s.nkv, s.hd, o);
}

TEST(OpsCpu, AttentionWindowSoftcapScaleMatchNaive) {
  const AttnShape s = {6, 2, 5, {9, 4, 1, 0, 6}};
  const Vec q = randn(s.nq(), 800, 2.0f), k = randn(s.nk(), 801, 2.0f), v = randn(s.nk(), 802);
  for (const AttentionOptions& o : {AttentionOptions{0.3f, 0, 0}, AttentionOptions{0, 3, 0}, AttentionOptions{0, 1, 0},
                                    AttentionOptions{0, 0, 1.5f}, AttentionOptions{0.4f, 4, 2.0f}}) {
    Vec out(s.nq(), 7.0f), lse(s.nl(), 7.0f);
    attn_fwd_opt(s, out, lse, q, k, v, o);
    std::vector<double> ow, lw;
    naive_attention_opt(s, q, k, v, o, ow, lw);
    const std::string tag = " scale=" + std::to_string(o.scale) + " window=" + std::to_string(o.window) +
                            " softcap=" + std::to_string(o.softcap);
    expect_near_vec(out, ow, 2e-6, "attention out" + tag);
    expect_near_vec(lse, lw, 2e-6, "attention lse" + tag);
  }
  // A window covering the longest sequence is plain causal attention, bit for bit; window 1 sees only itself.
  Vec o1(s.nq()), l1(s.nl()), o2(s.nq()), l2(s.nl());
  attn_fwd(s, o1, l1, q, k, v);
  attn_fwd_opt(s, o2, l2, q, k, v, AttentionOptions{0, 9, 0});
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
  attn_fwd_opt(s, o2, l2, q, k, v, AttentionOptions{0, 8, 0});
  EXPECT_NE(o1, o2);  // the 9th row of sequence 0 no longer sees position 0
  attn_fwd_opt(s, o2, l2, q, k, v, AttentionOptions{0, 1, 0});
  const int group = s.nh / s.nkv;
  for (int r = 0; r < s.T(); ++r)
    for (int h = 0; h < s.nh; ++h)
      for (int e = 0; e < s.hd; ++e)
        EXPECT_EQ(o2[(static_cast<size_t>(r) * s.nh + h) * s.hd + e],
                  v[(static_cast<size_t>(r) * s.nkv + h / group) * s.hd + e]);
}

TEST(OpsCpu, AttentionWindowSoftcapBackwardMatchesFiniteDifferences) {
  const AttnShape s = {4, 2, 5, {8, 5, 1}};
  for (const AttentionOptions& o : {AttentionOptions{0, 3, 0}, AttentionOptions{0.35f, 0, 1.2f},
                                    AttentionOptions{0.5f, 4, 1.5f}}) {
    Vec q = randn(s.nq(), 900, 1.5f), k = randn(s.nk(), 901, 1.5f), v = randn(s.nk(), 902);
    const Vec rw = randn(s.nq(), 903);
    Vec out(s.nq()), lse(s.nl());
    attn_fwd_opt(s, out, lse, q, k, v, o);
    Vec dq(s.nq()), dk(s.nk()), dv(s.nk());
    const auto cu = s.cu();
    attention_backward(dq.data(), dk.data(), dv.data(), rw.data(), q.data(), k.data(), v.data(), lse.data(), cu.data(),
                       s.B(), s.T(), s.max_len(), s.nh, s.nkv, s.hd, o);
    auto loss = [&] {
      Vec ou(s.nq()), l(s.nl());
      attn_fwd_opt(s, ou, l, q, k, v, o);
      return dot(ou, rw);
    };
    const std::string tag = " window=" + std::to_string(o.window) + " softcap=" + std::to_string(o.softcap);
    check_grad("attention dq" + tag, q, dq, loss);
    check_grad("attention dk" + tag, k, dk, loss);
    check_grad("attention dv" + tag, v, dv, loss);
  }
}

// Cached attention (prefill of every position through a paged cache) equals the training attention with the same
// options; with a window the blocks before it are never read (their table entries are -1 here).
TEST(OpsCpu, AttentionCachedWindowSoftcapEqualsTrainingAttention) {
  const AttnShape s = {4, 2, 6, {11, 7}};
  const Vec q = randn(s.nq(), 950, 1.5f), k = randn(s.nk(), 951, 1.5f), v = randn(s.nk(), 952);
  const auto cu = s.cu();
  const int bs = 2, max_blocks = 6;
  std::vector<int32_t> table(static_cast<size_t>(s.B()) * max_blocks);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  KvPages pages;
  pages.table = table.data();
  pages.slots = s.B();
  pages.max_blocks = max_blocks;
  pages.block_size = bs;
  pages.n_blocks = s.B() * max_blocks;
  const size_t kw = static_cast<size_t>(s.nkv) * s.hd;
  Vec ck(static_cast<size_t>(pages.n_blocks) * bs * kw), cv(ck.size());
  std::vector<int32_t> slot, pos;
  for (int b = 0; b < s.B(); ++b)
    for (int t = 0; t < s.lengths[b]; ++t) {
      slot.push_back(b);
      pos.push_back(t);
    }
  kv_store(ck.data(), cv.data(), k.data(), v.data(), slot.data(), pos.data(), s.T(), pages, s.nkv, s.hd);
  for (const AttentionOptions& o : {AttentionOptions{}, AttentionOptions{0, 3, 0}, AttentionOptions{0.3f, 4, 1.5f}}) {
    Vec want(s.nq()), lse(s.nl()), got(s.nq());
    attn_fwd_opt(s, want, lse, q, k, v, o);
    attention_cached(got.data(), q.data(), ck.data(), cv.data(), slot.data(), pos.data(), s.T(), pages, s.nh, s.nkv,
                     s.hd, o);
    expect_near_vec(got, std::vector<double>(want.begin(), want.end()), 2e-6,
                    "attention_cached window=" + std::to_string(o.window));
  }
  // Decode of the last position of sequence 0 with window 3: positions 0..7 (blocks 0..3) are never read.
  std::vector<int32_t> cut = table;
  for (int blk = 0; blk < 4; ++blk) cut[static_cast<size_t>(blk)] = -1;
  KvPages cut_pages = pages;
  cut_pages.table = cut.data();
  const int32_t one_slot = 0, one_pos = 10;
  const AttentionOptions o{0, 3, 0};
  Vec want(s.nq()), lse(s.nl()), got(static_cast<size_t>(s.nh) * s.hd);
  attn_fwd_opt(s, want, lse, q, k, v, o);
  attention_cached(got.data(), q.data() + static_cast<size_t>(10) * s.nh * s.hd, ck.data(), cv.data(), &one_slot,
                   &one_pos, 1, cut_pages, s.nh, s.nkv, s.hd, o);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[static_cast<size_t>(10) * s.nh * s.hd + i], 2e-6);
  EXPECT_THROW(attention_cached(got.data(), q.data(), ck.data(), cv.data(), &one_slot, &one_pos, 1, cut_pages, s.nh,
                                s.nkv, s.hd, AttentionOptions{0, 5, 0}),
               FatalError);  // window 5 reaches position 6, whose block is gone
}

TEST(OpsCpu, RmsnormUnitOffsetForwardAndBackward) {
  const int rows = 6, dim = 11;
  const float eps = 1e-6f;
  Vec x = randn(static_cast<size_t>(rows) * dim, 1000), w = randn(static_cast<size_t>(dim), 1001, 0.3f);
  const Vec rw = randn(x.size(), 1002);
  Vec out(x.size()), rstd(rows);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, dim, eps, true);
  Vec w1 = w;
  for (auto& e : w1) e += 1.0f;
  expect_near_vec(out, naive_rmsnorm(x, w1, rows, dim, eps), 1e-6, "rmsnorm (1 + w)");
  Vec dx(x.size()), dw(w.size(), 0.0f);
  rmsnorm_backward(dx.data(), dw.data(), rw.data(), x.data(), w.data(), rstd.data(), rows, dim, false, true);
  auto loss = [&] {
    Vec o(x.size()), r(rows);
    rmsnorm_forward(o.data(), r.data(), x.data(), w.data(), rows, dim, eps, true);
    return dot(o, rw);
  };
  check_grad("rmsnorm(1+w) dx", x, dx, loss, 1e-3, kTightRtol);
  check_grad("rmsnorm(1+w) dw", w, dw, loss, 1e-3, kTightRtol);
}

TEST(OpsCpu, GegluForwardAndBackward) {
  const int n = 41;
  Vec gate = randn(n, 1100, 2.0f), up = randn(n, 1101);
  gate[0] = 12.0f;  // saturated tanh both ways: no inf / NaN
  gate[1] = -12.0f;
  const Vec rw = randn(n, 1102);
  Vec out(n);
  geglu_forward(out.data(), gate.data(), up.data(), n);
  std::vector<double> want(n);
  for (int i = 0; i < n; ++i) {
    const double g = gate[i];
    want[i] = 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * up[i];
  }
  expect_near_vec(out, want, 1e-6, "geglu");
  Vec dg(n), du(n);
  geglu_backward(dg.data(), du.data(), rw.data(), gate.data(), up.data(), n);
  for (int i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(dg[i]) && std::isfinite(du[i])) << i;
  auto loss = [&] {
    Vec o(n);
    geglu_forward(o.data(), gate.data(), up.data(), n);
    return dot(o, rw);
  };
  check_grad("geglu dgate", gate, dg, loss, 1e-3, kTightRtol);
  check_grad("geglu dup", up, du, loss, 1e-3, kTightRtol);
  Vec d1 = rw, d2(n);  // dgate may alias dout
  geglu_backward(d1.data(), d2.data(), d1.data(), gate.data(), up.data(), n);
  EXPECT_EQ(d1, dg);
  EXPECT_EQ(d2, du);
}

TEST(OpsCpu, LmHeadSoftcapForwardBackwardAndLogits) {
  LmHeadCase c(1200);
  for (float& x : c.W) x *= 3.0f;  // logits of several units: the cap bends them
  const float cap = 2.5f;
  for (float scale : {1.0f, 1.0f / 0.7f}) {
    Vec logprob(c.T), lse(c.T);
    lm_head_logprob_forward(logprob.data(), lse.data(), c.h.data(), c.W.data(), c.targets.data(), c.T, c.D, c.V, scale,
                            nullptr, cap);
    std::vector<double> lp_want(c.T, 0.0), lse_want(c.T), logits_want;
    for (int t = 0; t < c.T; ++t) {
      std::vector<double> l(c.V);
      for (int v = 0; v < c.V; ++v) {
        double d = 0;
        for (int e = 0; e < c.D; ++e) d += static_cast<double>(c.h[t * c.D + e]) * c.W[v * c.D + e];
        l[v] = scale * cap * std::tanh(d / cap);
        if (t < 3) logits_want.push_back(l[v]);
      }
      const double m = *std::max_element(l.begin(), l.end());
      double z = 0;
      for (double x : l) z += std::exp(x - m);
      lse_want[t] = m + std::log(z);
      if (c.targets[t] >= 0) lp_want[t] = l[c.targets[t]] - lse_want[t];
    }
    expect_near_vec(logprob, lp_want, 2e-6, "softcapped logprob");
    expect_near_vec(lse, lse_want, 2e-6, "softcapped lse");
    Vec logits(static_cast<size_t>(3) * c.V);
    lm_head_logits(logits.data(), c.h.data(), c.W.data(), 3, c.D, c.V, scale, cap);
    expect_near_vec(logits, logits_want, 2e-6, "softcapped logits");
    double big = 0;
    for (double x : logits_want) big = std::max(big, std::abs(x));
    EXPECT_GT(big, 0.8 * scale * cap);  // the cap matters in this case

    Vec dh(c.h.size()), dW(c.W.size(), 0.0f);
    lm_head_logprob_backward(dh.data(), dW.data(), c.weights.data(), c.h.data(), c.W.data(), c.targets.data(),
                             lse.data(), c.T, c.D, c.V, scale, nullptr, cap);
    auto loss = [&] {
      Vec lp(c.T), l(c.T);
      lm_head_logprob_forward(lp.data(), l.data(), c.h.data(), c.W.data(), c.targets.data(), c.T, c.D, c.V, scale,
                              nullptr, cap);
      return -dot(lp, c.weights);
    };
    check_grad("softcapped lm_head dh", c.h, dh, loss);
    check_grad("softcapped lm_head dW", c.W, dW, loss);
  }
}

// The fused pass (SFT) is the forward then the backward, bit for bit: log-probs, lse, dh and the accumulated dW, at
// 45 rows (a full chunk of 32 and a partial one) and 77 (three chunks, dW accumulated over them), with ignored rows
// and a zero weight, with and without the soft-cap and logit_scale, with dW null and not, and the op's own scratch.
TEST(OpsCpu, LmHeadForwardBackwardIsForwardThenBackwardBitwise) {
  for (const int T : {45, 77}) {
    LmHeadCase c(1250);
    if (T != c.T) {  // the same case grown to T rows
      c.T = T;
      c.h = randn(static_cast<size_t>(T) * c.D, 1251);
      c.weights = randn(static_cast<size_t>(T), 1252);
      std::mt19937 gen(1253);
      c.targets.clear();
      for (int t = 0; t < T; ++t) c.targets.push_back(static_cast<int32_t>(gen() % c.V));
      for (int t : {2, 31, 32, 70, 76}) c.targets[t] = -1;
      c.weights[40] = 0.0f;
    }
    for (float& x : c.W) x *= 3.0f;  // logits of several units: the soft-cap bends them
    for (const float cap : {0.0f, 2.5f})
      for (const float scale : {1.0f, 1.0f / 0.7f})
        for (const bool with_dW : {true, false})
          for (const bool own_scratch : {false, true}) {
            const std::string what = "T " + std::to_string(T) + " cap " + std::to_string(cap) + " scale " +
                                     std::to_string(scale) + (with_dW ? " dW" : " no dW") +
                                     (own_scratch ? " op's scratch" : " caller's scratch");
            Vec scratch(static_cast<size_t>(lm_head_scratch_floats(c.V)));
            float* sc = own_scratch ? nullptr : scratch.data();
            Vec lp1(c.T), lse1(c.T), dh1(c.h.size()), dW1(c.W.size());
            for (size_t i = 0; i < dW1.size(); ++i) dW1[i] = 0.01f * static_cast<float>(i % 7);  // accumulates
            Vec lp2(c.T, 5.0f), lse2(c.T, 5.0f), dh2(c.h.size(), 5.0f), dW2 = dW1;
            lm_head_logprob_forward(lp1.data(), lse1.data(), c.h.data(), c.W.data(), c.targets.data(), c.T, c.D,
                                    c.V, scale, sc, cap);
            lm_head_logprob_backward(dh1.data(), with_dW ? dW1.data() : nullptr, c.weights.data(), c.h.data(),
                                     c.W.data(), c.targets.data(), lse1.data(), c.T, c.D, c.V, scale, sc, cap);
            lm_head_logprob_forward_backward(lp2.data(), lse2.data(), dh2.data(), with_dW ? dW2.data() : nullptr,
                                             c.weights.data(), c.h.data(), c.W.data(), c.targets.data(), c.T, c.D,
                                             c.V, scale, sc, cap);
            EXPECT_EQ(lp1, lp2) << what;
            EXPECT_EQ(lse1, lse2) << what;
            EXPECT_EQ(dh1, dh2) << what;
            EXPECT_EQ(dW1, dW2) << what;
            // Not vacuous: the ignored rows' log-probs are 0, the others not; dh and dW moved.
            EXPECT_EQ(lp2[static_cast<size_t>(T - 1)], 0.0f) << what;
            EXPECT_LT(*std::min_element(lp2.begin(), lp2.end()), -0.1f) << what;
            EXPECT_GT(std::abs(dh2[static_cast<size_t>(c.D) * 3]), 0.0f) << what;
            if (with_dW) {
              EXPECT_NE(dW2[1], 0.01f) << what;
            }
          }
  }
}

TEST(OpsCpu, EmbeddingScaled) {
  const int V = 9, D = 5;
  const std::vector<int32_t> ids = {2, -1, 8, 2};
  const int T = static_cast<int>(ids.size());
  Vec table = randn(static_cast<size_t>(V) * D, 1300);
  const float scale = std::sqrt(48.0f);
  Vec out(static_cast<size_t>(T) * D), plain(out.size());
  embedding_forward(out.data(), ids.data(), table.data(), T, V, D, scale);
  embedding_forward(plain.data(), ids.data(), table.data(), T, V, D);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], plain[i] * scale);
  const Vec rw = randn(out.size(), 1301);
  Vec dtable(table.size(), 0.0f);
  embedding_backward(dtable.data(), rw.data(), ids.data(), T, V, D, scale);
  auto loss = [&] {
    Vec o(out.size());
    embedding_forward(o.data(), ids.data(), table.data(), T, V, D, scale);
    return dot(o, rw);
  };
  check_grad("scaled dtable", table, dtable, loss, 1e-3, kTightRtol);
}


// ---------------------------------------------------------------------------------------------------------------
// the batch-invariant GEMM: its scalar, blocked SSE2 and AVX2 paths against its definition, element by element (8
// lanes over k, each product rounded then added, lanes combined pairwise, the tail one by one, then alpha and beta:
// gemm.cpp); bits, not tolerances. This file is compiled with -ffp-contract=off, so the definition below is not
// fused either.

void gemm_fixed_definition(float* C, const float* A, const float* B, int M, int N, int K, float alpha, float beta) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      const float* a = A + static_cast<size_t>(m) * K;
      const float* b = B + static_cast<size_t>(n) * K;
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int k = 0;
      for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; ++j) l[j] += a[k + j] * b[k + j];
      float s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
      for (; k < K; ++k) s += a[k] * b[k];
      const float v = alpha * s;
      float& c = C[static_cast<size_t>(m) * N + n];
      c = beta == 0.0f ? v : v + beta * c;
    }
}

TEST(OpsCpu, BatchInvariantGemmIsItsFixedOrderBitwiseOnEveryPath) {
  // Shapes of the quickstart's layers and LM head, odd sizes (column and k tails), K above one L1 panel, tiny ones.
  const int shapes[][3] = {{256, 160, 96}, {256, 512, 96}, {256, 96, 256}, {256, 16, 96}, {7, 13, 37},
                           {3, 5, 5},      {64, 151, 901}, {1, 4096, 4},   {33, 17, 8},  {5, 3, 7000}};
  int checked = 0;
  for (const auto& sh : shapes) {
    const int M = sh[0], N = sh[1], K = sh[2];
    const Vec A = randn(static_cast<size_t>(M) * K, 4000 + M), B = randn(static_cast<size_t>(N) * K, 4100 + N);
    const Vec C0 = randn(static_cast<size_t>(M) * N, 4200 + K);
    for (const float beta : {0.0f, 0.75f}) {
      Vec want = C0;
      gemm_fixed_definition(want.data(), A.data(), B.data(), M, N, K, 1.25f, beta);
      for (const FixedIsa isa : {FixedIsa::Scalar, FixedIsa::Sse2, FixedIsa::Avx2, FixedIsa::Best}) {
        Vec got = C0;
        gemm_nt_fixed(got.data(), A.data(), B.data(), M, N, K, 1.25f, beta, isa);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
            << M << "x" << N << "x" << K << " beta " << beta << " path " << static_cast<int>(isa);
        ++checked;
      }
      // gemm_nt in batch-invariant mode is that kernel; and a row alone gives the row's bits in the batch.
      Vec via = C0;
      set_batch_invariant(true);
      gemm_nt(via.data(), A.data(), B.data(), M, N, K, 1.25f, beta);
      Vec row(C0.begin() + static_cast<std::ptrdiff_t>(M - 1) * N, C0.end());
      gemm_nt(row.data(), A.data() + static_cast<size_t>(M - 1) * K, B.data(), 1, N, K, 1.25f, beta);
      set_batch_invariant(false);
      ASSERT_EQ(0, std::memcmp(via.data(), want.data(), via.size() * sizeof(float)));
      ASSERT_EQ(0, std::memcmp(row.data(), want.data() + static_cast<size_t>(M - 1) * N, row.size() * sizeof(float)));
    }
  }
  EXPECT_EQ(checked, 80);
  if (!gemm_nt_fixed_has_avx2()) std::printf("  this CPU has no AVX2: the Avx2 path ran as SSE2\n");
}

TEST(OpsCpu, BatchInvariantGemmCheckCatchesAFusedProduct) {
  // The bitwise check above can fail: the same products summed with one rounding fewer (a fused multiply-add at
  // the last k) differ in the last bits for some element of a 64 x 64 x 96 product.
  const int M = 64, N = 64, K = 96;
  const Vec A = randn(static_cast<size_t>(M) * K, 4300), B = randn(static_cast<size_t>(N) * K, 4301);
  Vec want(static_cast<size_t>(M) * N, 0.0f), fused = want;
  gemm_nt_fixed(want.data(), A.data(), B.data(), M, N, K, 1.0f, 0.0f, FixedIsa::Best);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      const float* a = A.data() + static_cast<size_t>(m) * K;
      const float* b = B.data() + static_cast<size_t>(n) * K;
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int k = 0; k < K; k += 8)
        for (int j = 0; j < 8; ++j) l[j] = k + 8 == K ? std::fma(a[k + j], b[k + j], l[j]) : l[j] + a[k + j] * b[k + j];
      fused[static_cast<size_t>(m) * N + n] = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
    }
  EXPECT_NE(0, std::memcmp(fused.data(), want.data(), want.size() * sizeof(float)));
}

}  // namespace
}  // namespace mgrl::kernels::cpu
