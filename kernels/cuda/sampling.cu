// sampling.cu: the canonical sampling algorithm of kernels/cpu/sampling.h on the GPU, one block per row of logits
// (or, for greedy and unfiltered rows with MGRL_SAMPLER_SPLIT=1, several: "split rows" below).
//
// With temperature > 0 every filter of the algorithm keeps exactly the tokens whose logit is at least some
// threshold (dividing by a positive temperature and softmax keep the order), so a row needs no per-token state:
// each pass re-reads the row (from L2) and recomputes what it needs; nothing of size V is stored. Logits are
// compared through order-preserving uint32 keys (order_key). Per row:
//   pass      argmax (lowest index on ties), which is also the row max zmax
//   pass      lse = zmax + log(sum exp(z - zmax)) in double, for the recorded log-prob
//   temperature 0: the argmax. Otherwise:
//   top_k     the largest key K with count(key >= K) >= k (the key of the k-th largest logit, ties at the
//             boundary kept): 4 radix passes of 8 bits with integer histograms (sample_select.h)
//   softmax   m = zmax / T (the max always survives top-k), w = exp(z / T - m), total = sum of kept w (double);
//             at temperature 1 without top-k this is the lse pass's sum, bit for bit, and is not summed again
//   top_p     the largest key K (above top-k's) with sum over key >= K of w / total >= top_p: 4 radix passes
//             of 8 bits with histograms of that mass; that token's probability is the CPU's tau. When even all
//             kept tokens do not reach top_p (rounding) K stays 0 and all are kept, as on the CPU; K is capped at
//             the max's key (top_p <= 0 keeps the max and its ties, as on the CPU)
//   min_p     keep w / total >= min_p * pmax with pmax = 1 / total (the max's w is exp(0) = 1)
//   draw      each thread owns a contiguous segment of the row and sums its kept probabilities in index order;
//             an exclusive block scan gives each segment's starting mass; the thread whose segment crosses
//             u * (kept mass) walks it again (same additions, same order, so the crossing is found) to the first
//             index whose cumulative mass exceeds it; the block takes the smallest such index. None crossing
//             (rounding) gives the last kept token, as on the CPU; nothing kept (min_p > 1) gives the argmax.
// Block-wide values come from reductions in which every thread evaluates the same butterfly over the same shared
// values, so they are bitwise equal in all threads and branches on them are uniform. The top-p histograms are
// deterministic too: each warp sums the masses of its lanes that share a bin in lane order (__match_any_sync and
// shuffles, no floating-point atomics) into its own histogram, and the warps' histograms are added in warp order.
// Loops holding barriers have trip counts that depend on the parameters only.
// Cost: up to 2 + 4 + 1 + 4 + 2 passes over the row (before the radix passes, 2 + 32 + 1 + 32 + 2; the environment
// switch MGRL_RADIX_SAMPLER=0 runs that bit-by-bit search again, for comparison); the softmax, top-p and draw passes
// evaluate a double exp per token (fast on A100/H100/V100, slower on GPUs with weak fp64).
#include <algorithm>
#include <climits>

#include "core/env.h"
#include "core/random.h"
#include "kernels/cuda/sample_select.h"
#include "kernels/cuda/sampling.cuh"

namespace mgrl::kernels::cuda {
namespace {

constexpr int kSampleThreads = 512;  // one block per row

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MinOp {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};
struct MaxOp {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

// Reduction over the whole block (commutative op): every thread gets the same bits. Call from every thread.
// The leading barrier makes back-to-back calls safe (a warp may still be reading buf).
template <class T, class Op>
__device__ T block_reduce(T v, T identity, Op op) {
  __shared__ T buf[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  v = lane < nw ? buf[lane] : identity;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// (value, index) a beats (value, index) b: larger value, then lower index.
__device__ __forceinline__ bool beats(float av, int ai, float bv, int bi) { return av > bv || (av == bv && ai < bi); }

// Argmax over a warp (lowest index on ties); every lane gets the result.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (beats(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// Argmax over the block (lowest index on ties); every thread gets the result. Call from every thread.
__device__ void block_argmax(float& v, int& i) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  warp_argmax(v, i);
  __syncthreads();
  if (lane == 0) {
    bv[warp] = v;
    bi[warp] = i;
  }
  __syncthreads();
  v = lane < nw ? bv[lane] : -INFINITY;
  i = lane < nw ? bi[lane] : INT_MAX;
  warp_argmax(v, i);
}

using sample_select::order_key;

// What decides whether a token survives the filters, and its probability.
struct Filter {
  std::uint32_t kmin;  // keep key >= kmin (top-k and top-p thresholds; 0 keeps all)
  double inv_t;        // 1 / temperature
  double m;            // zmax / temperature
  double total;        // sum of kept exp(z / T - m) after top-k
  bool min_p_on;
  double floor;  // min_p * pmax
};

// exp(z / T - m) as the CPU computes it, without FMA contraction, so every pass gets the same bits.
__device__ __forceinline__ double weight(float z, double inv_t, double m) {
  return exp(__dadd_rn(__dmul_rn(static_cast<double>(z), inv_t), -m));
}

// Whether token (logit z) survives every filter; p gets its probability (softmax after top-k).
__device__ __forceinline__ bool keep_token(float z, const Filter& f, double& p) {
  if (order_key(z) < f.kmin) return false;
  p = weight(z, f.inv_t, f.m) / f.total;
  return !f.min_p_on || p >= f.floor;
}

constexpr int kSampleWarps = kSampleThreads / 32;

// Inclusive scan of v over a block of kThreads threads into scan[kThreads] (Hillis-Steele: a fixed order, the same
// bits every call). Call from every thread; scan[] is complete for every thread on return.
template <int kThreads>
__device__ __forceinline__ void block_scan_inclusive(double* scan, double v) {
  const int tid = threadIdx.x;
  scan[tid] = v;
  __syncthreads();
  for (int off = 1; off < kThreads; off <<= 1) {
    const double x = tid >= off ? scan[tid - off] : 0.0;
    __syncthreads();
    scan[tid] += x;
    __syncthreads();
  }
}

// Top-k by radix selection: the key of the k-th largest logit (1 <= k < V). Call from every thread; every thread
// gets the result. Integer histograms: the order of the shared-memory atomics does not change them.
__device__ std::uint32_t topk_key_radix(const float* z, int V, int k) {
  __shared__ int hist[sample_select::kRadixBins];
  __shared__ std::uint32_t s_prefix;
  __shared__ int s_rank;
  const int tid = threadIdx.x;
  if (tid == 0) {
    s_prefix = 0;
    s_rank = k;
  }
  for (int pass = 0; pass < sample_select::kRadixPasses; ++pass) {
    __syncthreads();  // s_prefix written; the previous pass's pick has read hist
    for (int b = tid; b < sample_select::kRadixBins; b += kSampleThreads) hist[b] = 0;
    __syncthreads();
    const std::uint32_t prefix = s_prefix;
    for (int i = tid; i < V; i += kSampleThreads) {
      const int bin = sample_select::radix_bin(order_key(z[i]), prefix, pass, 0u);
      if (bin >= 0) atomicAdd(&hist[bin], 1);
    }
    __syncthreads();
    if (tid == 0) {
      int rank = s_rank;
      const int digit = sample_select::radix_pick_count(hist, &rank);
      s_rank = rank;
      s_prefix = sample_select::radix_extend(prefix, pass, digit);
    }
  }
  __syncthreads();
  const std::uint32_t key = s_prefix;
  __syncthreads();  // every thread has read s_prefix before a later call writes it
  return key;
}

// Top-p by radix selection: the largest key K with sum over key >= max(K, f.kmin) of p >= top_p, 0 when none
// (f.kmin: top-k's threshold; p = w / total). Call from every thread; every thread gets the result. Each warp adds
// the masses of its lanes that fall in one bin in lane order (deterministic), into its own histogram.
__device__ std::uint32_t topp_key_radix(const float* z, int V, const Filter& f, double top_p) {
  __shared__ double hist[kSampleWarps][sample_select::kRadixBins];
  __shared__ std::uint32_t s_prefix;
  __shared__ double s_above;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    s_prefix = 0;
    s_above = 0.0;
  }
  const int iters = (V + kSampleThreads - 1) / kSampleThreads;
  for (int pass = 0; pass < sample_select::kRadixPasses; ++pass) {
    __syncthreads();  // s_prefix written; the previous pass's pick has read hist
    for (int b = tid; b < kSampleWarps * sample_select::kRadixBins; b += kSampleThreads) (&hist[0][0])[b] = 0.0;
    __syncthreads();
    const std::uint32_t prefix = s_prefix;
    for (int it = 0; it < iters; ++it) {  // the same trip count in every thread: warp-wide calls below
      const int i = it * kSampleThreads + tid;
      int bin = -1;
      double p = 0.0;
      if (i < V) {
        bin = sample_select::radix_bin(order_key(z[i]), prefix, pass, f.kmin);
        if (bin >= 0) p = weight(z[i], f.inv_t, f.m) / f.total;
      }
      if (__ballot_sync(0xffffffffu, bin >= 0) == 0u) continue;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      double sum = 0.0;
      for (int j = 0; j < 32; ++j) {
        const double v = __shfl_sync(0xffffffffu, p, j);
        if ((peers >> j) & 1u) sum += v;
      }
      if (bin >= 0 && lane == __ffs(peers) - 1) hist[warp][bin] += sum;
      __syncwarp();  // this write before another lane's read of the bin in a later iteration
    }
    __syncthreads();
    for (int b = tid; b < sample_select::kRadixBins; b += kSampleThreads) {  // bin b is read and written by one thread
      double s = 0.0;
      for (int w = 0; w < kSampleWarps; ++w) s += hist[w][b];
      hist[0][b] = s;
    }
    __syncthreads();
    if (tid == 0) {
      double above = s_above;
      const int digit = sample_select::radix_pick_mass(hist[0], &above, top_p);
      s_above = above;
      s_prefix = sample_select::radix_extend(prefix, pass, digit);
    }
  }
  __syncthreads();
  const std::uint32_t key = s_prefix;
  __syncthreads();
  return key;
}

// grid.x = B (one row each), kSampleThreads threads.
__global__ void sample_kernel(std::int32_t* tokens, float* logprobs, const float* logits, const std::uint64_t* seeds,
                              int V, float temperature, int top_k, float top_p, float min_p, bool radix) {
  __shared__ double scan[kSampleThreads];
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const int b = blockIdx.x;
  const int tid = threadIdx.x;
  constexpr int nt = kSampleThreads;
  const float* z = logits + static_cast<std::int64_t>(b) * V;

  // Argmax (= row max) and the log-sum-exp of the raw logits.
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int i = tid; i < V; i += nt)
    if (beats(z[i], i, best, best_i)) {
      best = z[i];
      best_i = i;
    }
  block_argmax(best, best_i);
  if (best_i == INT_MAX) best_i = 0;  // only when every logit is NaN
  const double zmax = best;
  double se = 0.0;
  for (int i = tid; i < V; i += nt) se += exp(static_cast<double>(z[i]) - zmax);
  se = block_reduce(se, 0.0, SumOp{});
  const double lse = zmax + log(se);

  int tok = best_i;
  if (!(temperature <= 0.0f)) {
    // top-k: the largest key K with count(key >= K) >= top_k.
    std::uint32_t kk = 0;
    if (top_k > 0 && top_k < V && radix) {
      kk = topk_key_radix(z, V, top_k);
    } else if (top_k > 0 && top_k < V) {
      for (int bit = 31; bit >= 0; --bit) {
        const std::uint32_t cand = kk | (1u << bit);
        int cnt = 0;
        for (int i = tid; i < V; i += nt) cnt += order_key(z[i]) >= cand ? 1 : 0;
        if (block_reduce(cnt, 0, SumOp{}) >= top_k) kk = cand;
      }
    }
    // softmax over the kept tokens.
    Filter f{};
    f.inv_t = 1.0 / static_cast<double>(temperature);
    f.m = __dmul_rn(zmax, f.inv_t);
    if (radix && kk == 0 && f.inv_t == 1.0) {
      f.total = se;  // the same terms (z * 1 - zmax, every token kept), loop and reduction as the lse pass's sum
    } else {
      double total = 0.0;
      for (int i = tid; i < V; i += nt)
        if (order_key(z[i]) >= kk) total += weight(z[i], f.inv_t, f.m);
      f.total = block_reduce(total, 0.0, SumOp{});
    }
    // top-p: the largest key K with sum over key >= max(K, kk) of p >= top_p (K = 0 if none).
    std::uint32_t kp = 0;
    if (top_p < 1.0f && radix) {
      f.kmin = kk;
      kp = topp_key_radix(z, V, f, static_cast<double>(top_p));
      const std::uint32_t kmax = order_key(best);
      if (kp > kmax) kp = kmax;
    } else if (top_p < 1.0f) {
      for (int bit = 31; bit >= 0; --bit) {
        const std::uint32_t cand = kp | (1u << bit);
        const std::uint32_t lo = cand > kk ? cand : kk;
        double mass = 0.0;
        for (int i = tid; i < V; i += nt)
          if (order_key(z[i]) >= lo) mass += weight(z[i], f.inv_t, f.m) / f.total;
        if (block_reduce(mass, 0.0, SumOp{}) >= static_cast<double>(top_p)) kp = cand;
      }
      const std::uint32_t kmax = order_key(best);
      if (kp > kmax) kp = kmax;
    }
    f.kmin = kk > kp ? kk : kp;
    // min-p relative to the max's probability exp(0) / total.
    f.min_p_on = min_p > 0.0f;
    f.floor = static_cast<double>(min_p) * (1.0 / f.total);

    // Inverse CDF in index order over contiguous per-thread segments.
    const int seg = (V + nt - 1) / nt;
    const int lo = tid * seg < V ? tid * seg : V;
    const int hi = lo + seg < V ? lo + seg : V;
    double s = 0.0;
    int last = -1;
    for (int i = lo; i < hi; ++i) {
      double p = 0.0;
      if (keep_token(z[i], f, p)) {
        s += p;
        last = i;
      }
    }
    // Inclusive scan of the segment sums; before = mass of the segments before this one.
    block_scan_inclusive<nt>(scan, s);
    const double before = tid > 0 ? scan[tid - 1] : 0.0;
    const double target = random_uniform(seeds[b], 0) * scan[nt - 1];
    int found = INT_MAX;
    if (before + s > target) {  // the crossing lies in this segment: the same additions again, in the same order
      double c = 0.0;
      for (int i = lo; i < hi; ++i) {
        double p = 0.0;
        if (keep_token(z[i], f, p)) {
          c += p;
          if (before + c > target) {
            found = i;
            break;
          }
        }
      }
    }
    found = block_reduce(found, INT_MAX, MinOp{});
    if (found == INT_MAX) found = block_reduce(last, -1, MaxOp{});  // no crossing: the last kept token
    tok = found >= 0 ? found : best_i;                              // nothing kept: the argmax
  }
  if (tid == 0) {
    tokens[b] = tok;
    logprobs[b] = static_cast<float>(static_cast<double>(z[tok]) - lse);
  }
}

// ---- split rows (MGRL_SAMPLER_SPLIT=1; off by default until measured on a GPU) ----
// One block a row leaves most of the GPU idle below ~132 rows and runs a row's ~150k double exps on one SM (measured
// on an H200, 2026-11-27: 71 us greedy, 257 us at temperature 1, the same from batch 1 to 64). For greedy decoding and
// for temperature sampling without top-k, top-p or min-p (GRPO's default), a row can be cut into G chunks of L
// tokens, each a block of its own, in kernels that exchange a few numbers a chunk through global memory:
//   split_argmax  each chunk's argmax (lowest index on ties);
//   split_sums    the row max (the chunks' argmaxes combined in chunk order, the same in every block), each chunk's
//                 sum of exp(z - zmax) for the log-sum-exp and, at temperature != 1, its sum of the softmax weights;
//   split_mass    each chunk's kept mass (every token is kept without filters) by contiguous thread segments and a
//                 block scan, exactly as sample_kernel's draw: the scan's total is the chunk's mass;
//   split_draw    every block recomputes the same segment sums and scan, adds the chunks' masses before it (in chunk
//                 order) and walks its segments to the first index whose cumulative mass exceeds u * (row mass), as
//                 sample_kernel does: the row takes the smallest index found (the chunks after the crossing find
//                 their first token), the last token when none crosses (rounding), as on the CPU;
//   split_finish  per row: the token (or the argmax), its log-prob against zmax + log(sum of the chunks' sums).
// Row-level values are sums over the chunks in chunk order, the same bits in every block and every call. The tokens
// are the canonical algorithm's, as sample_kernel's are (the masses are the same doubles, added in another order).
constexpr int kSplitThreads = 256;
constexpr int kSplitMinChunk = 2048;  // tokens a chunk at least (8 a thread)

// The row's (max, argmax) from its chunks' partials, in chunk order.
__device__ __forceinline__ void row_argmax(const float* pv, const int* pi, int G, float& v, int& i) {
  v = -INFINITY;
  i = INT_MAX;
  for (int c = 0; c < G; ++c)
    if (beats(pv[c], pi[c], v, i)) {
      v = pv[c];
      i = pi[c];
    }
}

__device__ __forceinline__ double ordered_sum(const double* a, int n) {
  double s = 0.0;
  for (int c = 0; c < n; ++c) s += a[c];
  return s;
}

// grid (G, B)
__global__ void __launch_bounds__(kSplitThreads) split_argmax_kernel(float* pv, int* pi, const float* logits, int V,
                                                                     int L, int G) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const int c = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const float* z = logits + static_cast<std::int64_t>(b) * V;
  const int lo = c * L, hi = min(V, lo + L);
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int i = lo + tid; i < hi; i += kSplitThreads)
    if (beats(z[i], i, best, best_i)) {
      best = z[i];
      best_i = i;
    }
  block_argmax(best, best_i);
  if (tid == 0) {
    pv[b * G + c] = best;
    pi[b * G + c] = best_i;
  }
}

// grid (G, B): pse = sum exp(z - zmax) of the chunk; ptot (when inv_t != 1) = sum of weight(z, inv_t, zmax * inv_t).
__global__ void __launch_bounds__(kSplitThreads) split_sums_kernel(double* pse, double* ptot, const float* pv,
                                                                   const int* pi, const float* logits, int V, int L,
                                                                   int G, double inv_t, bool weights) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const int c = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const float* z = logits + static_cast<std::int64_t>(b) * V;
  const int lo = c * L, hi = min(V, lo + L);
  float vmax;
  int imax;
  row_argmax(pv + b * G, pi + b * G, G, vmax, imax);
  const double zmax = vmax;
  double se = 0.0;
  for (int i = lo + tid; i < hi; i += kSplitThreads) se += exp(static_cast<double>(z[i]) - zmax);
  se = block_reduce(se, 0.0, SumOp{});
  double tot = 0.0;
  if (weights) {
    const double m = __dmul_rn(zmax, inv_t);
    for (int i = lo + tid; i < hi; i += kSplitThreads) tot += weight(z[i], inv_t, m);
    tot = block_reduce(tot, 0.0, SumOp{});
  }
  if (tid == 0) {
    pse[b * G + c] = se;
    if (weights) ptot[b * G + c] = tot;
  }
}

// The chunk's contiguous thread segments: each thread's sum of p = w / total in index order (s) and the block's
// inclusive scan of those sums in scan[] (Hillis-Steele, as sample_kernel's draw). Call from every thread.
__device__ __forceinline__ double split_segments(double* scan, const float* z, int lo, int hi, double inv_t, double m,
                                                 double total, int& seg_lo, int& seg_hi) {
  const int tid = threadIdx.x;
  const int seg = (hi - lo + kSplitThreads - 1) / kSplitThreads;
  seg_lo = min(hi, lo + tid * seg);
  seg_hi = min(hi, seg_lo + seg);
  double s = 0.0;
  for (int i = seg_lo; i < seg_hi; ++i) s += weight(z[i], inv_t, m) / total;
  __syncthreads();  // a previous use of scan[] is over
  block_scan_inclusive<kSplitThreads>(scan, s);
  return s;
}

// The row's softmax: m = zmax * inv_t and the total of the weights (the log-sum-exp's sums at temperature 1).
__device__ __forceinline__ void split_softmax(const float* pv, const int* pi, const double* pse, const double* ptot,
                                              int G, double inv_t, double& m, double& total) {
  float vmax;
  int imax;
  row_argmax(pv, pi, G, vmax, imax);
  m = __dmul_rn(static_cast<double>(vmax), inv_t);
  total = inv_t == 1.0 ? ordered_sum(pse, G) : ordered_sum(ptot, G);
}

// grid (G, B): pm = the chunk's kept mass (its scan's total).
__global__ void __launch_bounds__(kSplitThreads) split_mass_kernel(double* pm, const float* pv, const int* pi,
                                                                   const double* pse, const double* ptot,
                                                                   const float* logits, int V, int L, int G,
                                                                   double inv_t) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  __shared__ double scan[kSplitThreads];
  const int c = blockIdx.x, b = blockIdx.y;
  const float* z = logits + static_cast<std::int64_t>(b) * V;
  double m, total;
  split_softmax(pv + b * G, pi + b * G, pse + b * G, ptot + b * G, G, inv_t, m, total);
  int seg_lo, seg_hi;
  split_segments(scan, z, c * L, min(V, c * L + L), inv_t, m, total, seg_lo, seg_hi);
  if (threadIdx.x == 0) pm[b * G + c] = scan[kSplitThreads - 1];
}

// grid (G, B): pf = the first index of the chunk whose cumulative mass exceeds the target (INT_MAX: none).
__global__ void __launch_bounds__(kSplitThreads) split_draw_kernel(int* pf, const double* pm, const float* pv,
                                                                   const int* pi, const double* pse,
                                                                   const double* ptot, const float* logits,
                                                                   const std::uint64_t* seeds, int V, int L, int G,
                                                                   double inv_t) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  __shared__ double scan[kSplitThreads];
  const int c = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const float* z = logits + static_cast<std::int64_t>(b) * V;
  double m, total;
  split_softmax(pv + b * G, pi + b * G, pse + b * G, ptot + b * G, G, inv_t, m, total);
  int seg_lo, seg_hi;
  const double s = split_segments(scan, z, c * L, min(V, c * L + L), inv_t, m, total, seg_lo, seg_hi);
  const double* row_pm = pm + b * G;
  const double before_chunk = ordered_sum(row_pm, c);
  const double target = random_uniform(seeds[b], 0) * ordered_sum(row_pm, G);
  const double before = before_chunk + (tid > 0 ? scan[tid - 1] : 0.0);
  int found = INT_MAX;
  if (before + s > target) {  // the crossing lies in this segment or before it: walk it with the same additions
    double acc = 0.0;
    for (int i = seg_lo; i < seg_hi; ++i) {
      acc += weight(z[i], inv_t, m) / total;
      if (before + acc > target) {
        found = i;
        break;
      }
    }
  }
  found = block_reduce(found, INT_MAX, MinOp{});
  if (tid == 0) pf[b * G + c] = found;
}

// grid ceil(B / 128) x 128 threads: one row a thread.
__global__ void split_finish_kernel(std::int32_t* tokens, float* logprobs, const float* logits, const float* pv,
                                    const int* pi, const double* pse, const int* pf, int V, int G, int B, bool greedy) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const int b = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (b >= B) return;
  float vmax;
  int imax;
  row_argmax(pv + b * G, pi + b * G, G, vmax, imax);
  if (imax == INT_MAX) imax = 0;  // only when every logit is NaN
  const double lse = static_cast<double>(vmax) + log(ordered_sum(pse + b * G, G));
  int tok = imax;
  if (!greedy) {
    int found = INT_MAX;
    for (int c = 0; c < G; ++c) found = min(found, pf[b * G + c]);
    tok = found != INT_MAX ? found : V - 1;  // no crossing (rounding): the last kept token, every token being kept
  }
  const float* z = logits + static_cast<std::int64_t>(b) * V;
  tokens[b] = tok;
  logprobs[b] = static_cast<float>(static_cast<double>(z[tok]) - lse);
}

// Chunks a row gets on the split path (1: the one-block kernel): enough blocks for ~4 per SM, chunks of at least
// kSplitMinChunk tokens.
int split_chunks(int B, int V) {
  const std::int64_t want = (4 * static_cast<std::int64_t>(sm_count()) + B - 1) / B;
  const std::int64_t most = (static_cast<std::int64_t>(V) + kSplitMinChunk - 1) / kSplitMinChunk;
  return static_cast<int>(std::max<std::int64_t>(1, std::min(want, most)));
}

void sample_split(const Ctx& c, std::int32_t* tokens, float* logprobs, const float* logits,
                  const std::uint64_t* seeds, int B, int V, int G, float temperature) {
  const int L = (V + G - 1) / G;
  const std::size_t n = static_cast<std::size_t>(B) * G;
  // One scratch block: doubles first (pse, ptot, pm), then floats and ints (pv, pi, pf).
  char* base = static_cast<char*>(scratch_alloc(n * (3 * sizeof(double) + sizeof(float) + 2 * sizeof(int)), c.stream));
  auto* pse = reinterpret_cast<double*>(base);
  double* ptot = pse + n;
  double* pm = ptot + n;
  auto* pv = reinterpret_cast<float*>(pm + n);
  auto* pi = reinterpret_cast<int*>(pv + n);
  int* pf = pi + n;
  const bool greedy = temperature <= 0.0f;
  const double inv_t = greedy ? 1.0 : 1.0 / static_cast<double>(temperature);
  const dim3 grid(static_cast<unsigned>(G), static_cast<unsigned>(B));
  const bool pdl = pdl_enabled();
  launch(pdl, split_argmax_kernel, grid, kSplitThreads, 0, c.stream, pv, pi, logits, V, L, G);
  launch(pdl, split_sums_kernel, grid, kSplitThreads, 0, c.stream, pse, ptot, pv, pi, logits, V, L, G, inv_t,
         !greedy && inv_t != 1.0);
  if (!greedy) {
    launch(pdl, split_mass_kernel, grid, kSplitThreads, 0, c.stream, pm, pv, pi, pse, ptot, logits, V, L, G, inv_t);
    launch(pdl, split_draw_kernel, grid, kSplitThreads, 0, c.stream, pf, pm, pv, pi, pse, ptot, logits, seeds, V, L, G,
           inv_t);
  }
  constexpr int kRows = 128;
  launch(pdl, split_finish_kernel, static_cast<unsigned>((B + kRows - 1) / kRows), kRows, 0, c.stream, tokens,
         logprobs, logits, pv, pi, pse, pf, V, G, B, greedy);
  scratch_free(base, c.stream);
}

// MGRL_SAMPLER_SPLIT=1 turns the split path on (off by default until a GPU has measured it).
bool split_on() {
  static const bool on = env::opt_in_logged(
      "MGRL_SAMPLER_SPLIT", "MGRL_SAMPLER_SPLIT=1: greedy and unfiltered sampling with rows cut into chunks");
  return on;
}

}  // namespace

void sample(const Ctx& c, std::int32_t* tokens, float* logprobs, const float* logits, const std::uint64_t* seeds, int B,
            int V, const Ops::Sampling& params) {
  MGRL_CHECK(B >= 0, "sample: negative batch");
  if (B == 0) return;
  MGRL_CHECK(V > 0, "sample: empty vocabulary");
  static const bool radix = env::switch_on("MGRL_RADIX_SAMPLER");
  // Greedy, or temperature without top-k, top-p and min-p: rows cut into chunks when the batch leaves SMs idle.
  const bool filters = (params.top_k > 0 && params.top_k < V) || params.top_p < 1.0f || params.min_p > 0.0f;
  if (split_on() && (params.temperature <= 0.0f || !filters)) {
    const int G = split_chunks(B, V);
    if (G >= 2) {
      sample_split(c, tokens, logprobs, logits, seeds, B, V, G, params.temperature);
      return;
    }
  }
  launch(pdl_enabled(), sample_kernel, static_cast<unsigned>(B), kSampleThreads, 0, c.stream, tokens, logprobs, logits,
         seeds, V, params.temperature, params.top_k, params.top_p, params.min_p, radix);
}

namespace {
__global__ void decode_advance_kernel(std::int32_t* ids, std::int32_t* pos, std::int32_t* count, std::int32_t* done,
                                      std::uint64_t* seeds, std::int32_t* ring_tokens, float* ring_logprobs,
                                      const std::int32_t* tokens, const float* logprobs, const std::uint64_t* streams,
                                      const std::int32_t* eos, int n_eos, int max_count, int R) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= R) return;
  const std::int32_t tok = tokens[r];
  ring_tokens[r] = tok;
  ring_logprobs[r] = logprobs[r];
  if (done[r]) return;
  const int n = ++count[r];
  bool stop = n >= max_count;
  for (int e = 0; e < n_eos && !stop; ++e) stop = tok == eos[e];
  if (stop) {
    done[r] = 1;
    return;
  }
  ids[r] = tok;
  pos[r] += 1;
  seeds[r] = random_bits(streams[r], static_cast<std::uint64_t>(n));
}
}  // namespace

void decode_advance(const Ctx& c, std::int32_t* ids, std::int32_t* pos, std::int32_t* count, std::int32_t* done,
                    std::uint64_t* seeds, std::int32_t* ring_tokens, float* ring_logprobs, const std::int32_t* tokens,
                    const float* logprobs, const std::uint64_t* streams, const std::int32_t* eos, int n_eos,
                    int max_count, int R) {
  MGRL_CHECK(R >= 0 && n_eos >= 0, "decode_advance: negative size");
  if (R == 0) return;
  constexpr int kThreads = 128;
  launch(pdl_enabled(), decode_advance_kernel, static_cast<unsigned>((R + kThreads - 1) / kThreads), kThreads, 0,
         c.stream, ids, pos, count, done, seeds, ring_tokens, ring_logprobs, tokens, logprobs, streams, eos, n_eos,
         max_count, R);
}

namespace {
// grid (ceil(V / 256), R) x 256: one logit a thread.
__global__ void repetition_penalty_kernel(float* out, const float* logits, const std::uint8_t* seen,
                                          const std::int32_t* seen_row, int V, float penalty) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const int v = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (v >= V) return;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.y) * V + v;
  const float z = logits[i];
  // IEEE multiply and divide (no fast-math in this build), as the CPU's and transformers' f32 ones
  out[i] = seen[static_cast<std::int64_t>(seen_row[blockIdx.y]) * V + v] ? (z < 0.0f ? z * penalty : z / penalty) : z;
}

// ceil(R / 128) x 128: one row a thread.
__global__ void mark_seen_kernel(std::uint8_t* seen, const std::int32_t* seen_row, const std::int32_t* tokens, int R,
                                 int V) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= R) return;
  seen[static_cast<std::int64_t>(seen_row[r]) * V + tokens[r]] = 1;
}

struct DoubleMaxOp {
  __device__ double operator()(double a, double b) const { return a > b ? a : b; }
};

// One block of kSampleThreads per row: the row's max, then the sum of exp(z - max) in double.
__global__ void __launch_bounds__(kSampleThreads) token_logprobs_kernel(float* logprobs, const float* logits,
                                                                        const std::int32_t* tokens, int V) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  const float* z = logits + static_cast<std::int64_t>(blockIdx.x) * V;
  double m = -INFINITY;
  for (int i = static_cast<int>(threadIdx.x); i < V; i += blockDim.x) m = fmax(m, static_cast<double>(z[i]));
  m = block_reduce(m, -static_cast<double>(INFINITY), DoubleMaxOp{});
  double sum = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < V; i += blockDim.x) sum += exp(static_cast<double>(z[i]) - m);
  sum = block_reduce(sum, 0.0, SumOp{});
  if (threadIdx.x == 0) logprobs[blockIdx.x] = static_cast<float>(static_cast<double>(z[tokens[blockIdx.x]]) - (m + log(sum)));
}
}  // namespace

void repetition_penalty(const Ctx& c, float* out, const float* logits, const std::uint8_t* seen,
                        const std::int32_t* seen_row, int R, int V, float penalty) {
  MGRL_CHECK(R >= 0 && R <= 65535 && V > 0, "repetition_penalty: bad shape");
  if (R == 0) return;
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>((V + kThreads - 1) / kThreads), static_cast<unsigned>(R));
  launch(pdl_enabled(), repetition_penalty_kernel, grid, kThreads, 0, c.stream, out, logits, seen, seen_row, V,
         penalty);
}

void mark_seen(const Ctx& c, std::uint8_t* seen, const std::int32_t* seen_row, const std::int32_t* tokens, int R,
               int V) {
  MGRL_CHECK(R >= 0, "mark_seen: negative size");
  if (R == 0) return;
  constexpr int kThreads = 128;
  launch(pdl_enabled(), mark_seen_kernel, static_cast<unsigned>((R + kThreads - 1) / kThreads), kThreads, 0, c.stream,
         seen, seen_row, tokens, R, V);
}

void token_logprobs(const Ctx& c, float* logprobs, const float* logits, const std::int32_t* tokens, int R, int V) {
  MGRL_CHECK(R >= 0 && V > 0, "token_logprobs: bad shape");
  if (R == 0) return;
  launch(pdl_enabled(), token_logprobs_kernel, static_cast<unsigned>(R), kSampleThreads, 0, c.stream, logprobs, logits,
         tokens, V);
}

}  // namespace mgrl::kernels::cuda
