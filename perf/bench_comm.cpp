// bench_comm.cpp: allreduce time and bandwidth of Comm for message sizes from 4 KiB to 64 MiB,
// on the backend given by --backend=cpu|cuda, at any number of ranks. Every rank runs the same
// fixed number of iterations (so that no rank waits in a collective the others skipped); rank 0
// prints and writes --benchmark_out. Bus bandwidth = algorithm bandwidth * 2 (n - 1) / n, the usual
// ring-allreduce figure.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/device.h"
#include "dist/mpi_env.h"

#if MGRL_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

mgrl::dist::Comm* g_comm = nullptr;

void BM_AllreduceF32(benchmark::State& state) {
  const std::size_t count = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  void* buf = nullptr;
  std::vector<float> host;
  if (g_comm->backend() == mgrl::dist::Backend::Cuda) {
#if MGRL_WITH_CUDA
    cudaMalloc(&buf, count * sizeof(float));
    cudaMemset(buf, 0, count * sizeof(float));
#endif
  } else {
    host.assign(count, 1.0f);
    buf = host.data();
  }
  g_comm->barrier();
  for (auto _ : state) {
    g_comm->allreduce_sum(buf, count, mgrl::DType::F32);
    g_comm->synchronize();
  }
  const double n = g_comm->size();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
  state.counters["busbw"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(state.range(0)) * (n > 1 ? 2 * (n - 1) / n : 1),
      benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1024);
#if MGRL_WITH_CUDA
  if (g_comm->backend() == mgrl::dist::Backend::Cuda) cudaFree(buf);
#endif
}
BENCHMARK(BM_AllreduceF32)->RangeMultiplier(4)->Range(4 << 10, 64 << 20)->Iterations(20)->UseRealTime();

// Prints only on rank 0.
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  mgrl::dist::MpiEnv env(&argc, &argv);
  std::string backend = "cpu";
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--backend=", 10) == 0) backend = argv[i] + 10;
    // Only rank 0 writes --benchmark_out: every rank would open (and truncate) the same file.
    else if (env.rank() != 0 && std::strncmp(argv[i], "--benchmark_out", 15) == 0) continue;
    else args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  return mgrl::dist::run_guarded(env, [&]() -> int {
    const auto device = mgrl::dist::choose_device(env, backend, 0);
    auto comm = mgrl::dist::make_comm(env, device, 120.0);
    g_comm = comm.get();
    benchmark::Initialize(&n, args.data());
    if (env.rank() == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      SilentReporter quiet;
      benchmark::RunSpecifiedBenchmarks(&quiet);
    }
    benchmark::Shutdown();
    return 0;
  });
}
