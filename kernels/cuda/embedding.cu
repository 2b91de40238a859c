// embedding.cu: token embedding lookup (gather rows of a [V, D] table) and its backward (f32 scatter-add).
#include "kernels/cuda/embedding.cuh"

namespace mgrl::kernels::cuda {
namespace {

// One thread per output element (t, d), grid-stride.
template <class S>
__global__ void embedding_forward_kernel(S* out, const std::int32_t* ids, const S* table, int T, int V, int D,
                                         float scale, int* err) {
  pdl_wait();  // launched with PDL when MGRL_PDL=1 (common.cuh): nothing before this reads or writes memory
  pdl_launch_dependents();
  scale = to_f32(from_f32<S>(scale));  // the scale in the storage dtype
  const std::int64_t n = static_cast<std::int64_t>(T) * D;
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const std::int64_t t = i / D, d = i % D;
    const std::int32_t id = ids[t];
    if (id >= V) {
      if (d == 0) atomicOr(err, kErrTokenId);
      out[i] = from_f32<S>(0.0f);
    } else if (id < 0) {
      out[i] = from_f32<S>(0.0f);
    } else {
      const S e = table[static_cast<std::int64_t>(id) * D + d];
      out[i] = scale == 1.0f ? e : from_f32<S>(to_f32(e) * scale);
    }
  }
}

// One thread per element (t, d) of dout, fp32 atomicAdd into dtable[ids[t], d] (rows with the same id add up;
// the order of the additions, hence the last bits, is not deterministic).
template <class S>
__global__ void embedding_backward_kernel(float* dtable, const S* dout, const std::int32_t* ids, int T, int V, int D,
                                          float scale, int* err) {
  scale = to_f32(from_f32<S>(scale));  // the scale in the storage dtype
  const std::int64_t n = static_cast<std::int64_t>(T) * D;
  for (std::int64_t i = gs_begin(); i < n; i += gs_stride()) {
    const std::int64_t t = i / D, d = i % D;
    const std::int32_t id = ids[t];
    if (id >= V) {
      if (d == 0) atomicOr(err, kErrTokenId);
      continue;
    }
    if (id < 0) continue;
    atomicAdd(dtable + static_cast<std::int64_t>(id) * D + d, scale * to_f32(dout[i]));
  }
}

}  // namespace

void embedding_forward(const Ctx& c, void* out, const std::int32_t* ids, const void* table, int T, int V, int D,
                       float scale) {
  const std::int64_t n = static_cast<std::int64_t>(T) * D;
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    launch(pdl_enabled(), embedding_forward_kernel<S>, grid_for(n), kThreads, 0, c.stream, static_cast<S*>(out), ids,
           static_cast<const S*>(table), T, V, D, scale, c.err);
  });
}

void embedding_backward(const Ctx& c, float* dtable, const void* dout, const std::int32_t* ids, int T, int V, int D,
                        float scale) {
  const std::int64_t n = static_cast<std::int64_t>(T) * D;
  if (n <= 0) return;
  dispatch(c.st, [&](auto tag) {
    using S = decltype(tag);
    embedding_backward_kernel<S><<<grid_for(n), kThreads, 0, c.stream>>>(dtable, static_cast<const S*>(dout), ids, T,
                                                                           V, D, scale, c.err);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mgrl::kernels::cuda
