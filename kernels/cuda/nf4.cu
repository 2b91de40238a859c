// nf4.cu: NF4 weights (bitsandbytes' layout) dequantized into a bf16/fp16 workspace, for the dense GEMMs after it.
#include "kernels/cuda/nf4.cuh"

namespace mgrl::kernels::cuda {
namespace {

constexpr int kBlock = 64;         // values per absmax
constexpr int kNestedBlock = 256;  // absmax per nested absmax

// Each thread writes 8 consecutive outputs (4 code bytes when the range starts on an even element): the 16-value
// code and the absmax of its block(s) come from shared memory / registers, the math is code * absmax in fp32,
// rounded once to the storage dtype (what the CPU reference does in fp32).
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
        scale = kDouble ? nested_code[qabsmax[b]] * nested_absmax[b / kNestedBlock] + offset : absmax[b];
      }
      const std::uint8_t byte = codes[i >> 1];
      const int q = (i & 1) ? (byte & 15) : (byte >> 4);
      dst[k + j] = from_f32<S>(s_code[q] * scale);
    }
  }
}

}  // namespace

void dequantize_nf4(const Ctx& c, void* dst, const Nf4Weight& w, std::int64_t begin, std::int64_t end) {
  if (end <= begin) return;
  const std::int64_t n = end - begin;
  const unsigned grid = grid_for((n + 7) / 8);
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
