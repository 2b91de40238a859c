// swiglu.cu: the gated MLP activations, SwiGLU (Llama/Qwen: silu(gate) * up) and GeGLU (Gemma: gelu_tanh(gate) *
// up), and their backwards (elementwise).
#include "kernels/cuda/swiglu.cuh"

#include "kernels/cuda/gemm.cuh"

namespace mgrl::kernels::cuda {
namespace {

// One thread per element, grid-stride; every input of element i is read before element i is written, so the
// allowed aliasing is safe. fp32 math with the accurate expf.
template <class S>
__global__ void swiglu_forward_kernel(S* out, const S* gate, const S* up, std::int64_t n) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    out[i] = from_f32<S>(swiglu_value(to_f32(gate[i]), to_f32(up[i])));
  }
}

template <class S>
__global__ void swiglu_backward_kernel(S* dgate, S* dup, const S* dout, const S* gate, const S* up, std::int64_t n) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const float g = to_f32(gate[i]), u = to_f32(up[i]), d = to_f32(dout[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    const float silu = g * sig;
    dgate[i] = from_f32<S>(d * u * sig * (1.0f + g * (1.0f - sig)));
    dup[i] = from_f32<S>(d * silu);
  }
}

template <class S>
__global__ void geglu_forward_kernel(S* out, const S* gate, const S* up, std::int64_t n) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    out[i] = from_f32<S>(geglu_value(to_f32(gate[i]), to_f32(up[i])));
  }
}

template <class S>
__global__ void geglu_backward_kernel(S* dgate, S* dup, const S* dout, const S* gate, const S* up, std::int64_t n) {
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const float g = to_f32(gate[i]), u = to_f32(up[i]), d = to_f32(dout[i]);
    const float t = tanhf(kGeluC * (g + kGeluA * g * g * g));
    const float dgelu = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * g * g);
    dgate[i] = from_f32<S>(d * u * dgelu);
    dup[i] = from_f32<S>(d * 0.5f * g * (1.0f + t));
  }
}

// act[t, i] = f(y[t, i]) * y[t, I + i] for y [T, 2I] (gate | up per row), one thread per element of act.
template <class S, bool kGeglu>
__global__ void gated_stacked_kernel(S* act, const S* y, int I, std::int64_t n) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const std::int64_t t = i / I, c = i % I;
    const float g = to_f32(y[t * 2 * I + c]), u = to_f32(y[t * 2 * I + I + c]);
    act[i] = from_f32<S>(kGeglu ? geglu_value(g, u) : swiglu_value(g, u));
  }
}

}  // namespace

bool gated_mlp_stacked(const Ctx& c, void* act, const void* x, const void* Wg, const void* Wu, int T, int in, int I,
                       bool geglu) {
  const std::size_t S = c.st == DType::F32 ? 4 : 2;
  if (static_cast<const char*>(Wu) != static_cast<const char*>(Wg) + static_cast<std::size_t>(I) * in * S) return false;
  const std::int64_t n = static_cast<std::int64_t>(T) * I;
  if (n <= 0 || in <= 0) return n <= 0;
  void* y = scratch_alloc(static_cast<std::size_t>(n) * 2 * S, c.stream);
  gemm_rm(c.blas, false, true, T, 2 * I, in, 1.0f, x, c.st, in, Wg, c.st, in, 0.0f, y, c.st, 2 * I);
  dispatch(c.st, [&](auto tag) {
    using St = decltype(tag);
    launch(pdl_enabled(), geglu ? gated_stacked_kernel<St, true> : gated_stacked_kernel<St, false>, grid_for(n),
           kThreads, 0, c.stream, static_cast<St*>(act), static_cast<const St*>(y), I, n);
  });
  scratch_free(y, c.stream);
  return true;
}

void geglu_forward(const Ctx& c, void* out, const void* gate, const void* up, std::int64_t n) {
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    launch(pdl_enabled(), geglu_forward_kernel<S>, grid_for(n), kThreads, 0, c.stream, static_cast<S*>(out),
           static_cast<const S*>(gate), static_cast<const S*>(up), n);
  });
}

void geglu_backward(const Ctx& c, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                    std::int64_t n) {
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    geglu_backward_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(
        static_cast<S*>(dgate), static_cast<S*>(dup), static_cast<const S*>(dout), static_cast<const S*>(gate),
        static_cast<const S*>(up), n);
    CUDA_CHECK_LAUNCH();
  });
}

void swiglu_forward(const Ctx& c, void* out, const void* gate, const void* up, std::int64_t n) {
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    launch(pdl_enabled(), swiglu_forward_kernel<S>, grid_for(n), kThreads, 0, c.stream, static_cast<S*>(out),
           static_cast<const S*>(gate), static_cast<const S*>(up), n);
  });
}

void swiglu_backward(const Ctx& c, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                     std::int64_t n) {
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    swiglu_backward_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(
        static_cast<S*>(dgate), static_cast<S*>(dup), static_cast<const S*>(dout), static_cast<const S*>(gate),
        static_cast<const S*>(up), n);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mgrl::kernels::cuda
