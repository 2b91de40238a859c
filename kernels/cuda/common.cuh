// common.cuh: shared device helpers of the CUDA backend: storage <-> fp32 conversion, warp/block reductions, grids.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/check_cuda.h"
#include "core/dtype.h"

namespace mgrl::kernels::cuda {

// What every launcher needs: the storage dtype (BF16 or F16), the stream everything runs on, the cuBLAS
// handle bound to that stream, and a device int that kernels set to nonzero when they meet an id out of range
// (the host reads it at the next synchronisation; kernels cannot throw).
struct LtState;  // cuBLASLt: handle, workspace and the plans by shape (gemm.cu); null: bias GEMMs by broadcast
struct Ctx {
  DType st;
  cudaStream_t stream;
  cublasHandle_t blas;
  int* err;
  LtState* lt = nullptr;
};

// Error codes a kernel may OR into *Ctx::err.
inline constexpr int kErrTokenId = 1;   // embedding id >= V
inline constexpr int kErrTargetId = 2;  // lm_head target >= V
inline constexpr int kErrLength = 4;    // attention: malformed cu_seqlens

// Stream-ordered scratch memory (cudaMallocAsync from the device's default pool: no host synchronisation);
// give it back with scratch_free on the same stream once the kernels that use it are queued.
inline void* scratch_alloc(std::size_t bytes, cudaStream_t s) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocAsync(&p, bytes ? bytes : 1, s));
  return p;
}
inline void scratch_free(void* p, cudaStream_t s) { CUDA_CHECK(cudaFreeAsync(p, s)); }

// Streaming multiprocessors of the device current at the first call (one device per process).
inline int sm_count() {
  static const int n = [] {
    int dev = 0, count = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
    return count;
  }();
  return n;
}

// The device facts the launchers check at every call, read once (the device current at the first call: one device
// per process), and the attention kernel selector MGRL_CUDA_ATTENTION ("" when unset), read at each call (a getenv:
// the gpu tests switch it within one process to compare kernels).
struct DeviceFacts {
  int major = 0, minor = 0, smem_optin = 0;  // compute capability; shared memory a block may opt in to
};
inline const DeviceFacts& device_facts() {
  static const DeviceFacts f = [] {
    DeviceFacts d;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return d;
  }();
  return f;
}
inline std::string attention_selector() {
  const char* e = std::getenv("MGRL_CUDA_ATTENTION");
  return e ? e : "";
}

// A kernel's dynamic shared memory limit raised to `bytes` (when over the default 48 KiB), once per kernel and size:
// the launchers call it before every launch, the runtime call is made the first time.
template <class Kern>
void allow_smem(Kern kernel, int bytes) {
  if (bytes <= 48 * 1024) return;
  static std::mutex m;
  static std::vector<std::pair<const void*, int>> done;
  const std::lock_guard<std::mutex> lock(m);
  const void* k = reinterpret_cast<const void*>(kernel);
  for (const auto& [p, b] : done)
    if (p == k && b >= bytes) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.emplace_back(k, bytes);
}

// Threads per block of the elementwise and row kernels (a multiple of 32, at most 1024).
inline constexpr int kThreads = 256;

// ---- storage <-> fp32 (round to nearest even on the way in) ----
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(float v) { return v; }

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}

// ---- reductions (full warps: blockDim.x must be a multiple of 32) ----
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;  // every lane holds the sum
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block; every thread gets the result. Call from every thread of the block (it holds
// __syncthreads). The leading barrier makes back-to-back calls safe (a warp may still be reading buf).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float buf[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  return warp_sum(lane < nw ? buf[lane] : 0.0f);
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float buf[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  return warp_max(lane < nw ? buf[lane] : -INFINITY);
}

// ---- launch helpers ----
// Blocks for a grid-stride loop over n elements (n > 0): one element per thread, capped (the loop does the rest).
inline unsigned grid_for(std::int64_t n, int threads = kThreads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<std::int64_t>(std::max<std::int64_t>(b, 1), 65536));
}
// Index and stride of a grid-stride loop, in 64 bits.
__device__ __forceinline__ std::int64_t gs_begin() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t gs_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

// ---- programmatic dependent launch (PDL; sm_90+, MGRL_PDL=1) ----
// A kernel launched with launch(pdl = true, ...) may start while the kernel before it in the stream (or the recorded
// graph) is still running: its blocks are scheduled, and do what does not depend on the kernels before, during the
// other's tail. So every kernel that is ever launched that way calls pdl_wait() before it reads or writes global
// memory that a kernel before it may write or read, and pdl_launch_dependents() after that (letting the next such
// kernel be scheduled: one kernel ahead, not a chain). What may come before pdl_wait(): index arithmetic and L2
// prefetches (prefetch_l2: the L2 is the device's point of coherence, so a prefetch cannot bring a stale value into a
// later load; the decode GEMVs prefetch their weight rows). Both are no-ops below sm_90 and in a kernel launched
// without the attribute (griddepcontrol.wait then has nothing to wait for).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Whether the decode step's kernels are launched with PDL: MGRL_PDL=1 (opt-in until a GPU has measured it) on a
// device of compute capability 9.0 or more, kernels compiled for compute_90 or later (else pdl_wait() is empty), and
// a CUDA 12.3 or newer runtime and driver (programmatic edges in captured graphs). Read once; says when it declines.
bool pdl_enabled();

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-stream-serialization attribute when pdl is
// true (the kernel must follow the rules above). Checks the launch.
template <class... P, class... A>
void launch(bool pdl, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
            A&&... args) {
#if CUDART_VERSION >= 12000
  if (pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...));
    return;
  }
#else
  (void)pdl;
#endif
  kernel<<<grid, block, smem, stream>>>(static_cast<P>(args)...);
  CUDA_CHECK_LAUNCH();
}

// Calls f with a value of the storage type of st (bf16, else fp16), used as
//   dispatch(st, [&](auto tag) { using T = decltype(tag); kernel<T><<<...>>>(...); });
template <class F>
void dispatch(DType st, F&& f) {
  if (st == DType::BF16)
    f(__nv_bfloat16{});
  else
    f(__half{});
}

}  // namespace mgrl::kernels::cuda
