// bench_norm.cu: the CUDA RMSNorm kernels at the row widths of the supported models: forward, backward dx (accumulating,
// as the decoder block's backward calls it), the residual add fused into the forward, and the three ops it replaces
// (copy + residual add + norm); ms per call and the bandwidth each reaches (bytes it must move / time), beside a
// device-to-device copy of the same [rows, dim] tensor. Run it as built and with MGRL_FUSED_NORM=0 (the kernels of
// before; the fused op then runs as two passes) to compare.
//   build/perf/bench_norm [reps] [tokens]      (default 20 timed calls after 2 warm-up calls, median; 8192 tokens)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/env.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "perf/cuda_timing.cuh"

namespace {

using namespace mgrl;
using mgrl::perf::time_ms;

struct Shape {
  const char* name;
  int rows_per_token, dim;  // per-head norms: one row per head
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int tokens = argc > 2 ? std::atoi(argv[2]) : 8192;
  if (!perf::have_cuda_device("bench_norm")) return 77;
  auto ops = kernels::make_cuda_ops(0);
  cudaStream_t s = static_cast<cudaStream_t>(ops->device_stream().cuda);
  const Shape shapes[] = {{"head 64 x 14", 14, 64},  {"head 128 x 32", 32, 128}, {"hidden 896", 1, 896},
                          {"hidden 1536", 1, 1536}, {"hidden 2048", 1, 2048},   {"hidden 3584", 1, 3584},
                          {"hidden 4096", 1, 4096}, {"hidden 5120", 1, 5120},   {"hidden 8192", 1, 8192},
                          {"odd 100 x 16", 16, 100}};
  std::printf("RMSNorm, %s storage, %d tokens, median of %d; MGRL_FUSED_NORM %s; GB/s = bytes the op must move / time\n",
              dtype_name(ops->storage()), tokens, reps, env::switch_on("MGRL_FUSED_NORM") ? "on" : "0 (kernels of before)");
  std::printf("%-14s %8s %5s | %8s %7s | %8s %7s | %8s %7s | %8s %7s | %7s\n", "shape", "rows", "dim", "fwd ms", "GB/s",
              "dx ms", "GB/s", "res+nrm", "GB/s", "3 ops ms", "GB/s", "copy GB/s");
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const Shape& sh : shapes) {
    const int rows = tokens * sh.rows_per_token, dim = sh.dim;
    const std::size_t n = static_cast<std::size_t>(rows) * dim, bytes = n * ops->storage_size();
    std::vector<float> host(n);
    for (auto& v : host) v = dist(gen);
    std::vector<float> wh(static_cast<std::size_t>(dim), 1.0f);
    void *x = ops->alloc(bytes), *y = ops->alloc(bytes), *o = ops->alloc(bytes), *h = ops->alloc(bytes),
         *d = ops->alloc(bytes), *w = ops->alloc(static_cast<std::size_t>(dim) * ops->storage_size());
    auto* rstd = static_cast<float*>(ops->alloc(static_cast<std::size_t>(rows) * 4));
    ops->upload_f32_as_storage(x, host.data(), n);
    ops->upload_f32_as_storage(y, host.data(), n);
    ops->upload_f32_as_storage(d, host.data(), n);
    ops->upload_f32_as_storage(w, wh.data(), wh.size());
    ops->synchronize();
    const double gb = static_cast<double>(bytes) / 1e9;  // one [rows, dim] tensor
    const double fwd = time_ms(s, reps, [&] { ops->rmsnorm_forward(h, rstd, x, w, rows, dim, 1e-6f); });
    const double dx =
        time_ms(s, reps, [&] { ops->rmsnorm_backward(o, nullptr, d, x, w, rstd, rows, dim, true); });
    const double fused =
        time_ms(s, reps, [&] { ops->residual_rmsnorm_forward(o, h, rstd, x, y, w, rows, dim, 1e-6f); });
    const double three = time_ms(s, reps, [&] {
      ops->copy(o, x, bytes);
      ops->residual_forward(o, y, static_cast<std::int64_t>(n));
      ops->rmsnorm_forward(h, rstd, o, w, rows, dim, 1e-6f);
    });
    const double copy = time_ms(s, reps, [&] { ops->copy(o, x, bytes); });
    // Bytes: forward reads x, writes h (2 tensors); dx reads dout, x, dx and writes dx (4); the fused op reads x_in, y
    // and writes x_out, h (4); the three ops move 2 + 3 + 2 = 7; the copy 2.
    std::printf("%-14s %8d %5d | %8.4f %7.0f | %8.4f %7.0f | %8.4f %7.0f | %8.4f %7.0f | %7.0f\n", sh.name, rows, dim,
                fwd, 2 * gb / fwd * 1e3, dx, 4 * gb / dx * 1e3, fused, 4 * gb / fused * 1e3, three,
                7 * gb / three * 1e3, 2 * gb / copy * 1e3);
    for (void* p : {x, y, o, h, d, w, static_cast<void*>(rstd)}) ops->release(p);
  }
  // Decoding: one row of the 0.5B shape (batch 1), where a launch's latency is what counts.
  {
    const int dim = 896;
    const std::size_t bytes = static_cast<std::size_t>(dim) * ops->storage_size();
    void *x = ops->alloc(bytes), *y = ops->alloc(bytes), *h = ops->alloc(bytes), *w = ops->alloc(bytes);
    auto* rstd = static_cast<float*>(ops->alloc(4));
    const double fwd = time_ms(s, reps, [&] {
      for (int i = 0; i < 100; ++i) ops->rmsnorm_forward(h, rstd, x, w, 1, dim, 1e-6f);
    });
    const double fused = time_ms(s, reps, [&] {
      for (int i = 0; i < 100; ++i) ops->residual_rmsnorm_forward(x, h, rstd, x, y, w, 1, dim, 1e-6f);
    });
    std::printf("decode, 1 row of 896, 100 calls back to back: norm %.2f us a call, residual + norm %.2f us a call\n",
                fwd * 10.0, fused * 10.0);
    for (void* p : {x, y, h, w, static_cast<void*>(rstd)}) ops->release(p);
  }
  return 0;
}
