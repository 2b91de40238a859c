// bench_sample.cu: the CUDA sampler (Ops::sample, one block per row of logits) at a 152k vocabulary, batch 1 to 256,
// greedy, temperature 1 without filters, and with top-p / top-k as users set them; prints us per call and the
// passes' bandwidth over the logits. Run it with MGRL_RADIX_SAMPLER=0 for the bit-by-bit threshold search before, and
// with MGRL_SAMPLER_SPLIT=1 for rows cut into chunks (greedy and unfiltered temperature sampling).
//   build/perf/bench_sample [reps]      (default 20 timed calls after 2 warm-up calls; median)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "perf/cuda_timing.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

int main(int argc, char** argv) {
  using namespace mgrl;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  if (!perf::have_cuda_device("bench_sample")) return 77;
  auto ops = kernels::make_cuda_ops(0);
  cudaStream_t s = static_cast<cudaStream_t>(ops->device_stream().cuda);
  const int V = 151936;
  const char* radix = std::getenv("MGRL_RADIX_SAMPLER");
  const char* split = std::getenv("MGRL_SAMPLER_SPLIT");
  std::printf("Ops::sample, V = %d, median of %d calls, MGRL_RADIX_SAMPLER=%s, MGRL_SAMPLER_SPLIT=%s\n", V, reps,
              radix ? radix : "(unset)", split ? split : "(unset)");
  struct Setting {
    const char* name;
    float temperature;
    int top_k;
    float top_p, min_p;
  };
  const Setting settings[] = {{"greedy", 0.0f, 0, 1.0f, 0.0f},          {"T 1", 1.0f, 0, 1.0f, 0.0f},
                              {"T 1, top_p 0.9", 1.0f, 0, 0.9f, 0.0f},   {"T 1, top_k 50", 1.0f, 50, 1.0f, 0.0f},
                              {"T 0.7, k 20, p 0.8", 0.7f, 20, 0.8f, 0.0f}, {"T 1, min_p 0.05", 1.0f, 0, 1.0f, 0.05f}};
  std::printf("%-20s", "setting");
  const int batches[] = {1, 8, 64, 256};
  for (int B : batches) std::printf(" | B %3d: us   GB/s", B);
  std::printf("\n");
  const int Bmax = 256;
  // LM-like rows: gaussian logits (sd 3) with a few large ones, so top-p cuts the row somewhere inside.
  std::vector<float> logits(static_cast<std::size_t>(Bmax) * V);
  std::mt19937 gen(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (auto& v : logits) v = nd(gen);
  for (int b = 0; b < Bmax; ++b)
    for (int j = 0; j < 8; ++j) logits[static_cast<std::size_t>(b) * V + gen() % V] = 14.0f + static_cast<float>(j);
  std::vector<std::uint64_t> seeds(Bmax);
  for (int b = 0; b < Bmax; ++b) seeds[static_cast<std::size_t>(b)] = 0x9e3779b97f4a7c15ull * (b + 1);
  void* z = ops->alloc(logits.size() * 4);
  void* sd = ops->alloc(seeds.size() * 8);
  void* tok = ops->alloc(Bmax * 4);
  void* lp = ops->alloc(Bmax * 4);
  ops->upload(z, logits.data(), logits.size() * 4);
  ops->upload(sd, seeds.data(), seeds.size() * 8);
  for (const Setting& st : settings) {
    kernels::Ops::Sampling p;
    p.temperature = st.temperature;
    p.top_k = st.top_k;
    p.top_p = st.top_p;
    p.min_p = st.min_p;
    std::printf("%-20s", st.name);
    for (int B : batches) {
      const double ms = perf::time_ms(s, reps, [&] {
        ops->sample(static_cast<std::int32_t*>(tok), static_cast<float*>(lp), static_cast<const float*>(z),
                    static_cast<const std::uint64_t*>(sd), B, V, p);
      });
      // one pass over the rows' logits, for scale (the sampler makes several, mostly from L2)
      std::printf(" | %9.1f %6.0f", ms * 1e3, static_cast<double>(B) * V * 4 / (ms * 1e-3) / 1e9);
    }
    std::printf("\n");
  }
  for (void* b : {z, sd, tok, lp}) ops->release(b);
  return 0;
}
