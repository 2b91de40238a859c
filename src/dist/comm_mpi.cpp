// comm_mpi.cpp: Comm over MPI on host buffers (the CPU backend).
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "dist/check_mpi.h"
#include "dist/comm.h"
#include "dist/comm_detail.h"
#include "dist/mpi_env.h"
#include "dist/watchdog.h"

namespace mgrl::dist {
namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::F16:
    case DType::BF16: break;
  }
  throw FatalError(std::string("the MPI communicator does not reduce ") + dtype_name(t) +
                   " (half-precision reductions need the CUDA backend)");
}

template <typename T>
void scale(void* buf, std::size_t n, double by) {
  T* p = static_cast<T*>(buf);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] * by);
}

class MpiComm final : public Comm {
 public:
  MpiComm(const MpiEnv& env, double timeout_s) : Comm(env.rank(), env.size()), env_(env), watchdog_(timeout_s) {
    env_.attach_watchdog(&watchdog_);
  }
  ~MpiComm() override { env_.attach_watchdog(nullptr); }

  Backend backend() const override { return Backend::Cpu; }
  std::string name() const override { return "mpi"; }

  void allreduce_sum(void* buf, std::size_t count, DType t, Stream) override {
    const MPI_Datatype mt = mpi_type(t);
    auto g = watchdog_.watch(detail::describe("allreduce_sum", ++seq_, count, dtype_name(t)));
    // MPI counts are int: reduce in chunks so that very large buffers work too.
    char* p = static_cast<char*>(buf);
    const std::size_t chunk = std::size_t(1) << 30;
    for (std::size_t off = 0; off < count; off += chunk) {
      const std::size_t n = std::min(chunk, count - off);
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + off * dtype_size(t), static_cast<int>(n), mt, MPI_SUM,
                              MPI_COMM_WORLD));
    }
  }

  void allreduce_avg(void* buf, std::size_t count, DType t, Stream s) override {
    if (t != DType::F32 && t != DType::F64)
      throw FatalError(std::string("allreduce_avg on the MPI communicator takes f32 or f64, not ") + dtype_name(t));
    allreduce_sum(buf, count, t, s);
    const double inv = 1.0 / size();
    if (t == DType::F32) scale<float>(buf, count, inv);
    else scale<double>(buf, count, inv);
  }

  void broadcast(void* buf, std::size_t bytes, int root, Stream) override {
    auto g = watchdog_.watch(detail::describe("broadcast", ++seq_, bytes, "byte"));
    char* p = static_cast<char*>(buf);
    const std::size_t chunk = std::size_t(1) << 30;
    for (std::size_t off = 0; off < bytes; off += chunk) {
      const std::size_t n = std::min(chunk, bytes - off);
      MPI_CHECK(MPI_Bcast(p + off, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD));
    }
  }

  void allgather(const void* send, void* recv, std::size_t bytes, Stream) override {
    MGRL_CHECK(bytes <= static_cast<std::size_t>(INT32_MAX), "allgather of more than 2 GiB per rank");
    auto g = watchdog_.watch(detail::describe("allgather", ++seq_, bytes, "byte"));
    MPI_CHECK(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                            MPI_COMM_WORLD));
  }

  void barrier() override {
    auto g = watchdog_.watch(detail::describe("barrier", ++seq_, 0, "-"));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  }

  void synchronize() override {}

 private:
  const MpiEnv& env_;
  Watchdog watchdog_;
  std::uint64_t seq_ = 0;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(const MpiEnv& env, double timeout_s) {
  return std::make_unique<MpiComm>(env, timeout_s);
}

}  // namespace mgrl::dist
