// comm_self.cpp: Comm for a job of one rank. Over one rank every collective is the identity (allreduce, broadcast,
// barrier) or a copy (an allgather into another buffer), so no MPI or NCCL call is made: a single-GPU run starts
// without NCCL (no communicator init, no NCCL buffers or proxy thread, no dependence on the node's network set-up).
// On a GPU the copies run on the caller's stream, and an event after the latest one lets wait() and synchronize()
// keep Comm's ordering promises.
#include <cstring>
#include <string>

#include "core/error.h"
#include "dist/comm.h"

#if MGRL_WITH_CUDA
#include <cuda_runtime.h>

#include "core/check_cuda.h"
#endif

namespace mgrl::dist {
namespace {

class SelfComm final : public Comm {
 public:
  SelfComm(Backend backend, int device) : Comm(0, 1), backend_(backend) {
#if MGRL_WITH_CUDA
    device_ = device;
#else
    (void)device;
#endif
    if (backend_ == Backend::Cuda) {
#if MGRL_WITH_CUDA
      CUDA_CHECK(cudaSetDevice(device_));
      CUDA_CHECK(cudaEventCreateWithFlags(&last_, cudaEventDisableTiming));
#else
      throw FatalError("CUDA device chosen in a build without the CUDA backend");
#endif
    }
  }
  ~SelfComm() override {
#if MGRL_WITH_CUDA
    if (last_) {
      cudaEventSynchronize(last_);
      cudaEventDestroy(last_);
    }
#endif
  }

  Backend backend() const override { return backend_; }
  std::string name() const override { return "self"; }

  void allreduce_sum(void*, std::size_t, DType t, Stream) override { reducible(t); }
  void allreduce_avg(void*, std::size_t, DType t, Stream) override {
    reducible(t);
    if (!dtype_is_float(t))
      throw FatalError(std::string("allreduce_avg takes a floating type, not ") + dtype_name(t));
  }
  void broadcast(void*, std::size_t, int root, Stream) override {
    if (root != 0)
      throw FatalError("broadcast from rank " + std::to_string(root) + " in a job of one rank");
  }
  void allgather(const void* send, void* recv, std::size_t bytes, Stream s) override { copy(recv, send, bytes, s); }
  void allgather_async(const void* send, void* recv, std::size_t bytes, Stream s) override {
    copy(recv, send, bytes, s);
  }
  // Orders s after the copies made so far (an allgather_async on another stream included).
  void wait(Stream s) override {
#if MGRL_WITH_CUDA
    if (copied_) CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), last_, 0));
#else
    (void)s;
#endif
  }
  void barrier() override { synchronize(); }
  void synchronize() override {
#if MGRL_WITH_CUDA
    if (copied_) CUDA_CHECK(cudaEventSynchronize(last_));
#endif
  }

 private:
  // The types each backend's communicator reduces: half precision on the GPU only, as with MPI and NCCL.
  void reducible(DType t) const {
    if (backend_ == Backend::Cpu && (t == DType::F16 || t == DType::BF16))
      throw FatalError(std::string("the CPU communicator does not reduce ") + dtype_name(t) +
                       " (half-precision reductions need the CUDA backend)");
  }
  void copy(void* dst, const void* src, std::size_t bytes, Stream s) {
    if (bytes == 0 || dst == src) return;  // in place: the one rank's part is already where it belongs
    if (backend_ == Backend::Cpu) {
      std::memmove(dst, src, bytes);
      return;
    }
#if MGRL_WITH_CUDA
    CUDA_CHECK(cudaSetDevice(device_));
    const auto st = static_cast<cudaStream_t>(s);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
    CUDA_CHECK(cudaEventRecord(last_, st));
    copied_ = true;
#else
    (void)s;
#endif
  }

  Backend backend_;
#if MGRL_WITH_CUDA
  int device_ = -1;
  cudaEvent_t last_ = nullptr;
  bool copied_ = false;
#endif
};

}  // namespace

std::unique_ptr<Comm> make_self_comm(const Device& device) {
  return std::make_unique<SelfComm>(device.backend, device.backend == Backend::Cuda ? device.gpu.index : -1);
}

}  // namespace mgrl::dist
