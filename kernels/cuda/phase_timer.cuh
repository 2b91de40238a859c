// phase_timer.cuh: the CUDA backend's phase timing (kernels/ops.h, "phase timing"): a begin/end pair of CUDA events
// recorded on the backend's stream per phase occurrence, never synchronising when recording; elapsed times are folded
// in when the events have completed. Each occurrence is also an NVTX range named after the phase, so Nsight Systems
// and Nsight Compute timelines show the phases.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <vector>

#include "kernels/ops.h"

namespace mgrl::kernels::cuda {

class PhaseTimer {
 public:
  explicit PhaseTimer(cudaStream_t stream) : stream_(stream) {}
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  void begin(Phase p);
  void end(Phase p);
  // Adds the seconds of completed occurrences to `acc`; wait = true first waits for the stream (all complete).
  void collect(PhaseSeconds& acc, bool wait);
  void reset();  // drops every recorded occurrence

 private:
  struct Pair {
    int phase;
    cudaEvent_t start, stop;
  };
  cudaEvent_t event();
  cudaStream_t stream_;
  std::vector<cudaEvent_t> free_;
  std::array<cudaEvent_t, kNumPhases> open_{};
  std::vector<Pair> pending_;
  PhaseSeconds folded_{};  // completed occurrences folded in before the next collect()
};

}  // namespace mgrl::kernels::cuda
