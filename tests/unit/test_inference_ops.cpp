// test_inference_ops.cpp: the inference ops of the CPU reference: KV cache store + cached attention against the
// training attention (all rows at once, interleaved slots, GQA, prefill + decode), row gathering, and sampling
// (greedy, the filters against an independent sort-based implementation, chi-square of drawn frequencies,
// recorded log-probs), and the decode-step bookkeeping of generate.sync_interval (decode_advance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_cache.h"
#include "kernels/cpu/sampling.h"
#include "kernels/ops.h"

namespace mgrl::kernels::cpu {
namespace {

using Vec = std::vector<float>;
using Ids = std::vector<int32_t>;

Vec randu(std::size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// KV cache

// A right-padded batch [B, L] of q/k/v and its training attention output (kernels/cpu/attention.h).
struct Batch {
  int B, L, nh, nkv, hd;
  Ids lengths;
  Vec q, k, v, out;

  Batch(int B_, int L_, int nh_, int nkv_, int hd_, Ids lengths_, uint32_t seed)
      : B(B_), L(L_), nh(nh_), nkv(nkv_), hd(hd_), lengths(std::move(lengths_)) {
    q = randu(static_cast<std::size_t>(B) * L * nh * hd, seed, -2.0f, 2.0f);
    k = randu(static_cast<std::size_t>(B) * L * nkv * hd, seed + 1, -2.0f, 2.0f);
    v = randu(static_cast<std::size_t>(B) * L * nkv * hd, seed + 2);
    out.assign(q.size(), 0.0f);
    // Every row as a full sequence of L: by causality, rows t < lengths[b] are what the shorter sequence gives.
    Vec lse(static_cast<std::size_t>(B) * nh * L);
    Ids cu;
    for (int b = 0; b <= B; ++b) cu.push_back(b * L);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), cu.data(), B, B * L, L, nh, nkv, hd);
  }
  std::size_t qrow() const { return static_cast<std::size_t>(nh) * hd; }
  std::size_t kvrow() const { return static_cast<std::size_t>(nkv) * hd; }
  std::size_t row(int b, int t) const { return static_cast<std::size_t>(b) * L + t; }
};

// Packed rows: (b, t) pairs, and the slot each sequence b lives in.
struct Rows {
  std::vector<std::pair<int, int>> bt;
  Ids slot, pos;
  Vec q, k, v;
};

Rows pack(const Batch& x, const std::vector<std::pair<int, int>>& bt, const Ids& slot_of) {
  Rows r;
  r.bt = bt;
  for (const auto& [b, t] : bt) {
    r.slot.push_back(slot_of[static_cast<std::size_t>(b)]);
    r.pos.push_back(t);
    const std::size_t i = x.row(b, t);
    r.q.insert(r.q.end(), x.q.begin() + static_cast<std::ptrdiff_t>(i * x.qrow()),
               x.q.begin() + static_cast<std::ptrdiff_t>((i + 1) * x.qrow()));
    r.k.insert(r.k.end(), x.k.begin() + static_cast<std::ptrdiff_t>(i * x.kvrow()),
               x.k.begin() + static_cast<std::ptrdiff_t>((i + 1) * x.kvrow()));
    r.v.insert(r.v.end(), x.v.begin() + static_cast<std::ptrdiff_t>(i * x.kvrow()),
               x.v.begin() + static_cast<std::ptrdiff_t>((i + 1) * x.kvrow()));
  }
  return r;
}

// Max |cached - training| over the packed rows' outputs.
double max_err(const Batch& x, const Rows& r, const Vec& out) {
  double worst = 0.0;
  for (std::size_t j = 0; j < r.bt.size(); ++j) {
    const std::size_t i = x.row(r.bt[j].first, r.bt[j].second);
    for (std::size_t d = 0; d < x.qrow(); ++d)
      worst = std::max(worst, std::abs(static_cast<double>(out[j * x.qrow() + d]) - x.out[i * x.qrow() + d]));
  }
  return worst;
}

struct AttnCase {
  int B, L, nh, nkv, hd;
  Ids lengths;
};

// A block table for `slots` sequences of up to max_len positions: block_size = max_len with table[s] = s (one
// contiguous block per slot), or smaller blocks scattered over a pool with spare blocks, in a shuffled order.
struct Paging {
  Ids table;
  KvPages pages;
  Paging(int slots, int max_len, int block_size, uint32_t seed) {
    const int per_slot = (max_len + block_size - 1) / block_size;
    const int n_blocks = slots * per_slot + (block_size == max_len ? 0 : 5);
    Ids pool(static_cast<std::size_t>(n_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    if (block_size != max_len) {
      std::mt19937 gen(seed);
      std::shuffle(pool.begin(), pool.end(), gen);
    }
    table.assign(pool.begin(), pool.begin() + slots * per_slot);
    pages = {table.data(), slots, per_slot, block_size, n_blocks};
  }
  std::size_t pool_rows() const { return static_cast<std::size_t>(pages.n_blocks) * pages.block_size; }
};
const int kBlockSizes[] = {0, 1, 4, 5};  // 0: one block of max_len per slot
const std::vector<AttnCase> kAttnCases = {
    {3, 17, 4, 4, 16, {17, 9, 1}},   // MHA
    {3, 19, 6, 2, 24, {19, 11, 5}},  // GQA, groups of 3
    {2, 13, 5, 1, 8, {13, 7}},       // MQA
};

TEST(KvCache, StoreAllRowsThenAttendEqualsTrainingAttention) {
  for (const AttnCase& cs : kAttnCases)
    for (const int bs : kBlockSizes) {
      SCOPED_TRACE("h" + std::to_string(cs.nh) + "/" + std::to_string(cs.nkv) + " block " + std::to_string(bs));
      const Batch x(cs.B, cs.L, cs.nh, cs.nkv, cs.hd, cs.lengths, 10);
      // Sequence b lives in slot slot_of[b] of a cache with two unused slots and room beyond L.
      const int slots = cs.B + 2, max_len = cs.L + 3;
      const Paging pg(slots, max_len, bs == 0 ? max_len : bs, 40);
      Ids slot_of;
      for (int b = 0; b < cs.B; ++b) slot_of.push_back(slots - 1 - 2 * b);  // B <= 3: 4, 2, 0 or 3, 1
      // Every valid (b, t) in a shuffled order: rows of several slots interleaved, positions out of order.
      std::vector<std::pair<int, int>> bt;
      for (int b = 0; b < cs.B; ++b)
        for (int t = 0; t < cs.lengths[static_cast<std::size_t>(b)]; ++t) bt.emplace_back(b, t);
      std::mt19937 gen(3);
      std::shuffle(bt.begin(), bt.end(), gen);
      const Rows r = pack(x, bt, slot_of);
      const int T = static_cast<int>(bt.size());

      const std::size_t cache_n = pg.pool_rows() * x.kvrow();
      Vec ck(cache_n, 7.0f), cv(cache_n, 7.0f);
      kv_store(ck.data(), cv.data(), r.k.data(), r.v.data(), r.slot.data(), r.pos.data(), T, pg.pages, cs.nkv, cs.hd);
      // Exactly the stored entries changed, to the stored rows.
      std::vector<char> written(pg.pool_rows(), 0);
      for (int j = 0; j < T; ++j) {
        const std::size_t at = kv_row(pg.pages, r.slot[static_cast<std::size_t>(j)], r.pos[static_cast<std::size_t>(j)]);
        ASSERT_EQ(written[at], 0) << "two positions in one pool row";
        written[at] = 1;
        for (std::size_t d = 0; d < x.kvrow(); ++d) {
          ASSERT_EQ(ck[at * x.kvrow() + d], r.k[static_cast<std::size_t>(j) * x.kvrow() + d]);
          ASSERT_EQ(cv[at * x.kvrow() + d], r.v[static_cast<std::size_t>(j) * x.kvrow() + d]);
        }
      }
      for (std::size_t at = 0; at < written.size(); ++at) {
        if (written[at]) continue;
        for (std::size_t d = 0; d < x.kvrow(); ++d) {
          ASSERT_EQ(ck[at * x.kvrow() + d], 7.0f) << at;
          ASSERT_EQ(cv[at * x.kvrow() + d], 7.0f) << at;
        }
      }

      Vec out(r.q.size(), -3.0f);
      attention_cached(out.data(), r.q.data(), ck.data(), cv.data(), r.slot.data(), r.pos.data(), T, pg.pages, cs.nh,
                       cs.nkv, cs.hd);
      EXPECT_LE(max_err(x, r, out), 1e-5);

      // Decode-style: one row per slot at its last position equals the last row of the full computation.
      std::vector<std::pair<int, int>> last;
      for (int b = cs.B - 1; b >= 0; --b) last.emplace_back(b, cs.lengths[static_cast<std::size_t>(b)] - 1);
      const Rows d = pack(x, last, slot_of);
      Vec dout(d.q.size(), -3.0f);
      attention_cached(dout.data(), d.q.data(), ck.data(), cv.data(), d.slot.data(), d.pos.data(), cs.B, pg.pages,
                       cs.nh, cs.nkv, cs.hd);
      EXPECT_LE(max_err(x, d, dout), 1e-5);
    }
}

TEST(KvCache, PrefillThenDecodeStepsEqualTrainingAttention) {
  for (const AttnCase& cs : kAttnCases)
    for (const int bs : kBlockSizes) {
      SCOPED_TRACE("h" + std::to_string(cs.nh) + "/" + std::to_string(cs.nkv) + " block " + std::to_string(bs));
      const Batch x(cs.B, cs.L, cs.nh, cs.nkv, cs.hd, cs.lengths, 20);
      const int max_len = cs.L;
      const Paging pg(cs.B, max_len, bs == 0 ? max_len : bs, 41);
      Ids slot_of(static_cast<std::size_t>(cs.B));
      std::iota(slot_of.begin(), slot_of.end(), 0);
      std::reverse(slot_of.begin(), slot_of.end());
      const std::size_t cache_n = pg.pool_rows() * x.kvrow();
      Vec ck(cache_n, 0.0f), cv(cache_n, 0.0f);

      // Prefill: sequence b's first prefill[b] tokens (one sequence has none), rows of the sequences interleaved.
      Ids prefill(static_cast<std::size_t>(cs.B));
      for (int b = 0; b < cs.B; ++b)
        prefill[static_cast<std::size_t>(b)] = b == 1 ? 0 : cs.lengths[static_cast<std::size_t>(b)] / 2 + 1;
      std::vector<std::pair<int, int>> bt;
      for (int t = 0; t < cs.L; ++t)
        for (int b = 0; b < cs.B; ++b)
          if (t < prefill[static_cast<std::size_t>(b)]) bt.emplace_back(b, t);
      const Rows r = pack(x, bt, slot_of);
      const int T = static_cast<int>(bt.size());
      kv_store(ck.data(), cv.data(), r.k.data(), r.v.data(), r.slot.data(), r.pos.data(), T, pg.pages, cs.nkv, cs.hd);
      Vec out(r.q.size(), -3.0f);
      attention_cached(out.data(), r.q.data(), ck.data(), cv.data(), r.slot.data(), r.pos.data(), T, pg.pages, cs.nh,
                       cs.nkv, cs.hd);
      EXPECT_LE(max_err(x, r, out), 1e-5) << "prefill";

      // Decode: one row per unfinished sequence per step, stored first, then attended.
      for (int step = 0;; ++step) {
        std::vector<std::pair<int, int>> now;
        for (int b = 0; b < cs.B; ++b) {
          const int t = prefill[static_cast<std::size_t>(b)] + step;
          if (t < cs.lengths[static_cast<std::size_t>(b)]) now.emplace_back(b, t);
        }
        if (now.empty()) break;
        const Rows d = pack(x, now, slot_of);
        const int n = static_cast<int>(now.size());
        kv_store(ck.data(), cv.data(), d.k.data(), d.v.data(), d.slot.data(), d.pos.data(), n, pg.pages, cs.nkv,
                 cs.hd);
        Vec dout(d.q.size(), -3.0f);
        attention_cached(dout.data(), d.q.data(), ck.data(), cv.data(), d.slot.data(), d.pos.data(), n, pg.pages,
                         cs.nh, cs.nkv, cs.hd);
        EXPECT_LE(max_err(x, d, dout), 1e-5) << "decode step " << step;
      }
    }
}

// Two sequences sharing the blocks of a common prefix attend exactly as if each had its own copy.
TEST(KvCache, SharedPrefixBlocksEqualCopies) {
  const int nh = 4, nkv = 2, hd = 8, bs = 4, prefix = 9, L = 14;
  const std::size_t w = static_cast<std::size_t>(nkv) * hd;
  const Vec k = randu(static_cast<std::size_t>(2 * L) * w, 50), v = randu(k.size(), 51);
  // Sequence 0 and 1 share positions 0..prefix-1 (the keys of sequence 0); positions >= prefix differ.
  // Shared: slot 1 uses slot 0's first two blocks (positions 0..7), its own block 5 for 8..11 (position 8 copied).
  const Ids shared_table = {0, 1, 2, 3, 0, 1, 5, 6};
  const Ids own_table = {0, 1, 2, 3, 4, 7, 5, 6};  // every block its own
  const KvPages shared{shared_table.data(), 2, 4, bs, 8}, own{own_table.data(), 2, 4, bs, 8};
  auto run = [&](const KvPages& pg) {
    Vec ck(8 * bs * w, 0.0f), cv(ck.size(), 0.0f);
    Ids slot, pos;
    Vec kk, vv;
    for (int s = 0; s < 2; ++s)
      for (int t = 0; t < L; ++t) {
        // With shared blocks, slot 1 stores only from its first own block on (position 8 being the prefix's tail).
        if (s == 1 && pg.table == shared_table.data() && t < 8) continue;
        const std::size_t src = (static_cast<std::size_t>(t < prefix ? 0 : s) * L + t) * w;
        slot.push_back(s);
        pos.push_back(t);
        kk.insert(kk.end(), k.begin() + static_cast<std::ptrdiff_t>(src), k.begin() + static_cast<std::ptrdiff_t>(src + w));
        vv.insert(vv.end(), v.begin() + static_cast<std::ptrdiff_t>(src), v.begin() + static_cast<std::ptrdiff_t>(src + w));
      }
    kv_store(ck.data(), cv.data(), kk.data(), vv.data(), slot.data(), pos.data(), static_cast<int>(slot.size()), pg,
             nkv, hd);
    const Vec q = randu(static_cast<std::size_t>(2) * nh * hd, 52);
    const Ids qs = {0, 1}, qp = {L - 1, L - 1};
    Vec out(q.size());
    attention_cached(out.data(), q.data(), ck.data(), cv.data(), qs.data(), qp.data(), 2, pg, nh, nkv, hd);
    return out;
  };
  EXPECT_EQ(run(shared), run(own));
}

TEST(KvCache, PositionOutsideTheCacheThrows) {
  Vec ck(2 * 4 * 3, 0.0f), cv(ck.size(), 0.0f), k(3, 1.0f), v(3, 1.0f), q(3, 1.0f), out(3);
  const Ids table = {0, 1}, holes = {0, -1};
  const KvPages pg{table.data(), 2, 1, 4, 2}, paged{holes.data(), 1, 2, 2, 2};
  const Ids slot = {1}, bad = {4}, neg = {-1}, zero = {0}, three = {3}, far = {2};
  EXPECT_THROW(kv_store(ck.data(), cv.data(), k.data(), v.data(), slot.data(), bad.data(), 1, pg, 1, 3), FatalError);
  EXPECT_THROW(attention_cached(out.data(), q.data(), ck.data(), cv.data(), slot.data(), neg.data(), 1, pg, 1, 1, 3),
               FatalError);
  EXPECT_THROW(kv_store(ck.data(), cv.data(), k.data(), v.data(), far.data(), zero.data(), 1, pg, 1, 3), FatalError);
  // A position whose table entry has no block.
  EXPECT_THROW(kv_store(ck.data(), cv.data(), k.data(), v.data(), zero.data(), three.data(), 1, paged, 1, 3),
               FatalError);
  EXPECT_THROW(
      attention_cached(out.data(), q.data(), ck.data(), cv.data(), zero.data(), three.data(), 1, paged, 1, 1, 3),
      FatalError);
}

TEST(KvCache, GatherRowsCopiesExactly) {
  const int rows = 9, width = 13;
  const Vec src = randu(static_cast<std::size_t>(rows) * width, 30);
  const Ids idx = {4, 0, 8, 4, 4, 2, 7};  // repeats, any order
  const int n = static_cast<int>(idx.size());
  Vec dst(static_cast<std::size_t>(n) * width, -1.0f);
  gather_rows(dst.data(), src.data(), idx.data(), n, width);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < width; ++c)
      ASSERT_EQ(dst[static_cast<std::size_t>(i) * width + c],
                src[static_cast<std::size_t>(idx[static_cast<std::size_t>(i)]) * width + c]);
  // n = 0 touches nothing.
  gather_rows(nullptr, src.data(), nullptr, 0, width);
}

TEST(KvCache, ScatterRowsWritesOnlyItsRows) {
  const int rows = 9, width = 13;
  const Vec src = randu(static_cast<std::size_t>(4) * width, 32);
  const Ids idx = {7, 0, 3, 8};  // distinct, any order
  const int n = static_cast<int>(idx.size());
  Vec dst(static_cast<std::size_t>(rows) * width, -1.0f);
  scatter_rows(dst.data(), src.data(), idx.data(), n, width);
  for (int r = 0; r < rows; ++r) {
    const auto it = std::find(idx.begin(), idx.end(), r);
    for (int c = 0; c < width; ++c) {
      const float want = it == idx.end() ? -1.0f : src[static_cast<std::size_t>(it - idx.begin()) * width + c];
      ASSERT_EQ(dst[static_cast<std::size_t>(r) * width + c], want) << "row " << r << " col " << c;
    }
  }
  // Through the CPU backend's Ops: the same.
  Vec dst2(static_cast<std::size_t>(rows) * width, -1.0f);
  make_cpu_ops()->scatter_rows(dst2.data(), src.data(), idx.data(), n, width);
  EXPECT_EQ(dst2, dst);
  scatter_rows(nullptr, src.data(), nullptr, 0, width);  // n = 0 touches nothing
}

// The CPU backend's Ops forward to these functions (same results through the interface).
TEST(KvCache, CpuBackendForwardsTheInferenceOps) {
  auto ops = make_cpu_ops();
  const Vec src = randu(4 * 3, 31);
  const Ids idx = {3, 1};
  Vec dst(2 * 3), want(2 * 3);
  ops->gather_rows(dst.data(), src.data(), idx.data(), 2, 3);
  gather_rows(want.data(), src.data(), idx.data(), 2, 3);
  EXPECT_EQ(dst, want);
  const Vec logits = {0.1f, 2.0f, -1.0f, 0.5f};
  const std::vector<uint64_t> seeds = {11};
  Ops::Sampling sp;
  sp.top_k = 2;
  int32_t t1 = -1, t2 = -2;
  float l1 = 0, l2 = 1;
  ops->sample(&t1, &l1, logits.data(), seeds.data(), 1, 4, sp);
  sample(&t2, &l2, logits.data(), seeds.data(), 1, 4, sp);
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(l1, l2);
}

// ---------------------------------------------------------------------------------------------------------------
// Sampling

// log_softmax(z)[i] in double.
double log_softmax_at(const Vec& z, int i) {
  const double m = *std::max_element(z.begin(), z.end());
  double s = 0.0;
  for (float x : z) s += std::exp(static_cast<double>(x) - m);
  return z[static_cast<std::size_t>(i)] - m - std::log(s);
}

// The distribution the filters of sampling.h leave, renormalised (0 for excluded tokens), written independently
// of the implementation: sets are read off sorted copies of the row.
std::vector<double> filtered_distribution(const Vec& z, const Ops::Sampling& sp) {
  const int V = static_cast<int>(z.size());
  std::vector<bool> in(static_cast<std::size_t>(V), true);
  if (sp.top_k > 0 && sp.top_k < V) {  // the top_k largest logits, plus every logit equal to the smallest of them
    Vec sorted = z;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const float kth = sorted[static_cast<std::size_t>(sp.top_k - 1)];
    for (int i = 0; i < V; ++i) in[static_cast<std::size_t>(i)] = z[static_cast<std::size_t>(i)] >= kth;
  }
  std::vector<double> p(static_cast<std::size_t>(V), 0.0);
  double zmax = -INFINITY, total = 0.0;
  for (int i = 0; i < V; ++i)
    if (in[static_cast<std::size_t>(i)]) zmax = std::max(zmax, static_cast<double>(z[static_cast<std::size_t>(i)]));
  for (int i = 0; i < V; ++i)
    if (in[static_cast<std::size_t>(i)]) {
      p[static_cast<std::size_t>(i)] = std::exp((z[static_cast<std::size_t>(i)] - zmax) / sp.temperature);
      total += p[static_cast<std::size_t>(i)];
    }
  for (double& x : p) x /= total;
  if (sp.top_p < 1.0f) {  // the fewest most likely tokens reaching top_p, plus ties of the least likely of them
    std::vector<double> desc;
    for (int i = 0; i < V; ++i)
      if (in[static_cast<std::size_t>(i)]) desc.push_back(p[static_cast<std::size_t>(i)]);
    std::sort(desc.begin(), desc.end(), std::greater<double>());
    std::size_t n = 1;
    double mass = desc[0];
    while (mass < sp.top_p && n < desc.size()) mass += desc[n++];
    const double tau = desc[n - 1];
    for (int i = 0; i < V; ++i)
      if (p[static_cast<std::size_t>(i)] < tau) in[static_cast<std::size_t>(i)] = false;
  }
  if (sp.min_p > 0.0f) {
    double pmax = 0.0;
    for (int i = 0; i < V; ++i)
      if (in[static_cast<std::size_t>(i)]) pmax = std::max(pmax, p[static_cast<std::size_t>(i)]);
    for (int i = 0; i < V; ++i)
      if (p[static_cast<std::size_t>(i)] < sp.min_p * pmax) in[static_cast<std::size_t>(i)] = false;
  }
  double kept = 0.0;
  for (int i = 0; i < V; ++i) {
    if (!in[static_cast<std::size_t>(i)]) p[static_cast<std::size_t>(i)] = 0.0;
    kept += p[static_cast<std::size_t>(i)];
  }
  for (double& x : p) x /= kept;
  return p;
}

// n draws from one row of logits, with seeds 0..n-1 (n rows in one call). Checks the recorded log-probs.
Ids draw(const Vec& z, const Ops::Sampling& sp, int n) {
  const int V = static_cast<int>(z.size());
  Vec rows;
  rows.reserve(static_cast<std::size_t>(n) * V);
  for (int b = 0; b < n; ++b) rows.insert(rows.end(), z.begin(), z.end());
  std::vector<uint64_t> seeds(static_cast<std::size_t>(n));
  std::iota(seeds.begin(), seeds.end(), uint64_t{0});
  Ids tokens(static_cast<std::size_t>(n), -1);
  Vec logprobs(static_cast<std::size_t>(n), 1.0f);
  sample(tokens.data(), logprobs.data(), rows.data(), seeds.data(), n, V, sp);
  for (int b = 0; b < n; ++b) {
    const int t = tokens[static_cast<std::size_t>(b)];
    EXPECT_TRUE(t >= 0 && t < V) << t;
    if (t < 0 || t >= V) break;
    EXPECT_NEAR(logprobs[static_cast<std::size_t>(b)], log_softmax_at(z, t), 1e-5) << "log-prob of token " << t;
  }
  return tokens;
}

Ops::Sampling params(float temperature, int top_k, float top_p, float min_p) {
  Ops::Sampling sp;
  sp.temperature = temperature;
  sp.top_k = top_k;
  sp.top_p = top_p;
  sp.min_p = min_p;
  return sp;
}

std::string describe(const Ops::Sampling& sp) {
  return "T=" + std::to_string(sp.temperature) + " top_k=" + std::to_string(sp.top_k) +
         " top_p=" + std::to_string(sp.top_p) + " min_p=" + std::to_string(sp.min_p);
}

TEST(Sampling, GreedyIsTheArgmaxWithLowestIndexOnTies) {
  const int V = 6;
  const Vec logits = {
      1.0f,      3.0f,  2.0f,      3.0f,  -1.0f, 0.0f,   // tie at 1 and 3 -> 1
      5.0f,      5.0f,  5.0f,      5.0f,  5.0f,  5.0f,   // all equal -> 0
      -INFINITY, -2.0f, -INFINITY, -2.5f, -9.0f, -2.0f,  // -> 1
      0.0f,      0.0f,  0.0f,      0.0f,  0.0f,  0.5f,   // last -> 5
  };
  const Ids want = {1, 0, 1, 5};
  const int B = static_cast<int>(want.size());
  const std::vector<uint64_t> seeds = {1, 2, 3, 4};
  for (const auto& sp : {params(0.0f, 0, 1.0f, 0.0f), params(0.0f, 3, 0.5f, 0.2f), params(-1.0f, 0, 1.0f, 0.0f)}) {
    Ids tokens(static_cast<std::size_t>(B), -1);
    Vec logprobs(static_cast<std::size_t>(B));
    sample(tokens.data(), logprobs.data(), logits.data(), seeds.data(), B, V, sp);
    EXPECT_EQ(tokens, want) << describe(sp);
    for (int b = 0; b < B; ++b) {
      const Vec row(logits.begin() + b * V, logits.begin() + (b + 1) * V);
      EXPECT_NEAR(logprobs[static_cast<std::size_t>(b)], log_softmax_at(row, want[static_cast<std::size_t>(b)]), 1e-6);
    }
  }
}

// Logits with exact ties (some of them at the top-k boundary) for the filter tests.
Vec tied_logits(int V, uint32_t seed) {
  Vec z = randu(static_cast<std::size_t>(V), seed, -3.0f, 3.0f);
  z[5] = z[17] = z[30];
  z[2] = z[11];
  z[20] = z[21] = z[22] = 0.25f;
  return z;
}

TEST(Sampling, FiltersNeverEmitExcludedTokensAndKeepTheRest) {
  const int V = 40, n = 2000;
  const Vec z = tied_logits(V, 40);
  // A top_k whose boundary falls inside a tie: k = position of the first of two equal sorted values.
  Vec sorted = z;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  int k_tie = 0;
  for (int j = 0; j + 1 < V && !k_tie; ++j)
    if (sorted[static_cast<std::size_t>(j)] == sorted[static_cast<std::size_t>(j + 1)]) k_tie = j + 1;
  ASSERT_GT(k_tie, 0);
  int cases = 0, tie_cases = 0;
  std::vector<int> top_ks = {0, 1, 3, V - 1, V, V + 5};
  if (std::find(top_ks.begin(), top_ks.end(), k_tie) == top_ks.end()) top_ks.push_back(k_tie);
  for (float temperature : {0.5f, 1.0f, 1.7f})
    for (int top_k : top_ks)
      for (float top_p : {1.0f, 0.95f, 0.6f, 0.1f, 0.0f})
        for (float min_p : {0.0f, 0.02f, 0.2f}) {
          const Ops::Sampling sp = params(temperature, top_k, top_p, min_p);
          SCOPED_TRACE(describe(sp));
          const std::vector<double> q = filtered_distribution(z, sp);
          int kept = 0;
          for (double x : q) kept += x > 0.0;
          ASSERT_GE(kept, 1);
          if (top_k == k_tie && top_p == 1.0f && min_p == 0.0f) {
            EXPECT_GT(kept, k_tie) << "ties at the top-k boundary are kept";
            ++tie_cases;
          }
          const Ids tokens = draw(z, sp, n);
          std::vector<int> count(static_cast<std::size_t>(V), 0);
          for (int t : tokens)
            if (t >= 0 && t < V) ++count[static_cast<std::size_t>(t)];
          for (int i = 0; i < V; ++i) {
            const double qi = q[static_cast<std::size_t>(i)];
            const int ci = count[static_cast<std::size_t>(i)];
            if (qi == 0.0) {
              EXPECT_EQ(ci, 0) << "excluded token " << i << " emitted";
            } else if (qi > 0.01) {  // expected >= 20 times: never missed
              EXPECT_GT(ci, 0) << "kept token " << i << " never emitted";
            }
          }
          ++cases;
        }
  EXPECT_EQ(cases, 3 * static_cast<int>(top_ks.size()) * 5 * 3);
  EXPECT_EQ(tie_cases, 3);
}

// Pearson's chi-square of the counts against n * q over the kept tokens; excluded tokens must have count 0.
double chi_square(const Ids& tokens, const std::vector<double>& q, int* df) {
  std::vector<double> count(q.size(), 0.0);
  for (int t : tokens) count[static_cast<std::size_t>(t)] += 1.0;
  const double n = static_cast<double>(tokens.size());
  double chi2 = 0.0;
  int kept = 0;
  for (std::size_t i = 0; i < q.size(); ++i) {
    if (q[i] == 0.0) {
      EXPECT_EQ(count[i], 0.0) << "excluded token " << i;
      continue;
    }
    ++kept;
    chi2 += (count[i] - n * q[i]) * (count[i] - n * q[i]) / (n * q[i]);
  }
  *df = kept - 1;
  return chi2;
}

// The 0.999 quantile of chi-square with df degrees of freedom (df 1..6): a correct sampler exceeds it with
// probability 1e-3 per case; with the fixed seeds below the outcome is deterministic.
double chi2_q999(int df) {
  static const double q[] = {0.0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46};
  return q[df];
}

TEST(Sampling, FrequenciesMatchTheRenormalisedFilteredDistribution) {
  const Vec z = {1.2f, -0.3f, 0.5f, 2.0f, -1.0f, 0.9f, 0.1f};
  const int n = 20000;  // seeds 0..19999
  const std::vector<Ops::Sampling> cases = {
      params(1.0f, 0, 1.0f, 0.0f),   // plain softmax
      params(0.6f, 0, 1.0f, 0.0f),   // temperature
      params(0.6f, 4, 1.0f, 0.0f),   // + top-k (renormalised over 4 tokens)
      params(1.5f, 0, 0.8f, 0.0f),   // top-p
      params(1.0f, 0, 1.0f, 0.15f),  // min-p
      params(0.8f, 5, 0.9f, 0.05f),  // all together
      params(2.0f, 6, 0.97f, 0.0f),  // hot, wide
  };
  for (const Ops::Sampling& sp : cases) {
    SCOPED_TRACE(describe(sp));
    const std::vector<double> q = filtered_distribution(z, sp);
    const Ids tokens = draw(z, sp, n);
    int df = 0;
    const double chi2 = chi_square(tokens, q, &df);
    ASSERT_GE(df, 1);
    std::printf("  %-52s chi2 %7.2f  df %d  (0.999 quantile %.2f)\n", describe(sp).c_str(), chi2, df, chi2_q999(df));
    EXPECT_LE(chi2, chi2_q999(df));
  }
}

// The same draws are a function of the seeds only: a row's token does not depend on the other rows.
TEST(Sampling, RowsAreIndependentOfTheBatch) {
  const int V = 40;
  const Vec z = tied_logits(V, 41);
  const Ops::Sampling sp = params(0.9f, 10, 0.9f, 0.01f);
  const Ids all = draw(z, sp, 300);
  for (int b : {0, 17, 299}) {
    const uint64_t seed = static_cast<uint64_t>(b);
    int32_t tok = -1;
    float lp = 0.0f;
    sample(&tok, &lp, z.data(), &seed, 1, V, sp);
    EXPECT_EQ(tok, all[static_cast<std::size_t>(b)]) << b;
  }
}

// The repetition penalty's ops (CPU reference): seen tokens' logits divided by the penalty when positive, multiplied
// otherwise (0 stays 0), per row's slot table; mark_seen adds each row's token to its slot's table; token_logprobs is
// the log-prob sample() records for the same token of the same logits, bit for bit.
TEST(RepetitionPenalty, PenalisesSeenTokensMarksAndLogsTheModelsLogprob) {
  const int V = 5, R = 3;
  const Vec z = {2.0f, -1.0f, 0.0f, 3.0f, -4.0f,   // row 0 (slot 1)
                 1.0f, 1.0f, -2.0f, 0.5f, 6.0f,    // row 1 (slot 0)
                 -3.0f, 2.5f, 1.5f, -0.5f, 0.25f};  // row 2 (slot 1)
  std::vector<uint8_t> seen = {0, 1, 0, 1, 1,   // slot 0
                               1, 1, 1, 0, 0};  // slot 1
  const Ids rows = {1, 0, 1};
  Vec out(z.size());
  repetition_penalty(out.data(), z.data(), seen.data(), rows.data(), R, V, 2.0f);
  EXPECT_EQ(out, (Vec{1.0f, -2.0f, 0.0f, 3.0f, -4.0f,  //
                      1.0f, 0.5f, -2.0f, 0.25f, 3.0f,  //
                      -6.0f, 1.25f, 0.75f, -0.5f, 0.25f}));
  const Ids tok = {3, 2, 4};
  mark_seen(seen.data(), rows.data(), tok.data(), R, V);
  EXPECT_EQ(seen, (std::vector<uint8_t>{0, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
  Vec lp(R);
  token_logprobs(lp.data(), z.data(), tok.data(), R, V);
  for (int r = 0; r < R; ++r) {
    const Vec row(z.begin() + r * V, z.begin() + (r + 1) * V);
    // the exact log-softmax of the token
    double zmax = -1e30, sum = 0;
    for (const float x : row) zmax = std::max(zmax, static_cast<double>(x));
    for (const float x : row) sum += std::exp(x - zmax);
    EXPECT_NEAR(lp[static_cast<std::size_t>(r)], row[static_cast<std::size_t>(tok[static_cast<std::size_t>(r)])] - zmax - std::log(sum), 1e-6) << r;
    // sample()'s recorded log-prob of its draw (the argmax here), bit for bit
    int32_t t = -1;
    float want = 0, got = 0;
    const uint64_t seed = 1;
    Ops::Sampling greedy;
    greedy.temperature = 0;
    sample(&t, &want, row.data(), &seed, 1, V, greedy);
    token_logprobs(&got, row.data(), &t, 1, V);
    EXPECT_EQ(got, want) << r;
  }
}

// One decode step's bookkeeping (Ops::decode_advance): the ring gets every row's token; a running row takes its token
// as the next input, one position further, and the seed of its next draw; EOS and the length end a row, which then
// keeps its inputs and seed whatever it samples later.
TEST(DecodeAdvance, NextInputsSeedsEosAndLength) {
  const int R = 4, max_count = 5;
  const int32_t eos[2] = {7, 9};
  const uint64_t streams[R] = {11, 22, 33, 44};
  Ids ids = {1, 2, 3, 4}, pos = {10, 20, 30, 40}, count = {0, 3, 4, 2}, done = {0, 0, 0, 1};
  std::vector<uint64_t> seeds = {100, 200, 300, 400};
  Ids ring_t(2 * R, -1);
  Vec ring_l(2 * R, 0.0f);
  // Step 1: row 0 goes on, row 1 samples an EOS id, row 2 reaches max_count, row 3 was done before.
  Ids tok = {5, 9, 6, 8};
  Vec lp = {-0.5f, -1.5f, -2.5f, -3.5f};
  decode_advance(ids.data(), pos.data(), count.data(), done.data(), seeds.data(), ring_t.data(), ring_l.data(),
                 tok.data(), lp.data(), streams, eos, 2, max_count, R);
  EXPECT_EQ(ring_t, (Ids{5, 9, 6, 8, -1, -1, -1, -1}));
  EXPECT_EQ(ring_l, (Vec{-0.5f, -1.5f, -2.5f, -3.5f, 0, 0, 0, 0}));
  EXPECT_EQ(done, (Ids{0, 1, 1, 1}));
  EXPECT_EQ(count, (Ids{1, 4, 5, 2}));
  EXPECT_EQ(ids, (Ids{5, 2, 3, 4}));
  EXPECT_EQ(pos, (Ids{11, 20, 30, 40}));
  EXPECT_EQ(seeds, (std::vector<uint64_t>{random_bits(11, 1), 200, 300, 400}));
  // Step 2, into the ring's second row: done rows change nothing but their ring entries; no EOS ids at all.
  tok = {7, 1, 2, 3};
  decode_advance(ids.data(), pos.data(), count.data(), done.data(), seeds.data(), ring_t.data() + R,
                 ring_l.data() + R, tok.data(), lp.data(), streams, eos, 0, max_count, R);
  EXPECT_EQ(ring_t, (Ids{5, 9, 6, 8, 7, 1, 2, 3}));
  EXPECT_EQ(done, (Ids{0, 1, 1, 1}));
  EXPECT_EQ(ids, (Ids{7, 2, 3, 4}));
  EXPECT_EQ(pos, (Ids{12, 20, 30, 40}));
  EXPECT_EQ(count, (Ids{2, 4, 5, 2}));
  EXPECT_EQ(seeds[0], random_bits(11, 2));
}

}  // namespace
}  // namespace mgrl::kernels::cpu
