// bench_gemv.cu: the decode step's fused inference ops on the CUDA backend against the separate ops they replace, at
// Qwen2.5-0.5B's and 7B's shapes and T = 1, 2, 4, 8 rows (the decode batch): q|k|v with biases
// (Ops::linear_group_forward: the GEMV kernel against three cuBLAS(Lt) calls), gate|up + SwiGLU
// (Ops::gated_mlp_forward: against two GEMMs + swiglu), down + residual (Ops::linear_residual_forward: against a GEMM
// + residual_add). Microseconds a call (the mean of 20 calls back to back, as the recorded decode step runs them;
// median of reps) and the bandwidth each reaches (the weight bytes it must read / time), beside a device-to-device
// copy of the same bytes; and RoPE + KV store (Ops::rope_kv_store) against rope, rope, kv_store at T = 1 and 8.
//   build/perf/bench_gemv [reps]      (default 20 timed runs after 2 warm-up runs)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemv.cuh"
#include "kernels/ops.h"
#include "perf/cuda_timing.cuh"

namespace {

using namespace mgrl;
using kernels::Ops;

struct Shape {
  const char* name;
  int D, q, kv, I, heads, kv_heads, head_dim;
};

constexpr int kBackToBack = 20;  // calls a timed run makes, as a graph replays a step's kernels back to back

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  if (!perf::have_cuda_device("bench_gemv")) return 77;
  auto ops = kernels::make_cuda_ops(0);
  cudaStream_t s = static_cast<cudaStream_t>(ops->device_stream().cuda);
  const std::size_t S = ops->storage_size();
  const Shape shapes[] = {{"0.5B", 896, 896, 128, 4864, 14, 2, 64}, {"7B", 3584, 3584, 512, 18944, 28, 4, 128}};
  std::printf("decode GEMV ops, %s storage, us a call (%d calls back to back, median of %d); GB/s = weight bytes / "
              "time; 'sep' = the separate ops the fused one replaces\n",
              dtype_name(ops->storage()), kBackToBack, reps);
  std::printf("%-5s %2s | %-9s %8s %7s | %8s %7s | %7s | %s\n", "shape", "T", "op", "fused us", "GB/s", "sep us",
              "GB/s", "speedup", "copy of the weights: us, GB/s");
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
  const auto filled = [&](std::size_t n) {
    std::vector<float> h(n);
    for (auto& v : h) v = dist(gen);
    void* p = ops->alloc(n * S);
    ops->upload_f32_as_storage(p, h.data(), n);
    return p;
  };
  const auto us = [&](const std::function<void()>& f) {
    return perf::time_ms(s, reps, [&] {
             for (int i = 0; i < kBackToBack; ++i) f();
           }) * 1e3 / kBackToBack;
  };
  for (const Shape& sh : shapes) {
    const int D = sh.D, I = sh.I, Tmax = 8;
    const std::size_t nq = static_cast<std::size_t>(sh.q) * D, nkv = static_cast<std::size_t>(sh.kv) * D;
    const std::size_t nI = static_cast<std::size_t>(I) * D;
    void *Wq = filled(nq), *Wk = filled(nkv), *Wv = filled(nkv), *bq = filled(sh.q), *bk = filled(sh.kv),
         *bv = filled(sh.kv), *Wg = filled(nI), *Wu = filled(nI), *Wd = filled(nI);
    void *x = filled(static_cast<std::size_t>(Tmax) * I), *r = filled(static_cast<std::size_t>(Tmax) * D);
    void *yq = filled(static_cast<std::size_t>(Tmax) * sh.q), *yk = filled(static_cast<std::size_t>(Tmax) * sh.kv),
         *yv = filled(static_cast<std::size_t>(Tmax) * sh.kv);
    void *gate = filled(static_cast<std::size_t>(Tmax) * I), *up = filled(static_cast<std::size_t>(Tmax) * I),
         *act = filled(static_cast<std::size_t>(Tmax) * I), *tmp = filled(static_cast<std::size_t>(Tmax) * D);
    // The copy reference reads and writes as many bytes as the widest row (gate|up: 2 nI elements).
    void *copy_src = filled(2 * nI), *copy_dst = ops->alloc(2 * nI * S);
    ops->synchronize();
    const Ops::LinearMember qkv[] = {{yq, Wq, bq, sh.q}, {yk, Wk, bk, sh.kv}, {yv, Wv, bv, sh.kv}};
    for (const int T : {1, 2, 4, 8}) {
      struct Row {
        const char* op;
        std::size_t bytes;  // weights read
        std::function<void()> fused, separate;
      };
      const Row rows[] = {
          {"q|k|v+b", (nq + 2 * nkv) * S, [&] { ops->linear_group_forward(qkv, 3, x, T, D); },
           [&] { ops->Ops::linear_group_forward(qkv, 3, x, T, D); }},
          {"gate|up", 2 * nI * S, [&] { ops->gated_mlp_forward(act, gate, up, x, Wg, Wu, T, D, I, false); },
           [&] { ops->Ops::gated_mlp_forward(act, gate, up, x, Wg, Wu, T, D, I, false); }},
          {"down+res", nI * S, [&] { ops->linear_residual_forward(r, r, x, Wd, T, I, D, tmp); },
           [&] { ops->Ops::linear_residual_forward(r, r, x, Wd, T, I, D, tmp); }},
      };
      for (const Row& row : rows) {
        const double f = us(row.fused), p = us(row.separate);
        const double c = us([&] { ops->copy(copy_dst, copy_src, row.bytes); });
        const double gb = static_cast<double>(row.bytes) / 1e3;  // bytes / us = MB/s; / 1e3 = GB/s
        // The fused op's own size rule (kernels/cuda/gemv.cuh) sends large weights at T > 2 to cuBLAS.
        const bool to_cublas = !kernels::cuda::gemv_size_ok(T, static_cast<std::int64_t>(row.bytes));
        std::printf("%-5s %2d | %-9s %8.2f %7.0f | %8.2f %7.0f | %6.2fx | %.2f, %.0f%s\n", sh.name, T, row.op, f, gb / f,
                    p, gb / p, p / f, c, 2.0 * gb / c, to_cublas ? "  (fused op on cuBLAS: gemv.cuh's size rule)" : "");
      }
    }
    // RoPE + KV store against the three ops, one decode row per sequence at position 1000 of its own slot.
    {
      const int T = 8, bs = 16, per_slot = 128, hd = sh.head_dim;
      std::vector<std::int32_t> table_h(static_cast<std::size_t>(T) * per_slot), slot_h(T), pos_h(T, 1000);
      std::iota(table_h.begin(), table_h.end(), 0);
      std::iota(slot_h.begin(), slot_h.end(), 0);
      std::vector<float> inv(static_cast<std::size_t>(hd / 2));
      for (int j = 0; j < hd / 2; ++j) inv[static_cast<std::size_t>(j)] = std::pow(1e6f, -2.0f * j / hd);
      auto* table = static_cast<std::int32_t*>(ops->alloc(table_h.size() * 4));
      auto* slot = static_cast<std::int32_t*>(ops->alloc(T * 4));
      auto* pos = static_cast<std::int32_t*>(ops->alloc(T * 4));
      auto* f = static_cast<float*>(ops->alloc(inv.size() * 4));
      ops->upload(table, table_h.data(), table_h.size() * 4);
      ops->upload(slot, slot_h.data(), T * 4);
      ops->upload(pos, pos_h.data(), T * 4);
      ops->upload(f, inv.data(), inv.size() * 4);
      const int n_blocks = T * per_slot;
      const kernels::KvPages pages{table, T, per_slot, bs, n_blocks};
      const std::size_t pool = static_cast<std::size_t>(n_blocks) * bs * sh.kv;
      void *ck = ops->alloc(pool * S), *cv = ops->alloc(pool * S);
      for (const int t : {1, 8}) {
        const double fused = us([&] {
          ops->rope_kv_store(yq, yk, yv, ck, cv, slot, pos, f, t, pages, sh.heads, sh.kv_heads, hd);
        });
        const double sep = us([&] { ops->Ops::rope_kv_store(yq, yk, yv, ck, cv, slot, pos, f, t, pages, sh.heads,
                                                            sh.kv_heads, hd); });
        std::printf("%-5s %2d | %-9s %8.2f %7s | %8.2f %7s | %6.2fx |\n", sh.name, t, "rope+kv", fused, "-", sep, "-",
                    sep / fused);
      }
      for (void* p : {static_cast<void*>(table), static_cast<void*>(slot), static_cast<void*>(pos),
                      static_cast<void*>(f), ck, cv})
        ops->release(p);
    }
    for (void* p : {Wq, Wk, Wv, bq, bk, bv, Wg, Wu, Wd, x, r, yq, yk, yv, gate, up, act, tmp, copy_src, copy_dst})
      ops->release(p);
  }
  return 0;
}
