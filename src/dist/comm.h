// comm.h: collective communication between the ranks of a job, one interface for both backends.
// CPU backend: MPI on host buffers. CUDA backend: NCCL on device buffers, bootstrapped through
// MPI, on its own stream that is ordered after / before the caller's stream with events.
// Every call is watched: one that does not complete within the timeout ends the job with a
// message naming the operation, instead of hanging.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "dist/device.h"

namespace mgrl::dist {

class MpiEnv;

// The caller's stream: a cudaStream_t on the CUDA backend (nullptr = default stream); ignored on the CPU.
using Stream = void*;

class Comm {
 public:
  virtual ~Comm() = default;
  virtual Backend backend() const = 0;
  virtual std::string name() const = 0;  // "mpi", "nccl" or "self"
  int rank() const { return rank_; }
  int size() const { return size_; }

  // In place. F32, F64, I32, I64 on both backends; F16 and BF16 on the CUDA backend only.
  virtual void allreduce_sum(void* buf, std::size_t count, DType t, Stream s = nullptr) = 0;
  // Like allreduce_sum, but later work of the caller's stream does not wait for it (so computation can go on
  // while it runs: gradient buckets during the backward pass); wait(s) orders s after every such operation.
  // On the CPU (blocking MPI) it is allreduce_sum.
  virtual void allreduce_sum_async(void* buf, std::size_t count, DType t, Stream s = nullptr) {
    allreduce_sum(buf, count, t, s);
  }
  virtual void wait(Stream s = nullptr) { (void)s; }
  // Sum divided by size(); floating types only.
  virtual void allreduce_avg(void* buf, std::size_t count, DType t, Stream s = nullptr) = 0;
  // bytes from root's buf into every rank's buf.
  virtual void broadcast(void* buf, std::size_t bytes, int root, Stream s = nullptr) = 0;
  // Every rank gives `bytes` from send; recv (size() * bytes) gets them in rank order.
  virtual void allgather(const void* send, void* recv, std::size_t bytes, Stream s = nullptr) = 0;
  // Like allgather, but later work of the caller's stream does not wait for it (a prefetch); wait(s) orders s after
  // it. On the CPU (blocking MPI) it is allgather.
  virtual void allgather_async(const void* send, void* recv, std::size_t bytes, Stream s = nullptr) {
    allgather(send, recv, bytes, s);
  }
  // Returns when every rank has called barrier() (and, on the GPU, prior comm work is done).
  virtual void barrier() = 0;
  // Blocks until the communication enqueued so far has completed (no-op on the CPU).
  virtual void synchronize() = 0;

 protected:
  Comm(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_, size_;
};

// Collective over all ranks. timeout_s <= 0 disables the watchdog. CPU: MPI. CUDA: NCCL, or, in a job of one rank
// with MGRL_SELF_COMM=1 in the environment (opt-in until a GPU has run it), the self communicator below.
std::unique_ptr<Comm> make_comm(const MpiEnv& env, const Device& device, double timeout_s);

// The communicator of a job of one rank on `device`: allreduce and broadcast leave the buffer as it is, allgather
// copies (on the caller's stream on a GPU); no MPI or NCCL call. Named "self".
std::unique_ptr<Comm> make_self_comm(const Device& device);

// Collective: allreduces a small buffer on the comm's device and checks the sum; returns the
// time it took in milliseconds, throws FatalError when the result is wrong.
double comm_selftest(Comm& comm);

// NCCL library version loaded at run time ("2.28.9"), or "not built" without the CUDA backend.
std::string nccl_version();

}  // namespace mgrl::dist
