// device.cpp: GPU discovery, CPU facts and the collective choice of the backend.
#include "dist/device.h"

#include <sched.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "core/build_info.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/mpi_env.h"

#if MGRL_WITH_CUDA
#include "core/check_cuda.h"
#endif

namespace mgrl::dist {

const char* backend_name(Backend b) { return b == Backend::Cuda ? "cuda" : "cpu"; }

int cuda_device_count() {
#if MGRL_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for discovery
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

GpuInfo cuda_device_info(int index) {
  GpuInfo g;
  g.index = index;
#if MGRL_WITH_CUDA
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  g.name = p.name;
  g.cc_major = p.major;
  g.cc_minor = p.minor;
  g.memory_bytes = p.totalGlobalMem;
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), index) == cudaSuccess) g.pci_bus_id = bus;
#endif
  return g;
}

namespace {
[[maybe_unused]] std::string version_string(int v) {
  // CUDA encodes 1000 * major + 10 * minor.
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
}  // namespace

std::string cuda_runtime_version() {
#if MGRL_WITH_CUDA
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess && v > 0) return version_string(v);
#endif
  return "none";
}

std::string cuda_driver_version() {
#if MGRL_WITH_CUDA
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) return version_string(v);
#endif
  return "none";
}

std::vector<std::string> cuda_p2p_matrix() {
  std::vector<std::string> rows;
#if MGRL_WITH_CUDA
  const int n = cuda_device_count();
  if (n == 0) return rows;
  std::ostringstream head;
  head << "     ";
  for (int j = 0; j < n; ++j) head << " GPU" << j;
  rows.push_back(head.str());
  for (int i = 0; i < n; ++i) {
    std::ostringstream row;
    row << "GPU" << i << " ";
    for (int j = 0; j < n; ++j) {
      int ok = 0;
      if (i != j) CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, i, j));
      row << "    " << (i == j ? "-" : (ok ? "Y" : "N"));
    }
    rows.push_back(row.str());
  }
#endif
  return rows;
}

std::size_t gpu_memory_used() {
#if MGRL_WITH_CUDA
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) return total - free;
  cudaGetLastError();
#endif
  return 0;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown CPU";
}

int default_cpu_threads(int local_size) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int allowed = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) allowed = CPU_COUNT(&set);
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  if (allowed <= 0) allowed = hw > 0 ? hw : 1;
  // Bound by the launcher (srun --cpu-bind, mpirun --bind-to): the mask is this rank's own.
  // Unbound (mask = whole machine): share the cores among the node's ranks.
  if (hw > 0 && allowed >= hw && local_size > 1) allowed = hw / local_size;
  return allowed > 0 ? allowed : 1;
}

int gpu_index_for(int local_rank, int local_size, int visible_gpus) {
  if (visible_gpus <= 0) return -1;
  return visible_gpus >= local_size ? local_rank : local_rank % visible_gpus;
}

DType storage_dtype(Backend backend, int cc, const std::string& requested) {
  if (requested != "auto" && requested != "bf16" && requested != "fp16")
    throw UserError("model.dtype must be \"auto\", \"bf16\" or \"fp16\" (got \"" + requested + "\")");
  if (backend != Backend::Cuda) {
    if (requested != "auto")
      throw UserError("model.dtype = \"" + requested + "\" needs the CUDA backend; this run uses the CPU backend, " +
                      "which computes in f32 (leave model.dtype = \"auto\", or run on GPUs)");
    return DType::F32;
  }
  if (requested == "fp16") return DType::F16;
  if (requested == "bf16" && cc < 80)
    throw UserError("model.dtype = \"bf16\" needs compute capability 8.0 or newer; this job has a GPU of " +
                    std::to_string(cc / 10) + "." + std::to_string(cc % 10) + " (use \"fp16\" or \"auto\")");
  return cc >= 80 ? DType::BF16 : DType::F16;
}

int job_compute_capability(const MpiEnv& env, const Device& device) {
  const bool gpu = device.backend == Backend::Cuda;
  const int cc = env.allreduce_min(gpu ? 10 * device.gpu.cc_major + device.gpu.cc_minor : 1 << 20);
  return cc == 1 << 20 ? 0 : cc;
}

Device choose_device(const MpiEnv& env, const std::string& requested, int threads) {
  if (requested != "auto" && requested != "cpu" && requested != "cuda")
    throw UserError("runtime.backend must be \"auto\", \"cpu\" or \"cuda\" (got \"" + requested + "\")");
  // This rank's GPU: the node-local rank when the rank sees every GPU of the node; when the
  // launcher shows each rank fewer GPUs (srun --gpus-per-task=1), one of those it sees.
  const int count = cuda_device_count();
  const int index = gpu_index_for(env.local_rank(), env.local_size(), count);
  const std::string bus = index >= 0 ? cuda_device_info(index).pci_bus_id : std::string();

  // Two ranks of a node on one GPU is a launch mistake; find the first such pair.
  const auto keys = env.gather_to_root(index >= 0 ? env.host() + " " + bus : std::string());
  std::string shared;
  for (std::size_t a = 0; a < keys.size() && shared.empty(); ++a)
    for (std::size_t b = a + 1; b < keys.size() && shared.empty(); ++b)
      if (!keys[a].empty() && keys[a] == keys[b])
        shared = "ranks " + std::to_string(a) + " and " + std::to_string(b) + " would share the GPU at " +
                 keys[a].substr(keys[a].find(' ') + 1) + " on host " + keys[a].substr(0, keys[a].find(' '));
  shared = env.broadcast(shared, 0);
  const int all_have_gpu = env.allreduce_min(index >= 0 ? 1 : 0);
  const int any_gpu = env.allreduce_max(index >= 0 ? 1 : 0);
  std::string why_not;
  if (!shared.empty()) {
    why_not = shared;
  } else if (!all_have_gpu) {
    const int first = env.allreduce_min(index >= 0 ? env.size() : env.rank());
    why_not = env.broadcast("rank " + std::to_string(env.rank()) + " on host " + env.host() + " sees no GPU", first);
  }

  Device d;
  d.cpu_model = cpu_model_name();
  d.cpu_threads = threads > 0 ? threads : default_cpu_threads(env.local_size());
  if (requested == "cuda") {
    if (!build_info().with_cuda)
      throw UserError("runtime.backend = \"cuda\" but this mgrl was built without the CUDA backend "
                      "(configure with -DMGRL_CUDA=ON)");
    if (!why_not.empty())
      throw UserError("runtime.backend = \"cuda\" needs one GPU per rank, but " + why_not +
                      "; start one rank per GPU, or use --runtime.backend=cpu");
  }
  if (requested == "cpu" || !why_not.empty()) {
    if (requested == "auto" && any_gpu)
      log::warn_once("using the CPU backend: " + why_not + " (the CUDA backend needs one GPU per rank)");
    d.backend = Backend::Cpu;
    return d;
  }
  d.backend = Backend::Cuda;
  d.gpu = cuda_device_info(index);
#if MGRL_WITH_CUDA
  CUDA_CHECK(cudaSetDevice(index));
#endif
  return d;
}

}  // namespace mgrl::dist
