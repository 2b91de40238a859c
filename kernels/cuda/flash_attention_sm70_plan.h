// flash_attention_sm70_plan.h: the tiling of the Volta attention kernels (flash_attention_sm70.cu) in plain C++
// (tile sizes, shared-memory layouts, loop bounds, masks, the register layout of a warp's values), shared by the
// kernels and the CPU test tests/unit/test_attention_sm70_plan.cpp, which checks every index rule here.
#pragma once

#include "core/host_device.h"

namespace mgrl::kernels::cuda::sm70 {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kRows = 16 * kWarps;  // query rows of a forward / dq block, key rows of a dkv block
inline constexpr int kDqN = 32;            // key rows of a dq tile
inline constexpr int kDkvM = 32;           // query rows of a dkv tile
inline constexpr int kVolta = 96 * 1024;   // largest shared memory per block on sm_70 (opt-in above 48 KB)

// Forward: key rows of a tile, and output columns of one P V product (head_dim / chunk of them per tile). head_dim 128
// takes 32 and 32 so that the forward fits two blocks in Volta's 96 KB an SM (44 KB each, as head_dim 64 with 64s).
MGRL_HOST_DEVICE constexpr int fwd_tile(int head_dim) { return head_dim == 64 ? 64 : 32; }
MGRL_HOST_DEVICE constexpr int fwd_chunk(int head_dim) { return head_dim == 64 ? 64 : 32; }

// Shared rows: fp16 tiles at head_dim + 8 elements (16-row steps stay 32-byte aligned, as wmma needs); fp32
// scratch at width + 8 floats (width 32 or 64: pitch = 8 mod 32 words, so the float2 reads below are free of bank
// conflicts).
MGRL_HOST_DEVICE constexpr int tile_pitch(int head_dim) { return head_dim + 8; }
MGRL_HOST_DEVICE constexpr int scratch_pitch(int width) { return width + 8; }

// Byte offsets of a kernel's shared-memory regions (-1: unused) and its total size. Every warp owns 16 rows of
// scratch per scratch region (s, dp), at warp * 16 * pitch. `stage` is where the dq and dkv kernels put the warp's
// fp32 accumulators (16 x (head_dim + 8) floats a warp) after their loop: over the q/g (dq) or k/v (dkv) tiles,
// which are dead by then.
struct Smem {
  int q, g, k, v, ls, ds, s, dp, stage, bytes;
  int s_pitch;  // floats per scratch row
};
MGRL_HOST_DEVICE constexpr int tile_bytes(int rows, int head_dim) { return rows * tile_pitch(head_dim) * 2; }
MGRL_HOST_DEVICE constexpr int scratch_bytes(int width) { return kWarps * 16 * scratch_pitch(width) * 4; }
MGRL_HOST_DEVICE constexpr int stage_bytes(int head_dim) { return kWarps * 16 * tile_pitch(head_dim) * 4; }

// forward: Q [64], K [fwd_tile], V [fwd_tile], scratch [4 warps][16][max(fwd_tile, fwd_chunk) + 8] (S, then P in
// place, then P V).
MGRL_HOST_DEVICE constexpr Smem fwd_smem(int head_dim) {
  const int n = fwd_tile(head_dim), c = fwd_chunk(head_dim);
  Smem m{-1, -1, -1, -1, -1, -1, -1, -1, -1, 0, scratch_pitch(n > c ? n : c)};
  m.q = 0;
  m.k = m.q + tile_bytes(kRows, head_dim);
  m.v = m.k + tile_bytes(n, head_dim);
  m.s = m.v + tile_bytes(n, head_dim);
  m.bytes = m.s + kWarps * 16 * m.s_pitch * 4;
  return m;
}
// dq: Q, dO [64], K, V [kDqN], scratch S (then dS in place) and dP [4 warps][16][kDqN + 8]; stage over Q/dO.
MGRL_HOST_DEVICE constexpr Smem dq_smem(int head_dim) {
  Smem m{-1, -1, -1, -1, -1, -1, -1, -1, -1, 0, scratch_pitch(kDqN)};
  m.q = 0;
  m.g = m.q + tile_bytes(kRows, head_dim);
  m.k = m.g + tile_bytes(kRows, head_dim);
  m.v = m.k + tile_bytes(kDqN, head_dim);
  m.s = m.v + tile_bytes(kDqN, head_dim);
  m.dp = m.s + scratch_bytes(kDqN);
  m.bytes = m.dp + scratch_bytes(kDqN);
  m.stage = m.q;
  return m;
}
// dkv: K, V [64], Q, dO [kDkvM], lse and D [kDkvM] floats, scratch S^T (then P^T) and dP^T (then dS^T)
// [4 warps][16][kDkvM + 8]; stage over K/V.
MGRL_HOST_DEVICE constexpr Smem dkv_smem(int head_dim) {
  Smem m{-1, -1, -1, -1, -1, -1, -1, -1, -1, 0, scratch_pitch(kDkvM)};
  m.k = 0;
  m.v = m.k + tile_bytes(kRows, head_dim);
  m.q = m.v + tile_bytes(kRows, head_dim);
  m.g = m.q + tile_bytes(kDkvM, head_dim);
  m.ls = m.g + tile_bytes(kDkvM, head_dim);
  m.ds = m.ls + 4 * kDkvM;
  m.s = m.ds + 4 * kDkvM;
  m.dp = m.s + scratch_bytes(kDkvM);
  m.bytes = m.dp + scratch_bytes(kDkvM);
  m.stage = m.k;
  return m;
}
// The most shared memory any of the three kernels takes at this head_dim.
MGRL_HOST_DEVICE constexpr int max_smem(int head_dim) {
  const int a = fwd_smem(head_dim).bytes, b = dq_smem(head_dim).bytes, c = dkv_smem(head_dim).bytes;
  return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

// Grid (B * n_heads, ceil(max_len / 64)). The forward and dq kernels take query blocks heaviest (last) first: block
// y starts at query position (gridDim.y - 1 - y) * 64; the dkv kernel takes key blocks heaviest (first) first: block
// y starts at key position y * 64. A block whose start is at or past its sequence's length exits at once.
MGRL_HOST_DEVICE constexpr int query_block_start(int y, int grid_y) { return (grid_y - 1 - y) * kRows; }
MGRL_HOST_DEVICE constexpr int key_block_start(int y) { return y * kRows; }

// Forward / dq: the query block at q0 (rows [q0, min(q0 + 64, len))) visits key tiles j = 0 .. key_tiles - 1 of
// `tile` rows each (keys [j * tile, (j + 1) * tile); rows at or past len are zero-filled in shared memory): every
// tile up to the block's last valid query, none beyond (causal tile skipping).
MGRL_HOST_DEVICE constexpr int key_tiles(int q0, int len, int tile) {
  const int q_end = q0 + kRows < len ? q0 + kRows : len;
  return (q_end + tile - 1) / tile;
}
// Whether a warp whose first query row is wrow must mask the key tile at kbase (it reaches past wrow); when it
// need not, every key of the tile is <= every query row of the warp.
MGRL_HOST_DEVICE constexpr bool key_tile_masked(int kbase, int tile, int wrow) { return kbase + tile - 1 > wrow; }
// Whether query t of a warp (first row wrow) takes key u of the tile at kbase: rows t >= len are never stored.
MGRL_HOST_DEVICE constexpr bool fwd_keeps(int kbase, int tile, int wrow, int t, int u) {
  return !(key_tile_masked(kbase, tile, wrow) && u > t);
}

// dkv: the key block at k0 visits query tiles [query_tile_begin, query_tile_end) of `tile` rows (queries at or
// past len are zero-filled): from the tile holding k0 (no earlier query sees a key of the block) to the sequence end.
MGRL_HOST_DEVICE constexpr int query_tile_begin(int k0, int tile) { return k0 / tile; }
MGRL_HOST_DEVICE constexpr int query_tile_end(int len, int tile) { return (len + tile - 1) / tile; }
// Whether the warp whose keys are [wkey0, wkey0 + 16) must mask the query tile at t0: some query precedes some key
// of the warp, or the tile reaches past the sequence. When it need not, every pair of the tile counts.
MGRL_HOST_DEVICE constexpr bool query_tile_masked(int t0, int tile, int wkey0, int len) {
  return t0 < wkey0 + 15 || t0 + tile > len;
}
MGRL_HOST_DEVICE constexpr bool dkv_keeps(int t0, int tile, int wkey0, int len, int t, int u) {
  return !(query_tile_masked(t0, tile, wkey0, len) && (t < u || t >= len));
}

// A warp's 16 x width fp32 values in registers (read from its scratch rows with float2 loads), the layout of
// mma.sync's accumulators: value e (0..3) of column group n (width / 8 of them) of lane l sits at row
// (l >> 2) + 8 (e >> 1), column 8 n + 2 (l & 3) + (e & 1). Row statistics reduce over the 4 lanes of a quad.
MGRL_HOST_DEVICE constexpr int val_row(int lane, int e) { return (lane >> 2) + 8 * (e >> 1); }
MGRL_HOST_DEVICE constexpr int val_col(int lane, int n, int e) { return 8 * n + 2 * (lane & 3) + (e & 1); }

}  // namespace mgrl::kernels::cuda::sm70
