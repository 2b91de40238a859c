// comm_gatherer.h: model::Gatherer over a dist::Comm (MPI on CPU ranks, NCCL on GPU ranks): the all-gather a
// model with a sharded base (model.shard_base) runs before each layer, queued on the backend's stream.
#pragma once
#include <cstddef>

#include "dist/comm.h"
#include "kernels/ops.h"
#include "model/gatherer.h"

namespace mgrl::train {

class CommGatherer final : public model::Gatherer {
 public:
  CommGatherer(dist::Comm& comm, const kernels::Ops& ops) : comm_(comm), stream_(ops.device_stream().cuda) {}
  int parts() const override { return comm_.size(); }
  int index() const override { return comm_.rank(); }
  void all_gather(const void* part, void* whole, std::size_t bytes) override {
    comm_.allgather(part, whole, bytes, stream_);
  }
  void all_gather_async(const void* part, void* whole, std::size_t bytes) override {
    comm_.allgather_async(part, whole, bytes, stream_);
  }
  void wait() override { comm_.wait(stream_); }

 private:
  dist::Comm& comm_;
  void* stream_;
};

}  // namespace mgrl::train
