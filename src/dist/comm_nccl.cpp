// comm_nccl.cpp: Comm over NCCL on device buffers (the CUDA backend). The communicator is
// bootstrapped through MPI; operations run on the Comm's own stream, ordered after the caller's
// stream by an event and before the caller's later work by another; the watchdog polls those
// events and NCCL's asynchronous error state.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <memory>

#include "core/check_cuda.h"
#include "dist/check_mpi.h"
#include "dist/comm.h"
#include "dist/comm_detail.h"
#include "dist/mpi_env.h"
#include "dist/watchdog.h"

namespace mgrl::dist {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  throw FatalError("unknown dtype for NCCL");
}

class NcclComm final : public Comm {
 public:
  NcclComm(const MpiEnv& env, int device, double timeout_s)
      : Comm(env.rank(), env.size()), env_(env), device_(device) {
    CUDA_CHECK(cudaSetDevice(device_));
    watchdog_ = std::make_unique<Watchdog>(timeout_s, [this] {
      if (comm_) ncclCommAbort(comm_);  // unblocks NCCL kernels so that the abort can proceed
    });
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    {
      auto g = watchdog_->watch("NCCL bootstrap (broadcast of the unique id)");
      const std::string bytes = env.broadcast(std::string(reinterpret_cast<const char*>(&id), sizeof(id)), 0);
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    {
      auto g = watchdog_->watch("ncclCommInitRank");
      NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int)));
    env_.attach_watchdog(watchdog_.get());  // the host-side agreements are watched too
  }

  ~NcclComm() override {
    env_.attach_watchdog(nullptr);
    if (stream_) cudaStreamSynchronize(stream_);
    watchdog_.reset();  // joins the polling thread and frees the events it still holds
    if (comm_) ncclCommDestroy(comm_);
    if (scratch_) cudaFree(scratch_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Backend backend() const override { return Backend::Cuda; }
  std::string name() const override { return "nccl"; }

  void allreduce_sum(void* buf, std::size_t count, DType t, Stream s) override {
    const auto nt = nccl_type(t);
    begin(s);
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nt, ncclSum, comm_, stream_));
    end(s, detail::describe("allreduce_sum", ++seq_, count, dtype_name(t)));
  }

  void allreduce_sum_async(void* buf, std::size_t count, DType t, Stream s) override {
    const auto nt = nccl_type(t);
    begin(s);
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nt, ncclSum, comm_, stream_));
    end(s, detail::describe("allreduce_sum_async", ++seq_, count, dtype_name(t)), /*caller_waits=*/false);
  }

  void wait(Stream s) override {
    // The comm stream is in order: waiting for its current tail covers every operation enqueued so far.
    CUDA_CHECK(cudaEventRecord(ready_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), ready_, 0));
  }

  void allreduce_avg(void* buf, std::size_t count, DType t, Stream s) override {
    if (!dtype_is_float(t))
      throw FatalError(std::string("allreduce_avg takes a floating type, not ") + dtype_name(t));
    const auto nt = nccl_type(t);
    begin(s);
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nt, ncclAvg, comm_, stream_));
    end(s, detail::describe("allreduce_avg", ++seq_, count, dtype_name(t)));
  }

  void broadcast(void* buf, std::size_t bytes, int root, Stream s) override {
    begin(s);
    NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclChar, root, comm_, stream_));
    end(s, detail::describe("broadcast", ++seq_, bytes, "byte"));
  }

  void allgather(const void* send, void* recv, std::size_t bytes, Stream s) override {
    begin(s);
    NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclChar, comm_, stream_));
    end(s, detail::describe("allgather", ++seq_, bytes, "byte"));
  }

  void allgather_async(const void* send, void* recv, std::size_t bytes, Stream s) override {
    begin(s);
    NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclChar, comm_, stream_));
    end(s, detail::describe("allgather_async", ++seq_, bytes, "byte"), /*caller_waits=*/false);
  }

  void barrier() override {
    begin(nullptr);
    NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_));
    end(nullptr, detail::describe("barrier", ++seq_, 1, "i32"));
    synchronize();
  }

  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  // The comm stream waits for the work the caller enqueued so far.
  void begin(Stream s) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaEventRecord(ready_, static_cast<cudaStream_t>(s)));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }

  // The caller's later work waits for the operation; the watchdog follows it to completion.
  void end(Stream s, std::string what, bool caller_waits = true) {
    cudaEvent_t done = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, stream_));
    if (caller_waits) CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), done, 0));
    const int dev = device_;
    ncclComm_t comm = comm_;
    watchdog_->watch_async(
        std::move(what),
        [done, dev, comm] {
          cudaSetDevice(dev);
          const cudaError_t st = cudaEventQuery(done);
          if (st == cudaSuccess) return true;
          if (st != cudaErrorNotReady) throw FatalError(std::string("CUDA: ") + cudaGetErrorString(st));
          ncclResult_t async = ncclSuccess;
          if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
              async != ncclInProgress)
            throw FatalError(std::string("NCCL: ") + ncclGetErrorString(async));
          return false;
        },
        [done] { cudaEventDestroy(done); });
  }

  const MpiEnv& env_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  int* scratch_ = nullptr;
  std::uint64_t seq_ = 0;
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(const MpiEnv& env, int device, double timeout_s) {
  return std::make_unique<NcclComm>(env, device, timeout_s);
}

}  // namespace mgrl::dist
