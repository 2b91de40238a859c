// nf4.cu: NF4 weights (bitsandbytes' layout) dequantized into a bf16/fp16 workspace, for the dense GEMMs after it.
#include "kernels/cuda/nf4.cuh"

#include <cstdint>

namespace mgrl::kernels::cuda {
namespace {

constexpr int kBlock = 64;         // values per absmax
constexpr int kNestedBlock = 256;  // absmax per nested absmax

// Each thread writes 8 consecutive outputs (4 code bytes when the range starts on an even element): the 16-value
// code and the absmax of its block(s) come from shared memory / registers, the math is code * absmax in fp32,
// rounded once to the storage dtype (what the CPU reference does in fp32).
// A double-quantized block's absmax, nested_code[q] * nested_absmax + offset with the product rounded before the
// add, as the CPU reference (kernels/cpu/nf4.cpp) computes it: nvcc would otherwise contract it to one FMA, whose
// different last bit of the absmax changes some rounded outputs (the test compares bits).
__device__ __forceinline__ float double_quantized_absmax(const std::uint8_t* qabsmax, const float* nested_absmax,
                                                         const float* nested_code, float offset, std::int64_t b) {
  return __fadd_rn(__fmul_rn(nested_code[qabsmax[b]], nested_absmax[b / kNestedBlock]), offset);
}

template <class S, bool kDouble>
__global__ void dequantize_nf4_kernel(S* __restrict__ dst, const std::uint8_t* __restrict__ codes,
                                      const float* __restrict__ code, const float* __restrict__ absmax,
                                      const std::uint8_t* __restrict__ qabsmax,
                                      const float* __restrict__ nested_absmax, const float* __restrict__ nested_code,
                                      float offset, std::int64_t begin, std::int64_t end) {
  __shared__ float s_code[16];
  if (threadIdx.x < 16) s_code[threadIdx.x] = code[threadIdx.x];
  __syncthreads();
  const std::int64_t n = end - begin;
  for (std::int64_t k = gs_begin() * 8; k < n; k += gs_stride() * 8) {
    const std::int64_t i0 = begin + k;
    std::int64_t cur_block = -1;
    float scale = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const std::int64_t i = i0 + j;
      if (i >= end) break;
      const std::int64_t b = i / kBlock;
      if (b != cur_block) {
        cur_block = b;
        scale = kDouble ? double_quantized_absmax(qabsmax, nested_absmax, nested_code, offset, b) : absmax[b];
      }
      const std::uint8_t byte = codes[i >> 1];
      const int q = (i & 1) ? (byte & 15) : (byte >> 4);
      dst[k + j] = from_f32<S>(s_code[q] * scale);
    }
  }
}

// The fast path, when the range starts on a multiple of 8 elements and the pointers allow vector access: a thread
// reads 4 code bytes (8 values of one block) as one 32-bit word and writes its 8 outputs as one 16-byte store.
template <class S, bool kDouble>
__global__ void dequantize_nf4_vec_kernel(S* __restrict__ dst, const std::uint8_t* __restrict__ codes,
                                          const float* __restrict__ code, const float* __restrict__ absmax,
                                          const std::uint8_t* __restrict__ qabsmax,
                                          const float* __restrict__ nested_absmax,
                                          const float* __restrict__ nested_code, float offset, std::int64_t begin,
                                          std::int64_t groups) {
  static_assert(sizeof(S) == 2, "16-bit storage");
  __shared__ float s_code[16];
  if (threadIdx.x < 16) s_code[threadIdx.x] = code[threadIdx.x];
  __syncthreads();
  for (std::int64_t g = gs_begin(); g < groups; g += gs_stride()) {
    const std::int64_t i0 = begin + 8 * g;
    const std::int64_t b = i0 / kBlock;
    const float scale = kDouble ? double_quantized_absmax(qabsmax, nested_absmax, nested_code, offset, b) : absmax[b];
    const std::uint32_t word = *reinterpret_cast<const std::uint32_t*>(codes + (i0 >> 1));
    alignas(16) S h[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::uint32_t byte = (word >> (8 * j)) & 0xffu;
      h[2 * j] = from_f32<S>(s_code[byte >> 4] * scale);
      h[2 * j + 1] = from_f32<S>(s_code[byte & 15u] * scale);
    }
    reinterpret_cast<uint4*>(dst)[g] = *reinterpret_cast<const uint4*>(h);
  }
}

}  // namespace

void dequantize_nf4(const Ctx& c, void* dst, const Nf4Weight& w, std::int64_t begin, std::int64_t end) {
  if (end <= begin) return;
  const std::int64_t n = end - begin;
  const bool vec = begin % 8 == 0 && reinterpret_cast<std::uintptr_t>(w.codes) % 4 == 0 &&
                   reinterpret_cast<std::uintptr_t>(dst) % 16 == 0;
  const std::int64_t groups = vec ? n / 8 : 0;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    if (groups > 0) {
      const unsigned g = grid_for(groups);
      if (w.absmax)
        dequantize_nf4_vec_kernel<S, false><<<g, kThreads, 0, c.stream>>>(
            static_cast<S*>(dst), w.codes, w.code, w.absmax, nullptr, nullptr, nullptr, 0.0f, begin, groups);
      else
        dequantize_nf4_vec_kernel<S, true><<<g, kThreads, 0, c.stream>>>(static_cast<S*>(dst), w.codes, w.code,
                                                                          nullptr, w.qabsmax, w.nested_absmax,
                                                                          w.nested_code, w.offset, begin, groups);
      CUDA_CHECK_LAUNCH();
    }
  });
  // The rest (all of it when the fast path does not apply): element by element, 8 a thread.
  const std::int64_t done = 8 * groups;
  if (done == n) return;
  dst = static_cast<char*>(dst) + done * dtype_size(c.st);
  begin += done;
  const unsigned grid = grid_for((end - begin + 7) / 8);
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    if (w.absmax) {
      dequantize_nf4_kernel<S, false><<<grid, kThreads, 0, c.stream>>>(
          static_cast<S*>(dst), w.codes, w.code, w.absmax, nullptr, nullptr, nullptr, 0.0f, begin, end);
    } else {
      dequantize_nf4_kernel<S, true><<<grid, kThreads, 0, c.stream>>>(static_cast<S*>(dst), w.codes, w.code, nullptr,
                                                                       w.qabsmax, w.nested_absmax, w.nested_code,
                                                                       w.offset, begin, end);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mgrl::kernels::cuda
