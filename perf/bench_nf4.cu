// bench_nf4.cu: the NF4 (QLoRA) linear layer as mgrl runs it on the GPU, dequantize into a bf16/fp16 workspace
// then the cuBLAS GEMM, against the dense GEMM alone, at Llama-7B/70B projection shapes; prints ms per call, the
// dequantization's own time and bandwidth, and the NF4 layer's speed as a fraction of the dense layer's (the issue's
// target: >= 0.70 at the 7B shapes). Both plain and double-quantized absmax.
//   build/perf/bench_nf4 [tokens] [reps]      (default 2048 tokens, 20 timed calls after 2 warm-up calls; median)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "perf/cuda_timing.cuh"
#include "kernels/cpu/nf4.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

namespace {

using namespace mgrl;
namespace cpu = mgrl::kernels::cpu;

using mgrl::perf::time_ms;

struct Proj {
  const char* name;
  int in, out;
};

}  // namespace

int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  if (!perf::have_cuda_device("bench_nf4")) return 77;
  auto ops = kernels::make_cuda_ops(0);
  cudaStream_t s = static_cast<cudaStream_t>(ops->device_stream().cuda);
  const Proj shapes[] = {{"7B q/k/v/o", 4096, 4096}, {"7B gate/up", 4096, 11008}, {"7B down", 11008, 4096},
                         {"70B q/o", 8192, 8192},   {"70B k/v", 8192, 1024},    {"70B gate/up", 8192, 28672},
                         {"70B down", 28672, 8192}};
  std::printf("NF4 linear (dequantize into a workspace + cuBLAS) vs dense, %s storage, T = %d tokens, median of %d\n",
              dtype_name(ops->storage()), T, reps);
  std::printf("%-12s %7s %7s | %9s %9s %9s %8s | %9s %8s\n", "shape", "in", "out", "dense ms", "dequant", "nf4 ms",
              "nf4/dns", "dq (dbl)", "GB/s");
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (const Proj& p : shapes) {
    const std::int64_t n = static_cast<std::int64_t>(p.in) * p.out;
    std::vector<float> w(static_cast<std::size_t>(n));
    for (auto& v : w) v = dist(gen);
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(cpu::nf4_code_bytes(n)));
    std::vector<float> absmax(static_cast<std::size_t>(cpu::nf4_blocks(n)));
    cpu::nf4_quantize(w.data(), n, codes.data(), absmax.data());
    std::vector<std::uint8_t> q(absmax.size());
    std::vector<float> nested(static_cast<std::size_t>(cpu::nf4_nested_blocks(n)));
    float offset = 0;
    cpu::nf4_double_quantize(absmax.data(), static_cast<std::int64_t>(absmax.size()), q.data(), nested.data(),
                             &offset);
    auto up = [&](const void* host, std::size_t bytes) {
      void* d = ops->alloc(bytes);
      ops->upload(d, host, bytes);
      return d;
    };
    void* d_codes = up(codes.data(), codes.size());
    void* d_absmax = up(absmax.data(), absmax.size() * 4);
    void* d_q = up(q.data(), q.size());
    void* d_nested = up(nested.data(), nested.size() * 4);
    void* d_code = up(cpu::nf4_code(), 16 * 4);
    void* d_dyn = up(cpu::dynamic_code(), 256 * 4);
    void* W = ops->alloc(static_cast<std::size_t>(n) * ops->storage_size());
    ops->upload_f32_as_storage(W, w.data(), w.size());
    void* x = ops->alloc(static_cast<std::size_t>(T) * p.in * ops->storage_size());
    void* y = ops->alloc(static_cast<std::size_t>(T) * p.out * ops->storage_size());
    void* work = ops->alloc(static_cast<std::size_t>(n) * ops->storage_size());
    kernels::Nf4Weight plain, dbl;
    plain.codes = dbl.codes = static_cast<const std::uint8_t*>(d_codes);
    plain.code = dbl.code = static_cast<const float*>(d_code);
    plain.absmax = static_cast<const float*>(d_absmax);
    dbl.qabsmax = static_cast<const std::uint8_t*>(d_q);
    dbl.nested_absmax = static_cast<const float*>(d_nested);
    dbl.nested_code = static_cast<const float*>(d_dyn);
    dbl.offset = offset;
    const double dense = time_ms(s, reps, [&] { ops->linear_forward(y, x, W, nullptr, T, p.in, p.out); });
    const double dq = time_ms(s, reps, [&] { ops->dequantize_nf4(work, plain, 0, n); });
    const double dq2 = time_ms(s, reps, [&] { ops->dequantize_nf4(work, dbl, 0, n); });
    const double nf4 = time_ms(s, reps, [&] {
      ops->dequantize_nf4(work, dbl, 0, n);
      ops->linear_forward(y, x, work, nullptr, T, p.in, p.out);
    });
    const double bytes = static_cast<double>(n) / 2 + static_cast<double>(n) * ops->storage_size();
    std::printf("%-12s %7d %7d | %9.3f %9.3f %9.3f %8.2f | %9.3f %8.0f\n", p.name, p.in, p.out, dense, dq, nf4,
                dense / nf4, dq2, bytes / (dq * 1e-3) / 1e9);
    for (void* b : {d_codes, d_absmax, d_q, d_nested, d_code, d_dyn, W, x, y, work}) ops->release(b);
  }
  return 0;
}
