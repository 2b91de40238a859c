// lm_head.cpp: chunked lm_head + log-softmax (per-token logprob and logsumexp) and its backward.
#include "kernels/cpu/lm_head.h"

#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"

namespace mgrl::kernels::cpu {

namespace {

void check_target(int32_t target, int V) {
  MGRL_CHECK(target < V, "target id " + std::to_string(target) + " out of range (vocab " + std::to_string(V) + ")");
}

// logits[n, V] = logit_scale * h[n, D] @ W[V, D]^T, or logit_scale * softcap * tanh(h @ W^T / softcap)
void chunk_logits(float* logits, const float* h, const float* W, int n, int D, int V, float logit_scale,
                  float softcap) {
  if (softcap <= 0.0f) {
    gemm_nt(logits, h, W, n, V, D, logit_scale, 0.0f);
    return;
  }
  gemm_nt(logits, h, W, n, V, D, 1.0f, 0.0f);
  const int64_t count = static_cast<int64_t>(n) * V;
  const float outer = logit_scale * softcap, inner = 1.0f / softcap;
  for (int64_t i = 0; i < count; ++i) logits[i] = outer * std::tanh(logits[i] * inner);
}

// The chunk's rows t0 .. t0 + n - 1 from their logits l [n, V]: lse and logprob; with entropy (and top1, mean, lsq)
// non-null, also the entropy of each row's distribution, lse - sum_v p_v l_v, 1 where the target is its first most
// likely token, the mean of its logits and log sum_v p_v^2 (all four 0 for ignored rows).
void chunk_lse(float* logprob, float* lse, float* entropy, float* top1, float* mean, float* lsq, const float* logits,
               const int32_t* targets, int t0, int n, int V) {
  for (int r = 0; r < n; ++r) {
    const int t = t0 + r;
    const float* l = logits + static_cast<int64_t>(r) * V;
    float m = -INFINITY;
    int argmax = 0;
    for (int v = 0; v < V; ++v)
      if (l[v] > m) m = l[v], argmax = v;
    // pz: sum of exp(l - m) * l; lsum: of l; sq: of exp(2 (l - m)) (stats asked for)
    double sum = 0.0, pz = 0.0, lsum = 0.0, sq = 0.0;
    if (entropy) {
      for (int v = 0; v < V; ++v) {
        const double e = std::exp(static_cast<double>(l[v] - m));
        sum += e;
        pz += e * l[v];
        lsum += l[v];
        sq += e * e;
      }
    } else {
      for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(l[v] - m));
    }
    lse[t] = m + static_cast<float>(std::log(sum));
    const int32_t target = targets[t];
    check_target(target, V);
    logprob[t] = target < 0 ? 0.0f : l[target] - lse[t];
    if (entropy) {
      entropy[t] = target < 0 ? 0.0f : lse[t] - static_cast<float>(pz / sum);
      top1[t] = target >= 0 && target == argmax ? 1.0f : 0.0f;
      mean[t] = target < 0 ? 0.0f : static_cast<float>(lsum / V);
      lsq[t] = target < 0 ? 0.0f : static_cast<float>(std::log(sq) - 2.0 * std::log(sum));
    }
  }
}

// The chunk's backward from its logits (overwritten with logit_scale * dlogits): dh rows written, dW accumulated.
void chunk_backward(float* dh, float* dW, float* scratch, const float* weights, const float* hc, const float* W,
                    const int32_t* targets, const float* lse, int t0, int n, int D, int V, float logit_scale,
                    float softcap, const float* ent_w, const float* ent) {
  for (int r = 0; r < n; ++r) {
    const int t = t0 + r;
    float* l = scratch + static_cast<int64_t>(r) * V;
    const int32_t target = targets[t];
    check_target(target, V);
    const float w = target < 0 ? 0.0f : weights[t];
    const float u = target < 0 || !ent_w ? 0.0f : ent_w[t];
    if (u != 0.0f) {  // with the entropy term: g = w (p - onehot) + u p (log p + H), log p = l - lse
      const float inv = softcap > 0.0f ? 1.0f / (logit_scale * softcap) : 0.0f;
      for (int v = 0; v < V; ++v) {
        const float lp = l[v] - lse[t], p = std::exp(lp);
        float g = w * (p - (v == target ? 1.0f : 0.0f)) + u * p * (lp + ent[t]);
        if (softcap > 0.0f) {
          const float th = l[v] * inv;
          g *= 1.0f - th * th;
        }
        l[v] = logit_scale * g;
      }
      continue;
    }
    if (w == 0.0f) {
      std::fill(l, l + V, 0.0f);
      continue;
    }
    const float c = w * logit_scale;
    if (softcap > 0.0f) {
      const float inv = 1.0f / (logit_scale * softcap);  // logit / (logit_scale * softcap) = tanh
      for (int v = 0; v < V; ++v) {
        const float th = l[v] * inv;
        l[v] = c * (std::exp(l[v] - lse[t]) - (v == target ? 1.0f : 0.0f)) * (1.0f - th * th);
      }
      continue;
    }
    for (int v = 0; v < V; ++v) l[v] = c * std::exp(l[v] - lse[t]);
    l[target] -= c;
  }
  // dh[n, D] = dl[n, V] @ W[V, D]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, V, 1.0f, scratch, V, W, D, 0.0f,
              dh + static_cast<int64_t>(t0) * D, D);
  if (dW) {
    // dW[V, D] += dl[n, V]^T @ h[n, D]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, D, n, 1.0f, scratch, V, hc, D, 1.0f, dW, D);
  }
}

}  // namespace

void lm_head_logits(float* logits, const float* h, const float* W, int T, int D, int V, float logit_scale,
                    float softcap) {
  if (T <= 0) return;
  chunk_logits(logits, h, W, T, D, V, logit_scale, softcap);
}

namespace {

// The chunk loop of the three ops below: each chunk's logits once, then its forward part (lse, logprob) when
// logprob is non-null and its backward part (dlogits, dh, dW) when dh is non-null.
void head_pass(float* logprob, float* lse, float* dh, float* dW, const float* weights, const float* h, const float* W,
               const int32_t* targets, const float* lse_in, int T, int D, int V, float logit_scale, float* scratch,
               float softcap, float* stats, const float* ent_w = nullptr, const float* ent = nullptr) {
  std::vector<float> own;
  if (!scratch) {
    own.resize(static_cast<size_t>(lm_head_scratch_floats(V)));
    scratch = own.data();
  }
  for (int t0 = 0; t0 < T; t0 += kLmHeadChunkRows) {
    const int n = std::min(kLmHeadChunkRows, T - t0);
    const float* hc = h + static_cast<int64_t>(t0) * D;
    chunk_logits(scratch, hc, W, n, D, V, logit_scale, softcap);
    if (logprob)
      chunk_lse(logprob, lse, stats, stats ? stats + T : nullptr, stats ? stats + 2 * static_cast<int64_t>(T) : nullptr,
                stats ? stats + 3 * static_cast<int64_t>(T) : nullptr, scratch, targets, t0, n, V);
    if (dh) chunk_backward(dh, dW, scratch, weights, hc, W, targets, lse_in, t0, n, D, V, logit_scale, softcap, ent_w, ent);
  }
}

}  // namespace

void lm_head_logprob_forward(float* logprob, float* lse, const float* h, const float* W, const int32_t* targets, int T,
                             int D, int V, float logit_scale, float* scratch, float softcap, float* stats) {
  head_pass(logprob, lse, nullptr, nullptr, nullptr, h, W, targets, nullptr, T, D, V, logit_scale, scratch, softcap,
            stats);
}

void lm_head_logprob_backward(float* dh, float* dW, const float* weights, const float* h, const float* W,
                              const int32_t* targets, const float* lse, int T, int D, int V, float logit_scale,
                              float* scratch, float softcap, const float* entropy_weights, const float* entropy) {
  head_pass(nullptr, nullptr, dh, dW, weights, h, W, targets, lse, T, D, V, logit_scale, scratch, softcap, nullptr,
            entropy_weights, entropy);
}

void lm_head_logprob_forward_backward(float* logprob, float* lse, float* dh, float* dW, const float* weights,
                                      const float* h, const float* W, const int32_t* targets, int T, int D, int V,
                                      float logit_scale, float* scratch, float softcap, float* stats) {
  // The chunk's logits once: its backward part reuses them (lse from its forward part).
  head_pass(logprob, lse, dh, dW, weights, h, W, targets, lse, T, D, V, logit_scale, scratch, softcap, stats);
}

void lm_head_divergence(float* div, float* entropy, float* dh, float* dW, const float* weights, const float* h,
                        const float* W, int T, int D, int V, float logit_scale, float softcap, const float* th,
                        const float* tW, int Dt, float t_logit_scale, float t_softcap, float beta, float* scratch) {
  MGRL_CHECK(beta >= 0.0f && beta <= 1.0f, "lm_head_divergence: beta " + std::to_string(beta) + " outside [0, 1]");
  MGRL_CHECK(!dh || weights, "lm_head_divergence: the backward needs the rows' weights");
  std::vector<float> own;
  if (!scratch) {
    own.resize(static_cast<size_t>(lm_head_divergence_scratch_floats(V)));
    scratch = own.data();
  }
  float* zs = scratch;                              // the chunk's student logits, then its dlogits
  float* zt = scratch + lm_head_scratch_floats(V);  // the chunk's teacher logits
  const int mode = beta == 0.0f ? 0 : beta == 1.0f ? 1 : 2;
  const double lb = mode == 2 ? std::log(static_cast<double>(beta)) : 0.0,
               l1b = mode == 2 ? std::log(1.0 - static_cast<double>(beta)) : 0.0;
  std::vector<double> lps(static_cast<size_t>(V)), lpt(static_cast<size_t>(V)), lm(mode == 2 ? V : 0);
  for (int t0 = 0; t0 < T; t0 += kLmHeadChunkRows) {
    const int n = std::min(kLmHeadChunkRows, T - t0);
    const float* hc = h + static_cast<int64_t>(t0) * D;
    chunk_logits(zs, hc, W, n, D, V, logit_scale, softcap);
    chunk_logits(zt, th + static_cast<int64_t>(t0) * Dt, tW, n, Dt, V, t_logit_scale, t_softcap);
    for (int r = 0; r < n; ++r) {
      const int t = t0 + r;
      float* s = zs + static_cast<int64_t>(r) * V;
      const float* q = zt + static_cast<int64_t>(r) * V;
      // log-softmax of both rows (double sums)
      double ms = -INFINITY, mt = -INFINITY;
      for (int v = 0; v < V; ++v) ms = std::max(ms, static_cast<double>(s[v])), mt = std::max(mt, static_cast<double>(q[v]));
      double ss = 0.0, st = 0.0;
      for (int v = 0; v < V; ++v) ss += std::exp(s[v] - ms), st += std::exp(q[v] - mt);
      const double lse_s = ms + std::log(ss), lse_t = mt + std::log(st);
      double ent = lse_s, d = 0.0, aux = 0.0;  // aux: KL(p_s || p_t), or KL(p_s || m)
      for (int v = 0; v < V; ++v) {
        lps[v] = s[v] - lse_s;
        lpt[v] = q[v] - lse_t;
        const double ps = std::exp(lps[v]), pt = std::exp(lpt[v]);
        ent -= ps * s[v];
        if (mode == 0) {
          d += pt * (lpt[v] - lps[v]);
        } else if (mode == 1) {
          aux += ps * (lps[v] - lpt[v]);
        } else {
          const double a = lps[v] + l1b, b = lpt[v] + lb, top = std::max(a, b);
          lm[v] = top + std::log(std::exp(a - top) + std::exp(b - top));
          aux += ps * (lps[v] - lm[v]);
          d += beta * pt * (lpt[v] - lm[v]);
        }
      }
      d = mode == 0 ? d : mode == 1 ? aux : d + (1.0 - beta) * aux;
      if (div) div[t] = static_cast<float>(d);
      if (entropy) entropy[t] = static_cast<float>(ent);
      if (!dh) continue;
      const float w = weights[t];
      const float inv = softcap > 0.0f ? 1.0f / (logit_scale * softcap) : 0.0f;
      for (int v = 0; v < V; ++v) {
        if (w == 0.0f) {
          s[v] = 0.0f;
          continue;
        }
        const double ps = std::exp(lps[v]);
        const double g = mode == 0   ? ps - std::exp(lpt[v])
                         : mode == 1 ? ps * (lps[v] - lpt[v] - aux)
                                     : (1.0 - beta) * ps * (lps[v] - lm[v] - aux);
        float gv = static_cast<float>(g) * w * logit_scale;
        if (softcap > 0.0f) {  // the logit is logit_scale * softcap * tanh(raw / softcap)
          const float tnh = s[v] * inv;
          gv *= 1.0f - tnh * tnh;
        }
        s[v] = gv;
      }
    }
    if (!dh) continue;
    // dh[n, D] = dl[n, V] @ W[V, D]; dW[V, D] += dl^T @ h
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, V, 1.0f, zs, V, W, D, 0.0f,
                dh + static_cast<int64_t>(t0) * D, D);
    if (dW) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, D, n, 1.0f, zs, V, hc, D, 1.0f, dW, D);
  }
}

}  // namespace mgrl::kernels::cpu
