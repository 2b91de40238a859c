// block.cpp: the decoder block's forward over kernels::Ops and the LoRA term of a linear layer.
#include "model/block.h"

#include "core/env.h"
#include "core/error.h"

namespace mgrl::model {

bool fused_norm_enabled() {
  static const bool on = env::switch_on_logged(
      "MGRL_FUSED_NORM", "MGRL_FUSED_NORM=0: the residual adds and the MLP norm run as separate ops (copy, add, norm)");
  return on;
}

void block_forward(const ModelDef& def, int l, const BlockIO& io, int T, const BlockLinear& lin,
                   const std::function<void()>& attend, const BlockFusion* fusion) {
  const io::ModelConfig& cfg = def.config();
  kernels::Ops& ops = def.ops();
  const LayerWeights& Lw = def.layer(l);
  const int D = static_cast<int>(cfg.hidden_size), I = static_cast<int>(cfg.intermediate_size);
  const int nh = static_cast<int>(cfg.num_attention_heads), nkv = static_cast<int>(cfg.num_key_value_heads);
  const int hd = static_cast<int>(cfg.head_dim);
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  const std::size_t S = ops.storage_size();
  const bool unit = def.unit_offset_norms(), post = cfg.gemma, fused = fused_norm_enabled();

  const Module qkv[] = {Module::Q, Module::K, Module::V};
  void* const qkv_out[] = {cfg.qk_norm ? io.q_pre : io.q, cfg.qk_norm ? io.k_pre : io.k, io.v};
  if (!fusion || !fusion->norm_qkv || !fusion->norm_qkv(io.x_in, Lw.attn_norm, qkv_out)) {
    ops.rmsnorm_forward(io.h1, io.rstd1, io.x_in, Lw.attn_norm, T, D, eps, unit);
    lin(qkv, qkv_out, 3, io.h1);
  }
  if (cfg.qk_norm) {
    ops.rmsnorm_forward(io.q, io.rstd_q, io.q_pre, Lw.q_norm, T * nh, hd, eps, unit);
    ops.rmsnorm_forward(io.k, io.rstd_k, io.k_pre, Lw.k_norm, T * nkv, hd, eps, unit);
  }
  if (!fusion || !fusion->rope_in_attend) {
    ops.rope_forward(io.q, io.pos, def.inv_freq(l), T, nh, hd);
    ops.rope_forward(io.k, io.pos, def.inv_freq(l), T, nkv, hd);
  }
  attend();
  const bool mlp_done = !post && fusion && fusion->o_residual_mlp &&
                        fusion->o_residual_mlp(io.attn, io.x_mid, io.x_in, Lw.mlp_norm, io.act);
  if (!mlp_done) {
    const Module o = Module::O;
    void* const o_out = post ? io.o_raw : io.tmp;
    lin(&o, &o_out, 1, io.attn);
    if (post) ops.rmsnorm_forward(io.tmp, io.rstd_pa, io.o_raw, Lw.post_attn_norm, T, D, eps, unit);
    if (fused) {
      ops.residual_rmsnorm_forward(io.x_mid, io.h2, io.rstd2, io.x_in, io.tmp, Lw.mlp_norm, T, D, eps, unit);
    } else {
      ops.copy(io.x_mid, io.x_in, static_cast<std::size_t>(T) * D * S);  // no-op when in place
      ops.residual_forward(io.x_mid, io.tmp, static_cast<std::int64_t>(T) * D);
      ops.rmsnorm_forward(io.h2, io.rstd2, io.x_mid, Lw.mlp_norm, T, D, eps, unit);
    }
  }
  if (!mlp_done && (!fusion || !fusion->gate_up_act || !fusion->gate_up_act(io.h2, io.act))) {
    const Module gate_up[] = {Module::Gate, Module::Up};
    void* const gate_up_out[] = {io.gate, io.up};
    lin(gate_up, gate_up_out, 2, io.h2);
    if (def.geglu())
      ops.geglu_forward(io.act, io.gate, io.up, static_cast<std::int64_t>(T) * I);
    else
      ops.swiglu_forward(io.act, io.gate, io.up, static_cast<std::int64_t>(T) * I);
  }
  if (!post && fusion && fusion->down_residual && fusion->down_residual(io.act, io.x_out, io.x_mid)) return;
  const Module down = Module::Down;
  void* const down_out = post ? io.m_raw : io.tmp;
  lin(&down, &down_out, 1, io.act);
  if (post) ops.rmsnorm_forward(io.tmp, io.rstd_pm, io.m_raw, Lw.post_mlp_norm, T, D, eps, unit);
  if (fused) {
    ops.residual_add(io.x_out, io.x_mid, io.tmp, static_cast<std::int64_t>(T) * D);
  } else {
    ops.copy(io.x_out, io.x_mid, static_cast<std::size_t>(T) * D * S);
    ops.residual_forward(io.x_out, io.tmp, static_cast<std::int64_t>(T) * D);
  }
}

void lora_add(const ModelDef& def, int l, Module m, void* y, const void* x, int T, float* xa) {
  const LoraParams* lora = def.lora();
  const LoraSlot* s = lora ? lora->find(l, m) : nullptr;
  if (!s) return;
  def.ops().lora_forward(y, xa, x, lora->A(*s), lora->B(*s), lora->config().scale(), T, module_in(def.config(), m),
                         lora->config().r, module_out(def.config(), m));
}

void lora_add_group(const ModelDef& def, int l, const Module* ms, void* const* ys, int n, const void* x, int T,
                    float* const* xa, float* scratch) {
  const LoraParams* lora = def.lora();
  if (!lora) return;
  if (!lora_groups_enabled()) {
    for (int i = 0; i < n; ++i) lora_add(def, l, ms[i], ys[i], x, T, xa[i]);
    return;
  }
  kernels::LoraMember g[kernels::kMaxLoraGroup];
  const LoraSlot* slot[kernels::kMaxLoraGroup];
  int idx[kernels::kMaxLoraGroup];
  const int k = lora_members(*lora, l, ms, n, g, slot, idx);
  for (int j = 0; j < k; ++j) {
    g[j].y = ys[idx[j]];
    g[j].xa = xa[idx[j]];
  }
  if (k == 0) return;
  if (k == 1) return lora_add(def, l, ms[idx[0]], ys[idx[0]], x, T, xa[idx[0]]);
  def.ops().lora_group_forward(g, k, x, T, module_in(def.config(), ms[0]), lora->config().r, scratch);
}

int lora_members(const LoraParams& lora, int l, const Module* ms, int n, kernels::LoraMember* g,
                 const LoraSlot** slot, int* idx) {
  int k = 0;
  for (int i = 0; i < n; ++i) {
    const LoraSlot* s = lora.find(l, ms[i]);
    if (!s) continue;  // not targeted
    MGRL_CHECK(k < kernels::kMaxLoraGroup, "a LoRA group of more than three layers");
    g[k] = kernels::LoraMember{};
    g[k].A = lora.A(*s);
    g[k].B = lora.B(*s);
    g[k].scale = lora.config().scale();
    g[k].out = s->out;
    slot[k] = s;
    idx[k] = i;
    ++k;
  }
  return k;
}

}  // namespace mgrl::model
