// mode_info.cpp: `mgrl info`: what every rank runs on, and the versions of everything mgrl uses.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "app/modes.h"
#include "core/build_info.h"
#include "core/error.h"
#include "io/config.h"
#include "dist/comm.h"
#include "dist/device.h"
#include "dist/mpi_env.h"
#include "io/hdf5_info.h"
#include "kernels/cpu/blas_info.h"

namespace mgrl::app {
namespace {

std::string gib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// The storage dtype a run of this configuration gets on this job's devices (dist::storage_dtype), or why model.dtype
// would be refused: info still succeeds, so that an input for other machines can be checked here.
std::string storage_text(const Context& ctx, int cc) {
  try {
    const DType t = dist::storage_dtype(ctx.device.backend, cc, ctx.cfg.get_string("model.dtype"));
    if (ctx.device.backend != dist::Backend::Cuda) return "fp32";
    return std::string(t == DType::BF16 ? "bf16" : "fp16") + " storage";
  } catch (const UserError& e) {
    return std::string("refused here: ") + e.what();
  }
}

std::string rank_line(const dist::MpiEnv& env, const dist::Device& d) {
  std::ostringstream s;
  s << "rank " << env.rank() << "/" << env.size() << "  host " << env.host() << "  local rank " << env.local_rank()
    << "/" << env.local_size() << "  device ";
  if (d.backend == dist::Backend::Cuda) {
    s << "GPU " << d.gpu.index << ": " << d.gpu.name << " (sm_" << d.gpu.cc_major << d.gpu.cc_minor << ", "
      << gib(d.gpu.memory_bytes) << ", PCI " << d.gpu.pci_bus_id << ")";
  } else {
    s << "CPU: " << d.cpu_model << " (" << d.cpu_threads << " thread" << (d.cpu_threads == 1 ? "" : "s") << ")";
  }
  return s.str();
}

}  // namespace

int run_info(Context& ctx) {
  const auto& env = ctx.env;
  const auto lines = env.gather_to_root(rank_line(env, ctx.device));
  // One P2P block per node, from the node's first rank.
  std::string p2p;
  if (env.local_rank() == 0) {
    const auto rows = dist::cuda_p2p_matrix();
    if (!rows.empty()) {
      p2p = "P2P access between the GPUs of " + env.host() + ":\n";
      for (const auto& r : rows) p2p += "  " + r + "\n";
    }
  }
  const auto p2p_blocks = env.gather_to_root(p2p);
  const double selftest_ms = dist::comm_selftest(ctx.comm);
  const std::string cuda_driver = dist::cuda_driver_version();
  const std::string cuda_runtime = dist::cuda_runtime_version();
  const int cc = dist::job_compute_capability(env, ctx.device);
  if (env.rank() != 0) return 0;

  std::ostringstream out;
  for (const auto& l : lines) out << l << "\n";
  const auto& b = build_info();
  out << "mgrl " << b.version << " (git " << b.git_sha << ", " << b.build_type << ", " << b.compiler << ")\n";
  out << "build: CUDA backend "
      << (b.with_cuda ? std::string("on (architectures ") + b.cuda_architectures + ")" : std::string("off")) << "\n";
  out << "backend: " << dist::backend_name(ctx.device.backend) << " (" << storage_text(ctx, cc) << "), " << env.size()
      << " rank"
      << (env.size() == 1 ? "" : "s") << " on " << env.num_nodes() << " node" << (env.num_nodes() == 1 ? "" : "s")
      << "; communicator " << ctx.comm.name() << ", allreduce self-test passed (";
  char ms[32];
  std::snprintf(ms, sizeof(ms), "%.3f ms", selftest_ms);
  out << ms << ")\n";
  out << "CUDA: runtime " << cuda_runtime << ", driver " << cuda_driver << "\n";
  out << "NCCL: " << dist::nccl_version() << "\n";
  out << "MPI: " << env.library_version() << " (MPI " << env.standard_version() << ")\n";
  out << "HDF5: " << io::hdf5_version() << "\n";
  out << "BLAS: " << kernels::cpu::blas_info() << "\n";
  bool any_p2p = false;
  for (const auto& blk : p2p_blocks) {
    out << blk;
    any_p2p = any_p2p || !blk.empty();
  }
  if (!any_p2p) out << "P2P access: no GPUs visible\n";
  std::cout << out.str() << std::flush;
  return 0;
}

}  // namespace mgrl::app
