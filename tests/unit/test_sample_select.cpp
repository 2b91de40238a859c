// test_sample_select.cpp: the CUDA sampler's radix selection of the top-k and top-p thresholds
// (kernels/cuda/sample_select.h) checked on the CPU against the bit-by-bit search it replaced (32 passes, one per
// bit of the key), over rows with ties, infinities, signed zeros, sharp and flat distributions, and top-k before
// top-p; and the thresholds' kept sets against the canonical algorithm's definition (kernels/cpu/sampling.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/sample_select.h"

namespace mgrl::kernels::cuda::sample_select {
namespace {

using Keys = std::vector<std::uint32_t>;

Keys keys_of(const std::vector<float>& z) {
  Keys k(z.size());
  for (std::size_t i = 0; i < z.size(); ++i) k[i] = order_key(z[i]);
  return k;
}

// The search sampling.cu ran before: the largest K with count(key >= K) >= k, bit by bit from the top.
std::uint32_t topk_bitwise(const Keys& keys, int k) {
  std::uint32_t kk = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const std::uint32_t cand = kk | (1u << bit);
    int cnt = 0;
    for (std::uint32_t key : keys) cnt += key >= cand ? 1 : 0;
    if (cnt >= k) kk = cand;
  }
  return kk;
}

// The same from 4 radix passes, as the kernel does (its histograms are integer sums: order does not matter).
std::uint32_t topk_radix(const Keys& keys, int k) {
  std::uint32_t prefix = 0;
  int rank = k;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    int hist[kRadixBins] = {};
    for (std::uint32_t key : keys) {
      const int bin = radix_bin(key, prefix, pass, 0u);
      if (bin >= 0) ++hist[bin];
    }
    prefix = radix_extend(prefix, pass, radix_pick_count(hist, &rank));
  }
  return prefix;
}

// The top-p search sampling.cu ran before: the largest K with sum over key >= max(K, kmin) of p >= top_p.
std::uint32_t topp_bitwise(const Keys& keys, const std::vector<double>& p, std::uint32_t kmin, double top_p) {
  std::uint32_t kp = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const std::uint32_t cand = kp | (1u << bit);
    const std::uint32_t lo = std::max(cand, kmin);
    double mass = 0.0;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] >= lo) mass += p[i];
    if (mass >= top_p) kp = cand;
  }
  return kp;
}

std::uint32_t topp_radix(const Keys& keys, const std::vector<double>& p, std::uint32_t kmin, double top_p) {
  std::uint32_t prefix = 0;
  double above = 0.0;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    double hist[kRadixBins] = {};
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const int bin = radix_bin(keys[i], prefix, pass, kmin);
      if (bin >= 0) hist[bin] += p[i];
    }
    prefix = radix_extend(prefix, pass, radix_pick_mass(hist, &above, top_p));
  }
  return prefix;
}

// Softmax at temperature 1 over the tokens with key >= kmin (0 elsewhere), as the kernel's p = w / total.
std::vector<double> probs(const std::vector<float>& z, const Keys& keys, std::uint32_t kmin) {
  double m = -INFINITY;
  for (std::size_t i = 0; i < z.size(); ++i)
    if (keys[i] >= kmin) m = std::max(m, static_cast<double>(z[i]));
  std::vector<double> p(z.size(), 0.0);
  double total = 0.0;
  for (std::size_t i = 0; i < z.size(); ++i)
    if (keys[i] >= kmin) total += p[i] = std::exp(static_cast<double>(z[i]) - m);
  for (double& v : p) v /= total;
  return p;
}

// Rows of logits of several kinds, with well separated values unless ties are the point.
std::vector<std::vector<float>> rows(int V, std::mt19937& gen) {
  std::vector<std::vector<float>> out;
  std::vector<int> perm(static_cast<std::size_t>(V));
  for (const float range : {0.5f, 4.0f, 20.0f, 60.0f}) {  // flat to sharp: a permutation of spaced values
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen);
    std::vector<float> z(static_cast<std::size_t>(V));
    for (int i = 0; i < V; ++i)
      z[static_cast<std::size_t>(i)] = range * (static_cast<float>(perm[static_cast<std::size_t>(i)]) / V - 0.5f);
    out.push_back(z);
  }
  {  // gaussian logits (an LM-like spread) with a few large ones
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> z(static_cast<std::size_t>(V));
    for (float& v : z) v = nd(gen);
    for (int j = 0; j < std::min(V, 5); ++j) z[static_cast<std::size_t>(gen() % V)] = 15.0f + static_cast<float>(j);
    out.push_back(z);
  }
  {  // ties: few distinct values, signed zeros, infinities
    std::vector<float> z(static_cast<std::size_t>(V));
    const float vals[] = {1.0f, 1.0f, -0.0f, 0.0f, -2.5f, 3.0f, -INFINITY, 3.0f};
    for (int i = 0; i < V; ++i) z[static_cast<std::size_t>(i)] = vals[gen() % 8];
    out.push_back(z);
  }
  {  // all equal
    out.emplace_back(static_cast<std::size_t>(V), 0.25f);
  }
  return out;
}

TEST(SampleSelect, TopKEqualsBitwiseSearch) {
  std::mt19937 gen(7);
  int checked = 0;
  for (const int V : {1, 2, 7, 300, 1000, 50001}) {
    for (const auto& z : rows(V, gen)) {
      const Keys keys = keys_of(z);
      for (const int k : {1, 2, 5, 40, V / 2, V - 1, V}) {
        if (k < 1 || k > V) continue;
        EXPECT_EQ(topk_radix(keys, k), topk_bitwise(keys, k)) << "V " << V << " k " << k;
        // and it is the k-th largest key
        Keys sorted = keys;
        std::sort(sorted.begin(), sorted.end(), std::greater<std::uint32_t>());
        EXPECT_EQ(topk_radix(keys, k), sorted[static_cast<std::size_t>(k - 1)]);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 200);
}

TEST(SampleSelect, TopPEqualsBitwiseSearchAndKeepsTheCanonicalSet) {
  std::mt19937 gen(11);
  int checked = 0, partial = 0;
  for (const int V : {1, 2, 7, 300, 1000, 50001}) {
    for (const auto& z : rows(V, gen)) {
      const Keys keys = keys_of(z);
      for (const int k : {0, 1, 5, 40}) {
        const std::uint32_t kmin = (k > 0 && k < V) ? topk_radix(keys, k) : 0u;
        const std::vector<double> p = probs(z, keys, kmin);
        for (const double top_p : {0.0, 0.1, 0.5, 0.9, 0.95, 0.999}) {
          const std::uint32_t r = topp_radix(keys, p, kmin, top_p);
          const std::string tag = "V " + std::to_string(V) + " k " + std::to_string(k) + " top_p " +
                                  std::to_string(top_p);
          EXPECT_EQ(r, topp_bitwise(keys, p, kmin, top_p)) << tag;
          // The canonical set (sampling.h step 4): the most likely kept tokens, in order, until their mass reaches
          // top_p; tau = the last one's probability; kept = p >= tau. The radix threshold (capped at the max's key,
          // as the kernel does) keeps exactly the tokens with key >= max(r, kmin).
          std::vector<double> sorted;
          for (std::size_t i = 0; i < p.size(); ++i)
            if (keys[i] >= kmin) sorted.push_back(p[i]);
          std::sort(sorted.begin(), sorted.end(), std::greater<double>());
          double mass = 0.0, tau = sorted.back();
          for (double v : sorted) {
            mass += v;
            if (mass >= top_p) {
              tau = v;
              break;
            }
          }
          const std::uint32_t kmax = *std::max_element(keys.begin(), keys.end());
          const std::uint32_t thr = std::max(std::min(r, kmax), kmin);
          int kept = 0;
          for (std::size_t i = 0; i < p.size(); ++i) {
            const bool canonical = keys[i] >= kmin && p[i] >= tau;
            EXPECT_EQ(keys[i] >= thr, canonical) << tag << " token " << i;
            kept += canonical ? 1 : 0;
          }
          partial += kept < V ? 1 : 0;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 800);
  EXPECT_GT(partial, 400) << "most settings must cut the row (else the test shows little)";
}

// The pieces on their own: a bin outside the prefix or below kmin takes no part; the picks walk from the top.
TEST(SampleSelect, Pieces) {
  EXPECT_EQ(radix_bin(0xAB12CD34u, 0u, 0, 0u), 0xAB);
  EXPECT_EQ(radix_bin(0xAB12CD34u, 0xAB000000u, 1, 0u), 0x12);
  EXPECT_EQ(radix_bin(0xAB12CD34u, 0xAC000000u, 1, 0u), -1);
  EXPECT_EQ(radix_bin(0xAB12CD34u, 0xAB12CD00u, 3, 0u), 0x34);
  EXPECT_EQ(radix_bin(0xAB12CD34u, 0xAB12CE00u, 3, 0u), -1);
  EXPECT_EQ(radix_bin(0xAB12CD34u, 0u, 0, 0xAB12CD35u), -1);
  int H[kRadixBins] = {};
  H[200] = 3;
  H[100] = 5;
  int rank = 4;
  EXPECT_EQ(radix_pick_count(H, &rank), 100);
  EXPECT_EQ(rank, 1);
  double M[kRadixBins] = {};
  M[250] = 0.25;
  M[10] = 0.5;
  M[3] = 0.25;
  double above = 0.0;
  EXPECT_EQ(radix_pick_mass(M, &above, 0.7), 10);
  EXPECT_DOUBLE_EQ(above, 0.25);
  above = 0.0;
  EXPECT_EQ(radix_pick_mass(M, &above, 2.0), 0) << "nothing reaches top_p: digit 0";
  EXPECT_EQ(radix_extend(0xAB000000u, 1, 0x12), 0xAB120000u);
  EXPECT_LT(order_key(-1.0f), order_key(-0.5f));
  EXPECT_EQ(order_key(-0.0f), order_key(0.0f));
  EXPECT_LT(order_key(-INFINITY), order_key(-3e38f));
  EXPECT_LT(order_key(3e38f), order_key(INFINITY));
}

}  // namespace
}  // namespace mgrl::kernels::cuda::sample_select
