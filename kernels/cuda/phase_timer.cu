// phase_timer.cu: CUDA-event phase timing with NVTX ranges (phase_timer.cuh).
#include "kernels/cuda/phase_timer.cuh"

#include <nvtx3/nvToolsExt.h>

#include "core/check_cuda.h"

namespace mgrl::kernels::cuda {

namespace {
// Bounds the pending list without synchronising: past this many occurrences, completed ones are folded in.
constexpr std::size_t kFoldAt = 8192;
}  // namespace

PhaseTimer::~PhaseTimer() {
  for (const Pair& p : pending_) {
    (void)cudaEventDestroy(p.start);
    (void)cudaEventDestroy(p.stop);
  }
  for (cudaEvent_t e : open_)
    if (e) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
}

cudaEvent_t PhaseTimer::event() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void PhaseTimer::begin(Phase p) {
  const int i = static_cast<int>(p);
  if (open_[i]) free_.push_back(open_[i]);  // a begin without an end: restart the occurrence
  open_[i] = event();
  CUDA_CHECK(cudaEventRecord(open_[i], stream_));
  nvtxRangePushA(phase_name(p));
}

void PhaseTimer::end(Phase p) {
  const int i = static_cast<int>(p);
  if (!open_[i]) return;
  nvtxRangePop();
  cudaEvent_t stop = event();
  CUDA_CHECK(cudaEventRecord(stop, stream_));
  pending_.push_back({i, open_[i], stop});
  open_[i] = nullptr;
  if (pending_.size() >= kFoldAt) {
    PhaseSeconds partial{};
    collect(partial, false);
    for (int k = 0; k < kNumPhases; ++k) folded_[k] += partial[k];
  }
}

void PhaseTimer::collect(PhaseSeconds& acc, bool wait) {
  if (wait) CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (int k = 0; k < kNumPhases; ++k) acc[k] += folded_[k];
  folded_ = {};
  std::size_t kept = 0;
  for (const Pair& p : pending_) {
    if (!wait && cudaEventQuery(p.stop) == cudaErrorNotReady) {  // not yet complete: keep it
      pending_[kept++] = p;
      continue;
    }
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
    acc[p.phase] += 1e-3 * ms;
    free_.push_back(p.start);
    free_.push_back(p.stop);
  }
  pending_.resize(kept);
}

void PhaseTimer::reset() {
  for (const Pair& p : pending_) {
    free_.push_back(p.start);
    free_.push_back(p.stop);
  }
  pending_.clear();
  folded_ = {};
}

}  // namespace mgrl::kernels::cuda
