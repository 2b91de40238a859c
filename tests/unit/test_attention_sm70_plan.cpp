// test_attention_sm70_plan.cpp: the index rules of the Volta attention kernels
// (kernels/cuda/flash_attention_sm70_plan.h) checked on the CPU: shared-memory layouts (alignment wmma needs, no
// overlaps, Volta's 96 KB), the lanes' register layout (a bijection, bank-conflict-free float2 reads), and the work
// partition: replaying each kernel's loops and masks over packed-sequence lengths, every causal (query, key) pair is
// counted exactly once and no other pair is.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/flash_attention_sm70_plan.h"

namespace mgrl::kernels::cuda::sm70 {
namespace {

struct Region {
  const char* name;
  int begin, end;
};

// The regions of a layout that are in use, in address order.
std::vector<Region> regions(const Smem& m, int head_dim, int q_rows, int k_rows, int lse_rows) {
  std::vector<Region> r;
  auto add = [&](const char* name, int off, int bytes) {
    if (off >= 0) r.push_back({name, off, off + bytes});
  };
  add("q", m.q, tile_bytes(q_rows, head_dim));
  add("g", m.g, tile_bytes(q_rows, head_dim));
  add("k", m.k, tile_bytes(k_rows, head_dim));
  add("v", m.v, tile_bytes(k_rows, head_dim));
  add("ls", m.ls, 4 * lse_rows);
  add("ds", m.ds, 4 * lse_rows);
  add("s", m.s, kWarps * 16 * m.s_pitch * 4);
  add("dp", m.dp, kWarps * 16 * m.s_pitch * 4);
  std::sort(r.begin(), r.end(), [](const Region& a, const Region& b) { return a.begin < b.begin; });
  return r;
}

void check_layout(const std::string& what, const Smem& m, int head_dim, int q_rows, int k_rows, int lse_rows,
                  int width) {
  SCOPED_TRACE(what + " head_dim " + std::to_string(head_dim));
  const std::vector<Region> r = regions(m, head_dim, q_rows, k_rows, lse_rows);
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r.front().begin, 0);
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (i + 1 < r.size()) {
      EXPECT_LE(r[i].end, r[i + 1].begin) << r[i].name << " overlaps " << r[i + 1].name;
    }
    EXPECT_EQ(r[i].begin % 32, 0) << r[i].name << ": wmma needs 32-byte aligned addresses";
  }
  EXPECT_EQ(r.back().end, m.bytes);
  EXPECT_LE(m.bytes, kVolta);
  // fp16 tiles: 16-row steps and 16-column steps stay 32-byte aligned; ldm a multiple of 8 halves.
  EXPECT_EQ(16 * tile_pitch(head_dim) * 2 % 32, 0);
  EXPECT_EQ(tile_pitch(head_dim) % 8, 0);
  // Scratch: wide enough, per-warp rows 32-byte aligned, float ldm a multiple of 4, the fp16 view's ldm
  // (2 s_pitch) a multiple of 8, and a row's width halves fit in the bytes of its floats (written in place).
  EXPECT_GE(m.s_pitch, width);
  EXPECT_EQ(16 * m.s_pitch * 4 % 32, 0);
  EXPECT_EQ(m.s_pitch % 4, 0);
  EXPECT_EQ(2 * m.s_pitch % 8, 0);
  EXPECT_LE(2 * width, 4 * m.s_pitch);
  EXPECT_EQ(m.s_pitch % 32, 8) << "float2 reads are conflict-free at pitch = 8 mod 32";
  // Staging of the fp32 results after the loop: 32-byte aligned, per-warp rows too, over dead regions only.
  if (m.stage >= 0) {
    EXPECT_EQ(m.stage % 32, 0);
    EXPECT_EQ(16 * tile_pitch(head_dim) * 4 % 32, 0);
    for (const Region& x : r) {
      const bool dead = std::string(x.name) == (m.stage == m.q ? "q" : "k") ||
                        std::string(x.name) == (m.stage == m.q ? "g" : "v");
      if (!dead) {
        EXPECT_TRUE(x.end <= m.stage || x.begin >= m.stage + stage_bytes(head_dim)) << x.name;
      }
    }
  }
}

TEST(AttentionSm70Plan, SharedMemoryLayouts) {
  for (const int d : {64, 128}) {
    check_layout("forward", fwd_smem(d), d, kRows, fwd_tile(d), 0, std::max(fwd_tile(d), fwd_chunk(d)));
    EXPECT_EQ(d % fwd_chunk(d), 0);
    EXPECT_EQ(fwd_tile(d) % 16, 0);
    check_layout("dq", dq_smem(d), d, kRows, kDqN, 0, kDqN);
    check_layout("dkv", dkv_smem(d), d, kDkvM, kRows, kDkvM, kDkvM);
    EXPECT_EQ(max_smem(d), std::max({fwd_smem(d).bytes, dq_smem(d).bytes, dkv_smem(d).bytes}));
  }
  // The figures the README states: head_dim 64 fits two blocks of every kernel in Volta's 96 KB an SM; at head_dim
  // 128 the forward fits two, dq and dkv one (72 KB).
  EXPECT_LE(2 * max_smem(64), kVolta);
  EXPECT_LE(2 * fwd_smem(128).bytes, kVolta);
  EXPECT_EQ(max_smem(64), 48384);
  EXPECT_EQ(max_smem(128), 72960);
  EXPECT_EQ(dq_smem(64).stage + stage_bytes(64), dq_smem(64).k);
  EXPECT_EQ(dkv_smem(128).stage + stage_bytes(128), dkv_smem(128).q);
}

TEST(AttentionSm70Plan, LaneLayout) {
  for (const int width : {32, 64}) {
    SCOPED_TRACE("width " + std::to_string(width));
    std::set<std::pair<int, int>> seen;
    for (int lane = 0; lane < 32; ++lane)
      for (int n = 0; n < width / 8; ++n)
        for (int e = 0; e < 4; ++e) {
          const int row = val_row(lane, e), col = val_col(lane, n, e);
          EXPECT_TRUE(row >= 0 && row < 16 && col >= 0 && col < width);
          EXPECT_TRUE(seen.insert({row, col}).second) << "lane " << lane << " n " << n << " e " << e;
          if (e % 2 == 0) {  // (e, e + 1) are one float2 / half2: same row, adjacent columns, even first column
            EXPECT_EQ(col % 2, 0);
            EXPECT_EQ(val_row(lane, e + 1), row);
            EXPECT_EQ(val_col(lane, n, e + 1), col + 1);
          }
        }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(16 * width));
    // 64-bit shared loads are served a half-warp at a time: the 16 lanes' two words each must hit 32 banks.
    const int pitch = scratch_pitch(width);
    for (int n = 0; n < width / 8; ++n)
      for (int e = 0; e < 4; e += 2)
        for (int half = 0; half < 2; ++half) {
          std::set<int> banks;
          for (int lane = 16 * half; lane < 16 * half + 16; ++lane) {
            const int word = val_row(lane, e) * pitch + val_col(lane, n, e);
            banks.insert(word % 32);
            banks.insert((word + 1) % 32);
          }
          EXPECT_EQ(banks.size(), 32u) << "bank conflict: n " << n << " e " << e << " half-warp " << half;
        }
  }
}

// Replays the forward / dq loops over one sequence of length len (grid sized from max_len): count[t][u] is how often
// query t < len takes key u into a stored row.
std::vector<std::vector<int>> replay_query_blocks(int len, int max_len, int tile, int* bad_tiles) {
  std::vector<std::vector<int>> count(static_cast<std::size_t>(len), std::vector<int>(len + kRows + tile, 0));
  const int grid_y = (max_len + kRows - 1) / kRows;
  for (int y = 0; y < grid_y; ++y) {
    const int q0 = query_block_start(y, grid_y);
    if (q0 >= len) continue;  // the block exits
    for (int j = 0; j < key_tiles(q0, len, tile); ++j) {
      const int kbase = j * tile;
      if (kbase >= len) ++*bad_tiles;  // a tile with no valid row would be loaded for nothing
      for (int w = 0; w < kWarps; ++w) {
        const int wrow = q0 + 16 * w;
        for (int t = wrow; t < wrow + 16 && t < len; ++t)  // rows at or past len are not stored
          for (int u = kbase; u < kbase + tile; ++u)
            if (fwd_keeps(kbase, tile, wrow, t, u))
              ++count[static_cast<std::size_t>(t)][static_cast<std::size_t>(u)];
      }
    }
  }
  return count;
}

// Replays the dkv loops: count[t][u] is how often key u < len (a stored row) takes query t.
std::vector<std::vector<int>> replay_key_blocks(int len, int max_len, int tile, int* bad_tiles) {
  std::vector<std::vector<int>> count(static_cast<std::size_t>(len + kRows + tile), std::vector<int>(len, 0));
  const int grid_y = (max_len + kRows - 1) / kRows;
  for (int y = 0; y < grid_y; ++y) {
    const int k0 = key_block_start(y);
    if (k0 >= len) continue;
    for (int i = query_tile_begin(k0, tile); i < query_tile_end(len, tile); ++i) {
      const int t0 = i * tile;
      if (t0 >= len) ++*bad_tiles;
      for (int w = 0; w < kWarps; ++w) {
        const int wkey0 = k0 + 16 * w;
        for (int u = wkey0; u < wkey0 + 16 && u < len; ++u)
          for (int t = t0; t < t0 + tile; ++t)
            if (dkv_keeps(t0, tile, wkey0, len, t, u))
              ++count[static_cast<std::size_t>(t)][static_cast<std::size_t>(u)];
      }
    }
  }
  return count;
}

TEST(AttentionSm70Plan, EveryCausalPairOnce) {
  std::vector<int> lens;
  for (int len = 1; len <= 140; ++len) lens.push_back(len);
  for (const int len : {191, 192, 193, 255, 256, 257, 300}) lens.push_back(len);
  for (const int len : lens) {
    for (const int extra : {0, 1, 64, 100}) {  // max_len above the length: blocks past the end exit
      const int max_len = len + extra;
      SCOPED_TRACE("len " + std::to_string(len) + " max_len " + std::to_string(max_len));
      for (const int tile : {fwd_tile(64), fwd_tile(128), kDqN}) {
        int bad = 0;
        const auto c = replay_query_blocks(len, max_len, tile, &bad);
        EXPECT_EQ(bad, 0) << "forward/dq tile " << tile << " loads a tile past the sequence";
        int wrong = 0;
        for (int t = 0; t < len; ++t)
          for (std::size_t u = 0; u < c[static_cast<std::size_t>(t)].size(); ++u)
            wrong += c[static_cast<std::size_t>(t)][u] != (static_cast<int>(u) <= t ? 1 : 0);
        EXPECT_EQ(wrong, 0) << "forward/dq tile " << tile;
      }
      int bad = 0;
      const auto c = replay_key_blocks(len, max_len, kDkvM, &bad);
      EXPECT_EQ(bad, 0) << "dkv loads a query tile past the sequence";
      int wrong = 0;
      for (std::size_t t = 0; t < c.size(); ++t)
        for (int u = 0; u < len; ++u)
          wrong += c[t][static_cast<std::size_t>(u)] !=
                   (u <= static_cast<int>(t) && static_cast<int>(t) < len ? 1 : 0);
      EXPECT_EQ(wrong, 0) << "dkv";
    }
  }
}

// A mask that is skipped must not matter: wherever a tile is unmasked, every pair in it is causal (forward / dq)
// or causal and inside the sequence (dkv). The replay above finds such errors as counts; this names the rule.
TEST(AttentionSm70Plan, UnmaskedTilesNeedNoMask) {
  for (int wrow = 0; wrow < 256; wrow += 16)
    for (int kbase = 0; kbase <= wrow + 64; kbase += 32)
      for (const int tile : {fwd_tile(64), fwd_tile(128), kDqN})
        if (!key_tile_masked(kbase, tile, wrow)) {
          for (int t = wrow; t < wrow + 16; ++t) EXPECT_LE(kbase + tile - 1, t);
        }
  for (const int len : {1, 31, 32, 33, 64, 100, 257})
    for (int wkey0 = 0; wkey0 < len; wkey0 += 16)
      for (int t0 = 0; t0 < len; t0 += kDkvM)
        if (!query_tile_masked(t0, kDkvM, wkey0, len)) {
          for (int u = wkey0; u < wkey0 + 16; ++u) {
            EXPECT_GE(t0, u);
            EXPECT_LE(t0 + kDkvM, len);
          }
        }
}

}  // namespace
}  // namespace mgrl::kernels::cuda::sm70
