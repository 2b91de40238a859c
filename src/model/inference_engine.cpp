// inference_engine.cpp: the KV-cache forward (embedding, decoder blocks over the paged cache, final norm, logits of
// the output rows) and its work buffers.
#include "model/inference_engine.h"

#include <algorithm>
#include <string>

#include "core/env.h"
#include "core/error.h"
#include "model/block.h"

namespace mgrl::model {

bool decode_fused_enabled() {
  static const bool on = env::switch_on_logged("MGRL_DECODE_FUSED",
                                               "MGRL_DECODE_FUSED=0: inference runs RoPE, the KV store, each "
                                               "projection and its epilogue as separate ops");
  return on;
}

bool decode_norm_fold_enabled() {
  static const bool on = env::opt_in_logged(
      "MGRL_DECODE_NORM_FOLD", "MGRL_DECODE_NORM_FOLD=1: the decode norms folded into the GEMVs after them");
  return on;
}

// Buffers of infer(), sized for the largest call seen (storage dtype unless f32 / i32).
struct InferenceEngine::Buffers {
  int cap_T = 0, cap_R = 0;
  std::vector<void*> allocations;
  void *x, *h, *q, *k, *v, *q_pre, *k_pre, *attn, *tmp, *gate, *up, *act, *hsel;
  float *rstd, *xa, *lora_scratch, *logits;
  std::int32_t *ids, *slot, *pos, *rows;
};

InferenceEngine::InferenceEngine(ModelDef& def) : def_(def), cfg_(def.config()), ops_(def.ops()) {}

InferenceEngine::~InferenceEngine() {
  ops_.forget_recordings();  // decode recordings use this model's buffers
  if (buf_)
    for (void* p : buf_->allocations) ops_.release(p);
  if (merged_mem_) ops_.release(merged_mem_);
}

void InferenceEngine::reset() {
  release_merged();
  merge_failed_ = false;
  if (!buf_) return;
  ops_.forget_recordings();
  for (void* p : buf_->allocations) ops_.release(p);
  buf_.reset();
}

void InferenceEngine::release_merged() {
  merged_ = false;
  if (!merged_mem_) return;
  ops_.forget_recordings();  // merged decode recordings read the copy
  ops_.release(merged_mem_);
  merged_mem_ = nullptr;
  merged_w_.clear();
}

namespace {
// Visits the adapted projections of every layer in merged-copy order with their byte offset into the copy; returns
// the copy's size.
std::size_t merged_layout(const io::ModelConfig& c, std::size_t S, const std::function<bool(int, Module)>& adapted,
                          const std::function<void(int, Module, std::size_t)>& visit) {
  std::size_t at = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (int mi = 0; mi < kNumModules; ++mi) {
      const auto m = static_cast<Module>(mi);
      if (!adapted(l, m)) continue;
      if (visit) visit(l, m, at);
      const std::size_t bytes = static_cast<std::size_t>(module_out(c, m)) *
                                static_cast<std::size_t>(module_in(c, m)) * S;
      at += (bytes + 255) / 256 * 256;
    }
  return at;
}
}  // namespace

std::size_t InferenceEngine::merged_bytes(const io::ModelConfig& c, std::size_t storage, const LoraConfig& lora) {
  return merged_layout(
      c, storage,
      [&](int, Module m) {
        return std::find(lora.targets.begin(), lora.targets.end(), module_name(m)) != lora.targets.end();
      },
      {});
}

bool InferenceEngine::merge_lora(bool required) {
  merged_ = false;
  const LoraParams* lora = def_.lora();
  if (!lora || (merge_failed_ && !required)) return false;
  MGRL_CHECK(!def_.sharded() && !def_.quantized(), "LoRA merged for sampling needs a dense, unsharded base");
  const std::size_t S = ops_.storage_size();
  const auto adapted = [&](int l, Module m) { return lora->find(l, m) != nullptr; };
  if (!merged_mem_) {
    const std::size_t bytes = merged_layout(cfg_, S, adapted, {});
    // Not required ("auto"): only a copy of at most kMergeShare of the free memory, so that the KV pool and the
    // training arena (allocated after the first generation) keep what they had before merging existed.
    const std::size_t free = ops_.available_memory();
    if (!required && free > 0 && bytes > free / kMergeShare) {
      merge_failed_ = true;
      return false;
    }
    try {
      merged_mem_ = ops_.alloc(bytes);
    } catch (const OutOfMemory&) {
      if (required) throw;
      merge_failed_ = true;
      return false;
    }
    merged_w_.assign(static_cast<std::size_t>(cfg_.num_hidden_layers) * kNumModules, nullptr);
    merged_layout(cfg_, S, adapted, [&](int l, Module m, std::size_t at) {
      merged_w_[static_cast<std::size_t>(l) * kNumModules + static_cast<std::size_t>(m)] =
          static_cast<char*>(merged_mem_) + at;
    });
  }
  const float scale = lora->config().scale();
  for (const LoraSlot& s : lora->slots()) {
    void* Wm = merged_w_[static_cast<std::size_t>(s.layer) * kNumModules + static_cast<std::size_t>(s.module)];
    MGRL_CHECK(Wm != nullptr, "merge_lora: an adapter outside the merged copy's layout");
    const void* W = def_.dense(def_.layer_handles(s.layer).W[static_cast<int>(s.module)]);
    ops_.lora_merge(Wm, W, lora->A(s), lora->B(s), scale, s.out, s.in, lora->config().r);
  }
  merged_ = true;
  return true;
}

void InferenceEngine::reserve(int T, int R) {
  if (!buf_) buf_ = std::make_unique<Buffers>();
  Buffers& I = *buf_;
  if (T <= I.cap_T && R <= I.cap_R) return;
  ops_.forget_recordings();  // recorded decode steps use these buffers
  for (void* p : I.allocations) ops_.release(p);
  I.allocations.clear();
  I.cap_T = std::max(T, I.cap_T);
  I.cap_R = std::max(R, I.cap_R);
  lay_out(cfg_, ops_.storage_size(), def_.lora() ? def_.lora()->config().r : 0, static_cast<std::size_t>(I.cap_T),
          static_cast<std::size_t>(I.cap_R), I, [&](std::size_t bytes) {
            void* p = ops_.alloc(bytes);
            I.allocations.push_back(p);
            return p;
          });
}

std::size_t InferenceEngine::workspace_bytes(const io::ModelConfig& c, std::size_t storage, int lora_r, int T,
                                             int R) {
  Buffers counted;
  std::size_t total = 0;
  lay_out(c, storage, lora_r, static_cast<std::size_t>(std::max(T, 0)), static_cast<std::size_t>(std::max(R, 0)),
          counted, [&](std::size_t bytes) -> void* {
            total += bytes;
            return nullptr;
          });
  return total;
}

void InferenceEngine::lay_out(const io::ModelConfig& c, std::size_t S, int lora_r, std::size_t t, std::size_t r,
                              Buffers& I, const std::function<void*(std::size_t)>& buf) {
  const std::size_t D = c.hidden_size, Q = c.q_dim(), K = c.kv_dim(), In = c.intermediate_size;
  I.x = buf(t * D * S);
  I.h = buf(t * D * S);
  I.q = buf(t * Q * S);
  I.k = buf(t * K * S);
  I.v = buf(t * K * S);
  I.q_pre = c.qk_norm ? buf(t * Q * S) : nullptr;
  I.k_pre = c.qk_norm ? buf(t * K * S) : nullptr;
  I.attn = buf(t * Q * S);
  I.tmp = buf(t * D * S);
  I.gate = buf(t * In * S);
  I.up = buf(t * In * S);
  I.act = buf(t * In * S);
  I.hsel = buf(r * D * S);
  // One inverse RMS per normalised row: the blocks' t rows (t x heads for q/k norms), and the final norm's r output
  // rows, which exceed t when a prompt's last row is sampled G times (num_generations).
  I.rstd = static_cast<float*>(
      buf(std::max(t * static_cast<std::size_t>(c.num_attention_heads), r) * sizeof(float)));
  // LoRA: the [T, r] intermediates of a group's members (three at most) and the scratch of a group's op.
  const int rank = std::max(lora_r, 1);  // without an adapter: a placeholder rank of 1
  I.xa = static_cast<float*>(buf(kernels::kMaxLoraGroup * t * static_cast<std::size_t>(rank) * sizeof(float)));
  I.lora_scratch = static_cast<float*>(
      buf(kernels::lora_group_scratch_floats(static_cast<int>(t), static_cast<int>(D), rank, kernels::kMaxLoraGroup) *
          sizeof(float)));
  I.logits = static_cast<float*>(buf(r * static_cast<std::size_t>(c.vocab_size) * sizeof(float)));
  I.ids = static_cast<std::int32_t*>(buf(t * 4));
  I.slot = static_cast<std::int32_t*>(buf(t * 4));
  I.pos = static_cast<std::int32_t*>(buf(t * 4));
  I.rows = static_cast<std::int32_t*>(buf(r * 4));
}

const float* InferenceEngine::infer(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& slot,
                                const std::vector<std::int32_t>& pos, const std::vector<std::int32_t>& out_rows,
                                KvCache& cache, bool use_lora) {
  load(tokens, slot, pos, out_rows, cache);
  return run(static_cast<int>(tokens.size()), static_cast<int>(out_rows.size()), cache, use_lora);
}

InferenceEngine::DecodeInputs InferenceEngine::load_decode(const std::vector<std::int32_t>& tokens,
                                                           const std::vector<std::int32_t>& slot,
                                                           const std::vector<std::int32_t>& pos, KvCache& cache) {
  std::vector<std::int32_t> rows(tokens.size());
  for (std::size_t t = 0; t < rows.size(); ++t) rows[t] = static_cast<std::int32_t>(t);
  load(tokens, slot, pos, rows, cache);
  return {buf_->ids, buf_->pos};
}

const float* InferenceEngine::infer_loaded(int T, KvCache& cache, bool use_lora) {
  MGRL_CHECK(buf_ && T > 0 && T <= buf_->cap_T && T <= buf_->cap_R, "infer_loaded: no decode step loaded");
  return run(T, T, cache, use_lora);
}

void InferenceEngine::load(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& slot,
                           const std::vector<std::int32_t>& pos, const std::vector<std::int32_t>& out_rows,
                           KvCache& cache) {
  const int T = static_cast<int>(tokens.size()), R = static_cast<int>(out_rows.size());
  MGRL_CHECK(T > 0 && slot.size() == tokens.size() && pos.size() == tokens.size() && R > 0, "malformed infer call");
  const int V = static_cast<int>(cfg_.vocab_size);
  for (int t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= V)
      throw UserError("token id " + std::to_string(tokens[t]) + " is outside the vocabulary (size " +
                      std::to_string(V) + ")");
    MGRL_CHECK(slot[t] >= 0 && slot[t] < cache.slots(), "infer: slot outside the cache");
    if (pos[t] < 0 || pos[t] >= cache.max_len())
      throw UserError("a sequence reached " + std::to_string(pos[t] + 1) + " tokens, more than the cache holds (" +
                      std::to_string(cache.max_len()) + ")");
    MGRL_CHECK(cache.has(slot[t], pos[t]), "infer: a position with no cache block");
  }
  for (int r = 0; r < R; ++r) MGRL_CHECK(out_rows[r] >= 0 && out_rows[r] < T, "infer: output row out of range");
  reserve(T, R);
  Buffers& I = *buf_;
  ops_.upload(I.ids, tokens.data(), tokens.size() * 4);
  ops_.upload(I.slot, slot.data(), slot.size() * 4);
  ops_.upload(I.pos, pos.data(), pos.size() * 4);
  ops_.upload(I.rows, out_rows.data(), out_rows.size() * 4);
}

const float* InferenceEngine::run(int T, int R, KvCache& cache, bool use_lora) {
  const int V = static_cast<int>(cfg_.vocab_size), D = static_cast<int>(cfg_.hidden_size);
  const int nh = static_cast<int>(cfg_.num_attention_heads), nkv = static_cast<int>(cfg_.num_key_value_heads);
  const int hd = static_cast<int>(cfg_.head_dim);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  Buffers& I = *buf_;
  // A sequence's logits must not depend on what it is batched with (generation on N ranks = on 1 rank).
  const kernels::BatchInvariantScope invariant(ops_);
  const bool lora = use_lora && def_.lora() != nullptr;
  // The adapted projections read the merged copy (merge_lora) and no adapter runs.
  const bool merged = lora && merged_;
  // A group member's [T, r] slice of I.xa (the rank lay_out sized it for)
  const std::size_t xa_rank = static_cast<std::size_t>(def_.lora() ? def_.lora()->config().r : 1);
  const kernels::KvPages& pages = cache.pages();
  const bool fused = decode_fused_enabled();
  const int In = static_cast<int>(cfg_.intermediate_size);

  // The forward from the ids to the logits. Decode steps (every row an output row) are recorded once per shape and
  // buffer set and replayed (a CUDA graph on the CUDA backend): every value that changes between steps (ids, slots,
  // positions, output rows, the block table) is read from device memory.
  const auto forward = [&] {
  def_.invalidate_workspace();  // a recording must hold every layer's NF4 dequantization
  ops_.embedding_forward(I.x, I.ids, def_.embed(), T, V, D, def_.embed_scale());
  // The residual stream stays in I.x (in place); the norms' rstd go to one scratch buffer.
  // Gemma's post-norms run in place on tmp.
  const BlockIO io{I.x,   I.x,    I.x,    I.h,    I.q,    I.k,    I.v,   I.q_pre, I.k_pre, I.attn,
                   I.h,   I.gate, I.up,   I.act,  I.tmp,  I.rstd, I.rstd, I.rstd, I.rstd,  I.pos,
                   I.tmp, I.tmp,  I.rstd, I.rstd};
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    // The dense weights of the layer in the storage dtype (an NF4 base: its dequantized workspace, a sharded one: the
    // gathered copy), or of the merged copy where a projection has one.
    const LayerWeights& Lw = def_.layer(l);
    const auto weight = [&](Module m) -> const void* {
      const void* Wm = merged ? merged_w_[static_cast<std::size_t>(l) * kNumModules + static_cast<std::size_t>(m)]
                              : nullptr;
      return Wm ? Wm : Lw.W[static_cast<int>(m)];
    };
    // Whether an adapter runs beside the projection (after it, so its product cannot be fused with what follows).
    const auto adapter_runs = [&](Module m) { return lora && !merged && def_.lora()->find(l, m) != nullptr; };
    const auto linears = [&](const Module* ms, void* const* ys, int n, const void* x) {
      float* xa[kernels::kMaxLoraGroup] = {};
      kernels::Ops::LinearMember lm[kernels::Ops::kMaxLinearGroup];
      for (int i = 0; i < n; ++i) {
        lm[i] = {ys[i], weight(ms[i]), Lw.bias[static_cast<int>(ms[i])], module_out(cfg_, ms[i])};
        if (!fused) ops_.linear_forward(lm[i].y, x, lm[i].W, lm[i].bias, T, module_in(cfg_, ms[i]), lm[i].out);
        xa[i] = I.xa + static_cast<std::size_t>(i) * static_cast<std::size_t>(T) * xa_rank;
      }
      if (fused) ops_.linear_group_forward(lm, n, x, T, module_in(cfg_, ms[0]));
      if (lora && !merged) lora_add_group(def_, l, ms, ys, n, x, T, xa, I.lora_scratch);
    };
    const auto attend = [&] {
      if (fused)
        ops_.rope_kv_store(I.q, I.k, I.v, cache.k(l), cache.v(l), I.slot, I.pos, def_.inv_freq(l), T, pages, nh, nkv,
                           hd);
      else
        ops_.kv_store(cache.k(l), cache.v(l), I.k, I.v, I.slot, I.pos, T, pages, nkv, hd);
      ops_.attention_cached(I.attn, I.q, cache.k(l), cache.v(l), I.slot, I.pos, T, pages, nh, nkv, hd,
                            def_.attention(l));
    };
    BlockFusion fusion;
    fusion.rope_in_attend = fused;
    if (fused && !adapter_runs(Module::Gate) && !adapter_runs(Module::Up))
      fusion.gate_up_act = [&](const void* x, void* act) {
        ops_.gated_mlp_forward(act, I.gate, I.up, x, weight(Module::Gate), weight(Module::Up), T, D, In,
                               def_.geglu());
        return true;
      };
    if (fused && !adapter_runs(Module::Down))
      fusion.down_residual = [&](const void* x, void* x_out, const void* x_mid) {
        ops_.linear_residual_forward(x_out, x_mid, x, weight(Module::Down), T, In, D, I.tmp);
        return true;
      };
    // The norms folded into the GEMVs that follow them (MGRL_DECODE_NORM_FOLD=1): no normalised copy of x is written,
    // so no adapter may read one (merge_lora, or none, on q/k/v and on o/gate/up).
    const bool fold = fused && decode_norm_fold_enabled();
    if (fold && !adapter_runs(Module::Q) && !adapter_runs(Module::K) && !adapter_runs(Module::V))
      fusion.norm_qkv = [&](const void* x, const void* norm_w, void* const* ys) {
        const Module ms[] = {Module::Q, Module::K, Module::V};
        kernels::Ops::LinearMember lm[3];
        for (int i = 0; i < 3; ++i)
          lm[i] = {ys[i], weight(ms[i]), Lw.bias[static_cast<int>(ms[i])], module_out(cfg_, ms[i])};
        return ops_.rmsnorm_linear_group_forward(lm, 3, x, norm_w, eps, def_.unit_offset_norms(), T, D);
      };
    if (fold && !adapter_runs(Module::O) && !adapter_runs(Module::Gate) && !adapter_runs(Module::Up))
      fusion.o_residual_mlp = [&](const void* attn, void* x_mid, const void* x_in, const void* norm_w, void* act) {
        const void *Wg = weight(Module::Gate), *Wu = weight(Module::Up);
        if (!ops_.rmsnorm_gated_mlp_fits(x_mid, norm_w, Wg, Wu, T, D, In)) return false;
        ops_.linear_residual_forward(x_mid, x_in, attn, weight(Module::O), T, module_in(cfg_, Module::O), D, I.tmp);
        // The fits check above is the op's own condition: a decline here is a backend defect, not a fallback case.
        MGRL_CHECK(ops_.rmsnorm_gated_mlp_forward(act, x_mid, norm_w, eps, def_.unit_offset_norms(), Wg, Wu, T, D, In,
                                                  def_.geglu()),
                   "rmsnorm_gated_mlp_forward declined operands that rmsnorm_gated_mlp_fits accepted");
        return true;
      };
    block_forward(def_, l, io, T, linears, attend, &fusion);
  }
  ops_.gather_rows(I.hsel, I.x, I.rows, R, D);
  ops_.rmsnorm_forward(I.hsel, I.rstd, I.hsel, def_.final_norm(), R, D, eps, def_.unit_offset_norms());
  ops_.lm_head_logits(I.logits, I.hsel, def_.head(), R, D, V, 1.0f, def_.final_softcap());
  };
  if (T == R && T <= kMaxRecordedRows && !def_.sharded()) {  // a sharded base's gathers are not recorded
    // The key: everything the recorded launches take by value (sizes, pointers): this model's buffers, the
    // cache's pools and block table, LoRA off, on, or merged (and the merged copy).
    std::uint64_t key = 1469598103934665603ull;
    const auto mix = [&key](std::uint64_t v) {
      for (int b = 0; b < 8; ++b) key = (key ^ ((v >> (8 * b)) & 0xffu)) * 1099511628211ull;
    };
    const auto ptr = [&mix](const void* p) { mix(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p))); };
    mix(static_cast<std::uint64_t>(T));
    mix(merged ? 2 : lora ? 1 : 0);
    ptr(def_.base_weights());
    ptr(merged ? merged_mem_ : nullptr);
    ptr(I.x);
    ptr(I.logits);
    ptr(pages.table);
    for (int v : {pages.slots, pages.max_blocks, pages.block_size, pages.n_blocks}) mix(static_cast<std::uint64_t>(v));
    for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
      ptr(cache.k(l));
      ptr(cache.v(l));
    }
    ops_.run_recorded(key, forward);
  } else {
    forward();
  }
  return I.logits;
}

}  // namespace mgrl::model
