// block.h: one decoder block's forward (norms, q/k/v, rotary, attention, MLP, residuals), shared by the training
// executor and the inference engine, and the LoRA term added to a linear layer's output.
#pragma once
#include <cstdint>
#include <functional>

#include "model/model_def.h"

namespace mgrl::model {

// The buffers of one pass through a decoder block (training keeps them per layer; inference reuses one set,
// with the residual stream updated in place: x_in == x_mid == x_out). Storage dtype unless f32.
// Gemma's norms after attention and MLP read o_raw / m_raw (the o and down projections' outputs; may be tmp itself:
// the norm then runs in place) into tmp, saving rstd_pa / rstd_pm; unused (null) for the other families.
struct BlockIO {
  const void* x_in;
  void *x_mid, *x_out, *h1, *q, *k, *v, *q_pre, *k_pre, *attn, *h2, *gate, *up, *act, *tmp;
  float *rstd1, *rstd_q, *rstd_k, *rstd2;
  const std::int32_t* pos;
  void *o_raw = nullptr, *m_raw = nullptr;
  float *rstd_pa = nullptr, *rstd_pm = nullptr;
};

// The linear layers of the block that read one input x: n (1 to 3) modules ms[i] with outputs ys[i] (q, k, v; o;
// gate, up; down), each with its adapter as the caller decides.
using BlockLinear = std::function<void(const Module* ms, void* const* ys, int n, const void* x)>;

// Whether block_forward fuses its residual adds: x_mid = x_in + attention output and the MLP norm of x_mid in one op
// (Ops::residual_rmsnorm_forward), x_out = x_mid + MLP output out of place (Ops::residual_add, no copy first). Yes
// unless the environment sets MGRL_FUSED_NORM=0 (read once; logged), which runs copy, residual_forward and
// rmsnorm_forward as before (and the CUDA backend's RMSNorm kernels of before: kernels/cuda/rmsnorm.cuh). Both give
// the same bits on the CPU backend.
bool fused_norm_enabled();

// Parts of the block a caller may run fused (the inference engine's decode ops; training passes none). Each hook,
// when set, returns true when it did the work and false to let the block run its separate ops.
struct BlockFusion {
  // attend() applies RoPE to io.q and io.k itself (with the KV store: Ops::rope_kv_store); the block does not.
  bool rope_in_attend = false;
  // io.act = activation(x Wg^T) * (x Wu^T) for x = io.h2, in place of the gate and up layers and the activation.
  std::function<bool(const void* x, void* act)> gate_up_act;
  // x_out = x_mid + x Wd^T for x = io.act, in place of the down layer and the residual add (never called with
  // Gemma's post-norms, whose residual adds a normalised output).
  std::function<bool(const void* x, void* x_out, const void* x_mid)> down_residual;
  // The q, k, v layers' outputs ys from x_in with the attention norm (weight norm_w) folded in, in place of that norm
  // and the q|k|v layers (io.h1 not written).
  std::function<bool(const void* x_in, const void* norm_w, void* const* ys)> norm_qkv;
  // The attention output's o layer and residual add, x_mid = x_in + attn Wo^T, and then io.act from x_mid with the
  // MLP norm (weight norm_w) folded into the gate and up layers and the activation: in place of o, the residual add
  // with the MLP norm, gate, up and the activation (io.h2, io.gate, io.up not written). All or nothing: false means
  // none of it was done (never called with Gemma's post-norms).
  std::function<bool(const void* attn, void* x_mid, const void* x_in, const void* norm_w, void* act)> o_residual_mlp;
};

// Decoder block l over T rows: lin applies the linear layers, attend() fills io.attn from io.q / io.k / io.v (plain
// causal attention in training, the KV cache in inference); fusion (may be null) takes over parts of it.
void block_forward(const ModelDef& def, int l, const BlockIO& io, int T, const BlockLinear& lin,
                   const std::function<void()>& attend, const BlockFusion* fusion = nullptr);

// y += the adapter of (l, m) applied to x (xa: its [T, r] f32 intermediate x A^T); nothing without one.
void lora_add(const ModelDef& def, int l, Module m, void* y, const void* x, int T, float* xa);

// ys[i] += the adapter of (l, ms[i]) applied to x, for the n modules that read x (xa[i]: module i's [T, r]
// intermediate). The modules with an adapter run as one group (Ops::lora_group_forward, scratch as
// kernels::lora_group_scratch_floats says) when lora_groups_enabled() and there are two or more, else one by one.
void lora_add_group(const ModelDef& def, int l, const Module* ms, void* const* ys, int n, const void* x, int T,
                    float* const* xa, float* scratch);

// The adapters that exist among (l, ms[0..n)) as group members g[0..k): A, B, scale and out filled (the rest left
// to the caller), slot[k] the adapter and idx[k] the index i of its module. Returns k (0..n).
int lora_members(const LoraParams& lora, int l, const Module* ms, int n, kernels::LoraMember* g,
                 const LoraSlot** slot, int* idx);

}  // namespace mgrl::model
