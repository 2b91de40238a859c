// test_gemm_cuda.cu: the cuBLAS GEMM that the LoRA path (kernels/cuda/lora.cu) reads back with its own kernels,
// P[T, N] (f32) = x[T, K] @ A2[N, K]^T (x, A2 in the storage dtype), at the shapes where compute-sanitizer's initcheck
// reported lora_fold_kernel reading P uninitialised on an H200 (2026-11-27: T 20, N 8, K 64 and T 49, N 24, K 48,
// every row and pointer 16-byte aligned) and at shapes it did not report (K 77 and 300: x's rows not 16-byte
// aligned). Two checks a shape, each against a host reference of the same rounded inputs:
//  - Prefilled: the output filled with NaN bytes (cudaMemset, which initcheck sees) before the GEMM; every element is
//    finite afterwards and equal to the reference within fp32 summation noise, so the GEMM writes every element.
//  - Fresh: the output freshly allocated (never written before the GEMM), then read by a kernel of this file that
//    copies it out. Run normally it checks the values; run under `compute-sanitizer --tool initcheck` (perf/
//    gpu_program.sh, stage sanitize) a report here, where Prefilled shows every element written, says initcheck does
//    not see that GEMM kernel's writes: a false positive of the tool, not a missing write.
// One test instance per shape and dtype (--gtest_filter=*/N picks one, so a sanitizer report names its shape).
// Without a usable CUDA device the binary exits 77 (CTest: skipped).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/gemm.cuh"

namespace mgrl::kernels::cuda {
namespace {

struct Shape {
  int T, N, K;
};
struct Case {
  Shape s;
  DType st;
};

__global__ void copy_out_kernel(float* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// Host values rounded to the storage dtype (as floats) and their device copy in that dtype.
std::vector<float> rounded_upload(void** dev, std::size_t n, std::uint32_t seed, DType st) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  std::vector<std::uint16_t> bits(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float x = u(gen);
    if (st == DType::BF16) {
      const __nv_bfloat16 b = __float2bfloat16_rn(x);
      v[i] = __bfloat162float(b);
      bits[i] = *reinterpret_cast<const std::uint16_t*>(&b);
    } else {
      const __half h = __float2half_rn(x);
      v[i] = __half2float(h);
      bits[i] = *reinterpret_cast<const std::uint16_t*>(&h);
    }
  }
  EXPECT_EQ(cudaMalloc(dev, n * 2), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(*dev, bits.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  return v;
}

class GemmCuda : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    int major = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    if (GetParam().st == DType::BF16 && major < 8) GTEST_SKIP() << "bf16 needs compute capability 8.0+";
    ASSERT_EQ(cublasCreate(&blas_), CUBLAS_STATUS_SUCCESS);
    const Shape s = GetParam().s;
    x_ = rounded_upload(&dx_, static_cast<std::size_t>(s.T) * s.K, 11, GetParam().st);
    a_ = rounded_upload(&da_, static_cast<std::size_t>(s.N) * s.K, 12, GetParam().st);
    ref_.assign(static_cast<std::size_t>(s.T) * s.N, 0.0f);
    for (int t = 0; t < s.T; ++t)
      for (int n = 0; n < s.N; ++n) {
        double acc = 0.0;
        for (int k = 0; k < s.K; ++k)
          acc += static_cast<double>(x_[static_cast<std::size_t>(t) * s.K + k]) *
                 a_[static_cast<std::size_t>(n) * s.K + k];
        ref_[static_cast<std::size_t>(t) * s.N + n] = static_cast<float>(acc);
      }
  }
  void TearDown() override {
    cudaFree(dx_);
    cudaFree(da_);
    if (blas_) cublasDestroy(blas_);
  }
  // P = x @ A2^T into p (f32, row-major [T, N]), as gemm_forward / gemm_group_forward call it.
  void gemm(float* p) const {
    const Shape s = GetParam().s;
    gemm_rm(blas_, false, true, s.T, s.N, s.K, 1.0f, dx_, GetParam().st, s.K, da_, GetParam().st, s.K, 0.0f, p,
            DType::F32, s.N);
  }
  // Every element finite and within fp32 summation noise of the reference.
  void expect_values(const std::vector<float>& got, const char* what) const {
    std::size_t bad = 0, nonfinite = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (!std::isfinite(got[i])) {
        ++nonfinite;
        continue;
      }
      if (std::fabs(got[i] - ref_[i]) > 1e-4f * (1.0f + std::fabs(ref_[i]))) ++bad;
    }
    const Shape s = GetParam().s;
    std::printf("  [%s] T %d N %d K %d %s: %zu of %zu elements not finite, %zu off the reference\n",
                dtype_name(GetParam().st), s.T, s.N, s.K, what, nonfinite, got.size(), bad);
    EXPECT_EQ(nonfinite, 0u) << what << ": elements the GEMM did not write";
    EXPECT_EQ(bad, 0u) << what;
  }

  cublasHandle_t blas_ = nullptr;
  void *dx_ = nullptr, *da_ = nullptr;
  std::vector<float> x_, a_, ref_;
};

TEST_P(GemmCuda, PrefilledOutputIsWrittenWhole) {
  const Shape s = GetParam().s;
  const std::size_t n = static_cast<std::size_t>(s.T) * s.N;
  float* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(p, 0xff, n * 4), cudaSuccess);  // 0xffffffff: a NaN
  gemm(p);
  std::vector<float> got(n);
  ASSERT_EQ(cudaMemcpy(got.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(p);
  expect_values(got, "prefilled with NaN");
}

TEST_P(GemmCuda, FreshOutputReadByAKernel) {
  const Shape s = GetParam().s;
  const std::size_t n = static_cast<std::size_t>(s.T) * s.N;
  float *p = nullptr, *q = nullptr;
  ASSERT_EQ(cudaMalloc(&p, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&q, n * 4), cudaSuccess);
  gemm(p);
  copy_out_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(q, p, static_cast<std::int64_t>(n));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<float> got(n);
  ASSERT_EQ(cudaMemcpy(got.data(), q, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(p);
  cudaFree(q);
  expect_values(got, "fresh, read by a kernel");
}

// Instance i: shapes in this order, bf16 then fp16 for each. 0-1 and 2-3: reported by initcheck on the H200
// (LoraGroup's last case; the SFT run's q|k|v group of the Qwen2 fixture); 4-5 and 6-7: LoraGroup's first two cases
// (not reported); 8-9: the 0.5B shape's q|k|v group (T 8192, in 896, 3 adapters of r 16).
INSTANTIATE_TEST_SUITE_P(Shapes, GemmCuda,
                         ::testing::Values(Case{{20, 8, 64}, DType::BF16}, Case{{20, 8, 64}, DType::F16},
                                           Case{{49, 24, 48}, DType::BF16}, Case{{49, 24, 48}, DType::F16},
                                           Case{{45, 42, 77}, DType::BF16}, Case{{45, 42, 77}, DType::F16},
                                           Case{{70, 64, 300}, DType::BF16}, Case{{70, 64, 300}, DType::F16},
                                           Case{{8192, 96, 896}, DType::BF16}, Case{{8192, 96, 896}, DType::F16}));

}  // namespace
}  // namespace mgrl::kernels::cuda

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no usable CUDA device: skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
