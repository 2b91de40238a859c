// cuda_ops.h: the CUDA backend of the op interface (kernels/ops.h): bf16 or fp16 storage, fp32 accumulation.
// Host-only header: it can be included from plain C++ code of a build with MGRL_WITH_CUDA.
#pragma once
#include <memory>

#include "core/dtype.h"
#include "kernels/ops.h"

namespace mgrl::kernels {

// Ops on CUDA device `device`, storage dtype chosen by its compute capability: bf16 on sm_80 and newer, fp16
// before (V100 and T4 have no bf16). Owns a non-blocking stream and a cuBLAS handle bound to it; every op is
// queued on that stream without host synchronisation (download, download_storage_as_f32, synchronize, alloc and
// release synchronise).
std::unique_ptr<Ops> make_cuda_ops(int device);

// The same with the storage dtype forced: DType::F16 (any device), or DType::BF16 (sm_80 and newer). Tests use it
// to run the fp16 kernels on a bf16-capable GPU.
std::unique_ptr<Ops> make_cuda_ops(int device, DType storage);

// Which attention kernels Ops::attention_forward / attention_backward run on the current CUDA device for this
// storage dtype and head_dim (16-byte aligned tensors), under the current MGRL_CUDA_ATTENTION: "tiled" (mma.sync,
// sm_75+), "sm70" (wmma, Volta's kernels) or "naive" (the fallback). Tests use it to make sure a forced path runs.
const char* cuda_attention_kernels(DType storage, int head_dim);

}  // namespace mgrl::kernels
