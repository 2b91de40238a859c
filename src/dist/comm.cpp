// comm.cpp: make_comm picks the Comm implementation that matches the device's backend (and the job's size).
#include "dist/comm.h"

#include <chrono>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "dist/mpi_env.h"

#if MGRL_WITH_CUDA
#include <nccl.h>

#include "core/check_cuda.h"
#endif

namespace mgrl::dist {

std::unique_ptr<Comm> make_mpi_comm(const MpiEnv& env, double timeout_s);
#if MGRL_WITH_CUDA
std::unique_ptr<Comm> make_nccl_comm(const MpiEnv& env, int device, double timeout_s);
#endif

std::unique_ptr<Comm> make_comm(const MpiEnv& env, const Device& device, double timeout_s) {
  if (device.backend == Backend::Cpu) return make_mpi_comm(env, timeout_s);
#if MGRL_WITH_CUDA
  // One GPU, one rank: nothing to communicate, so no NCCL is needed. Opt-in (MGRL_SELF_COMM=1) until a GPU has run it.
  if (env.size() == 1 && env::opt_in_logged("MGRL_SELF_COMM", "MGRL_SELF_COMM=1: one rank on a GPU, no NCCL (the self "
                                                               "communicator)"))
    return make_self_comm(device);
  return make_nccl_comm(env, device.gpu.index, timeout_s);
#else
  throw FatalError("CUDA device chosen in a build without the CUDA backend");
#endif
}

double comm_selftest(Comm& comm) {
  constexpr std::size_t n = 1024;
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(comm.rank() + 1) * static_cast<float>(i % 7);
  const auto t0 = std::chrono::steady_clock::now();
  if (comm.backend() == Backend::Cpu) {
    comm.allreduce_sum(host.data(), n, DType::F32);
  } else {
#if MGRL_WITH_CUDA
    float* dev = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    comm.allreduce_sum(dev, n, DType::F32);
    comm.synchronize();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dev));
#endif
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const float ranks = static_cast<float>(comm.size());
  const float factor = ranks * (ranks + 1) / 2;  // sum of (rank + 1)
  for (std::size_t i = 0; i < n; ++i)
    if (host[i] != factor * static_cast<float>(i % 7))
      throw FatalError(comm.name() + " allreduce self-test gave a wrong sum at element " + std::to_string(i));
  return ms;
}

std::string nccl_version() {
#if MGRL_WITH_CUDA
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unavailable";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
#else
  return "not built";
#endif
}

}  // namespace mgrl::dist
