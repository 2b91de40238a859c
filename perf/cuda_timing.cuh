// cuda_timing.cuh: the GPU benchmarks' timer (the median of timed calls on a stream, CUDA events, after warm-up) and
// their check for a device.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "core/check_cuda.h"

namespace mgrl::perf {

// Whether a CUDA device can be used; when not, prints "<name>: no CUDA device" (the benchmark then exits).
inline bool have_cuda_device(const char* name) {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) return true;
  std::printf("%s: no CUDA device\n", name);
  return false;
}

// Median of reps timed calls of f on stream s (after 2 warm-up calls), in ms.
inline double time_ms(cudaStream_t s, int reps, const std::function<void()>& f) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, s));
    f();
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace mgrl::perf
