// bench_attention.cu: times the CUDA training attention, the tensor-core kernels (flash_attention.cu, and the Volta
// wmma kernels of flash_attention_sm70.cu where they run) against the straightforward ones (attention_*_naive),
// forward and backward, at model shapes; prints ms per call, achieved TFLOP/s (causal FLOPs: forward
// 4 * B * n_heads * L^2 * head_dim / 2, backward 2.5x that) and the speedups, and the relative difference of each
// tensor-core path's outputs from the naive kernels'. Every sequence is full (length L), packed as the op takes
// them: cu_seqlens = b * L, T = B * L, max_len = L.
//   build/perf/bench_attention [reps]        (default 10 timed calls per kernel after 2 warm-up calls; median)
// The Volta kernels (fp16 only) are timed where the mma.sync ones do not run (sm_70, or a build for compute_70
// alone), and on any newer GPU with MGRL_CUDA_ATTENTION=sm70, which also runs every shape in fp16, so that one run
// on the same GPU compares them with the mma.sync kernels ("sm70 / tiled" lines):
//   MGRL_CUDA_ATTENTION=sm70 build/perf/bench_attention 20
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "core/check_cuda.h"
#include "perf/cuda_timing.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/flash_attention_sm70.cuh"

namespace {

using namespace mgrl;
using namespace mgrl::kernels::cuda;

// Uniform values in [lo, hi) from a hash of (seed, i), in the storage type.
template <class S>
__global__ void fill_kernel(S* x, std::int64_t n, std::uint32_t seed, float lo, float hi) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ (seed * 0x9e3779b9u);
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    x[i] = from_f32<S>(lo + (hi - lo) * static_cast<float>(h >> 8) * (1.0f / 16777216.0f));
  }
}

template <class S>
__global__ void to_f32_kernel(float* y, const S* x, std::int64_t n) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) y[i] = to_f32(x[i]);
}

struct Shape {
  const char* name;
  int B, L, nh, nkv, hd;
};

using mgrl::perf::time_ms;

// Relative 2-norm difference of two device tensors of n storage values.
template <class S>
double rel_diff(const void* x, const void* ref, std::int64_t n, cudaStream_t s) {
  float *fx = nullptr, *fr = nullptr;
  CUDA_CHECK(cudaMalloc(&fx, n * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&fr, n * sizeof(float)));
  to_f32_kernel<S><<<grid_for(n), kThreads, 0, s>>>(fx, static_cast<const S*>(x), n);
  to_f32_kernel<S><<<grid_for(n), kThreads, 0, s>>>(fr, static_cast<const S*>(ref), n);
  std::vector<float> hx(n), hr(n);
  CUDA_CHECK(cudaMemcpyAsync(hx.data(), fx, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaMemcpyAsync(hr.data(), fr, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaFree(fx));
  CUDA_CHECK(cudaFree(fr));
  double num = 0.0, den = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(hx[i]) - hr[i];
    num += d * d;
    den += static_cast<double>(hr[i]) * hr[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// A tensor-core path: its name and its two entry points.
struct Path {
  const char* name;
  std::function<void()> fwd, bwd;
};

template <class S>
void bench(const Shape& sh, DType st, int reps, cudaStream_t stream, int* err) {
  const std::int64_t nq = static_cast<std::int64_t>(sh.B) * sh.L * sh.nh * sh.hd;
  const std::int64_t nk = static_cast<std::int64_t>(sh.B) * sh.L * sh.nkv * sh.hd;
  const std::int64_t nl = static_cast<std::int64_t>(sh.B) * sh.nh * sh.L;  // lse [nh, T]
  std::vector<void*> bufs;
  auto alloc = [&](std::int64_t bytes) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, static_cast<std::size_t>(bytes)));
    bufs.push_back(p);
    return p;
  };
  constexpr int kNaive = 0;  // output buffers: [0] naive, [1 + i] tensor-core path i
  void* q = alloc(nq * 2);
  void* k = alloc(nk * 2);
  void* v = alloc(nk * 2);
  void* dout = alloc(nq * 2);
  void *out[3], *dq[3], *dk[3], *dv[3];
  float* lse[3];
  for (int i = 0; i < 3; ++i) {
    out[i] = alloc(nq * 2);
    dq[i] = alloc(nq * 2);
    dk[i] = alloc(nk * 2);
    dv[i] = alloc(nk * 2);
    lse[i] = static_cast<float*>(alloc(nl * 4));
  }
  auto* cu_seqlens = static_cast<std::int32_t*>(alloc((sh.B + 1) * 4));
  std::vector<std::int32_t> hcu(static_cast<std::size_t>(sh.B) + 1);
  for (int b = 0; b <= sh.B; ++b) hcu[static_cast<std::size_t>(b)] = b * sh.L;
  CUDA_CHECK(cudaMemcpy(cu_seqlens, hcu.data(), hcu.size() * 4, cudaMemcpyHostToDevice));
  fill_kernel<S><<<grid_for(nq), kThreads, 0, stream>>>(static_cast<S*>(q), nq, 1, -2.0f, 2.0f);
  fill_kernel<S><<<grid_for(nk), kThreads, 0, stream>>>(static_cast<S*>(k), nk, 2, -2.0f, 2.0f);
  fill_kernel<S><<<grid_for(nk), kThreads, 0, stream>>>(static_cast<S*>(v), nk, 3, -1.0f, 1.0f);
  fill_kernel<S><<<grid_for(nq), kThreads, 0, stream>>>(static_cast<S*>(dout), nq, 4, -1.0f, 1.0f);
  CUDA_CHECK(cudaStreamSynchronize(stream));

  const Ctx c{st, stream, nullptr, err};
  const int B = sh.B, L = sh.L, T = B * L, nh = sh.nh, nkv = sh.nkv, hd = sh.hd;
  const std::initializer_list<const void*> tensors = {q, k, v, dout, out[1], dq[1], dk[1], dv[1],
                                                      out[2], dq[2], dk[2], dv[2]};
  std::vector<Path> paths;
  const bool tiled = flash_attention_applies(st, hd, tensors);
  if (tiled) {
    const int i = 1 + static_cast<int>(paths.size());
    paths.push_back({"tiled",
                     [&, i] { flash_attention_forward(c, out[i], lse[i], q, k, v, cu_seqlens, B, T, L, nh, nkv, hd); },
                     [&, i] {
                       flash_attention_backward(c, dq[i], dk[i], dv[i], dout, out[i], q, k, v, lse[i], cu_seqlens, B,
                                                T, L, nh, nkv, hd);
                     }});
  }
  if ((flash_attention_sm70_forced() || !tiled) && flash_attention_sm70_applies(st, hd, tensors)) {
    const int i = 1 + static_cast<int>(paths.size());
    paths.push_back({"sm70",
                     [&, i] {
                       flash_attention_sm70_forward(c, out[i], lse[i], q, k, v, cu_seqlens, B, T, L, nh, nkv, hd);
                     },
                     [&, i] {
                       flash_attention_sm70_backward(c, dq[i], dk[i], dv[i], dout, out[i], q, k, v, lse[i],
                                                     cu_seqlens, B, T, L, nh, nkv, hd);
                     }});
  }
  if (paths.empty()) {
    std::printf("%-14s %s: no tensor-core attention kernels apply on this GPU\n", sh.name, dtype_name(st));
    for (void* p : bufs) CUDA_CHECK(cudaFree(p));
    return;
  }
  auto fwd_old = [&] {
    attention_forward_naive(c, out[kNaive], lse[kNaive], q, k, v, cu_seqlens, B, T, L, nh, nkv, hd);
  };
  auto bwd_old = [&] {
    attention_backward_naive(c, dq[kNaive], dk[kNaive], dv[kNaive], dout, q, k, v, lse[kNaive], cu_seqlens, B, T,
                             L, nh, nkv, hd);
  };
  const int reps_old = std::max(3, reps / 2);
  std::vector<double> tf, tb;
  for (const Path& p : paths) {
    tf.push_back(time_ms(stream, reps, p.fwd));
    tb.push_back(time_ms(stream, reps, p.bwd));
  }
  const double tf_old = time_ms(stream, reps_old, fwd_old), tb_old = time_ms(stream, reps_old, bwd_old);
  int herr = 0;
  CUDA_CHECK(cudaMemcpy(&herr, err, sizeof(int), cudaMemcpyDeviceToHost));
  if (herr != 0) std::printf("device error word %d\n", herr);

  const double flop_f = 4.0 * B * nh * static_cast<double>(L) * L * hd / 2.0, flop_b = 2.5 * flop_f;
  auto tflops = [](double flop, double ms) { return flop / (ms * 1e-3) / 1e12; };
  std::printf("%-14s %s B%d L%d h%d/%d d%d\n", sh.name, dtype_name(st), B, L, nh, nkv, hd);
  for (std::size_t i = 0; i < paths.size(); ++i) {
    std::printf("  forward   %-5s %8.3f ms %6.1f TFLOP/s | naive %8.3f ms %6.1f TFLOP/s | speedup %6.1fx\n",
                paths[i].name, tf[i], tflops(flop_f, tf[i]), tf_old, tflops(flop_f, tf_old), tf_old / tf[i]);
    std::printf("  backward  %-5s %8.3f ms %6.1f TFLOP/s | naive %8.3f ms %6.1f TFLOP/s | speedup %6.1fx\n",
                paths[i].name, tb[i], tflops(flop_b, tb[i]), tb_old, tflops(flop_b, tb_old), tb_old / tb[i]);
  }
  if (paths.size() == 2)
    std::printf("  %s / %s time: forward %.2fx, backward %.2fx\n", paths[1].name, paths[0].name, tf[1] / tf[0],
                tb[1] / tb[0]);
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const int j = 1 + static_cast<int>(i);
    std::printf("  %s vs naive, rel. 2-norm difference: out %.2e  dq %.2e  dk %.2e  dv %.2e\n", paths[i].name,
                rel_diff<S>(out[j], out[kNaive], nq, stream), rel_diff<S>(dq[j], dq[kNaive], nq, stream),
                rel_diff<S>(dk[j], dk[kNaive], nk, stream), rel_diff<S>(dv[j], dv[kNaive], nk, stream));
  }
  std::fflush(stdout);
  for (void* p : bufs) CUDA_CHECK(cudaFree(p));
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 10;
  if (!perf::have_cuda_device("bench_attention")) return 0;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("bench_attention on %s (sm_%d%d), median of %d calls\n", prop.name, prop.major, prop.minor, reps);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int* err = nullptr;
  CUDA_CHECK(cudaMalloc(&err, sizeof(int)));
  CUDA_CHECK(cudaMemset(err, 0, sizeof(int)));
  const Shape shapes[] = {
      {"qwen2.5-0.5b", 8, 1024, 14, 2, 64},
      {"qwen2.5-0.5b", 32, 256, 14, 2, 64},
      {"qwen2.5-1.5b", 8, 1024, 12, 2, 128},
      {"qwen2.5-7b", 4, 1024, 28, 4, 128},
      {"llama-8b", 4, 2048, 32, 8, 128},
  };
  for (const Shape& s : shapes) {
    if (prop.major >= 8) bench<__nv_bfloat16>(s, DType::BF16, reps, stream, err);
  }
  // fp16: the first shape, or every shape when the Volta kernels are asked for (they store fp16 only).
  const bool all_fp16 = flash_attention_sm70_forced() || prop.major < 8;
  for (const Shape& s : shapes) {
    bench<__half>(s, DType::F16, reps, stream, err);
    if (!all_fp16) break;
  }
  CUDA_CHECK(cudaFree(err));
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
