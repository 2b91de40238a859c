// model_def.cpp: the base weights' arena and handles, loading and random initialisation, LoRA attachment.
#include "model/model_def.h"

#include <algorithm>
#include <regex>
#include <cmath>
#include <set>

#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "io/checksum.h"
#include "io/nf4_tensor.h"
#include "io/safetensors.h"
#include "kernels/cpu/nf4.h"
#include "model/rope_freq.h"

namespace mgrl::model {

// transformers 5.24's should_convert_module: an llm_int8_skip_modules entry keeps a module dense when, as a regular
// expression, it matches the module's name from its start up to a name boundary ("layers.1" keeps layers.1.* dense,
// not layers.11.*), or when it is a suffix of the name ("fc1"). (Until 2026-11-29 any substring kept it dense: "mlp"
// kept every MLP dense where transformers quantizes them.) An entry that is no ECMAScript expression counts as a
// literal prefix up to a boundary.
bool bnb_skipped(const std::string& module, const std::vector<std::string>& skip) {
  for (const std::string& key : skip) {
    if (key.empty()) continue;
    if (module.size() >= key.size() && module.compare(module.size() - key.size(), key.size(), key) == 0) return true;
    std::regex re;
    try {
      re = std::regex("(?:" + key + ")", std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      if (module.compare(0, key.size(), key) == 0 &&
          (module.size() == key.size() || module[key.size()] == '.' || key.back() == '.'))
        return true;
      continue;
    }
    for (std::size_t e = 1; e <= module.size(); ++e) {
      const bool boundary = e == module.size() || module[e] == '.' || module[e - 1] == '.';
      if (boundary && std::regex_match(module.begin(), module.begin() + static_cast<std::ptrdiff_t>(e), re)) return true;
    }
  }
  return false;
}

namespace {
std::string layer_name(int l, const std::string& rest) { return "model.layers." + std::to_string(l) + "." + rest; }

std::size_t align16(std::size_t n) { return (n + 15) / 16 * 16; }

// An NF4 tensor of n elements as a slot holds it: its codes, then (16-byte aligned) the f32 absmax, or the 8-bit
// absmax codes and (aligned) their f32 scales. The byte offsets of the parts and the whole size.
struct Nf4Layout {
  std::size_t absmax_at, nested_at, bytes;  // nested_at: double quantization only
};
Nf4Layout nf4_layout(std::int64_t n, bool double_quant) {
  const std::size_t blocks = static_cast<std::size_t>(kernels::cpu::nf4_blocks(n));
  Nf4Layout L{align16(static_cast<std::size_t>(kernels::cpu::nf4_code_bytes(n))), 0, 0};
  if (double_quant) {
    L.nested_at = L.absmax_at + align16(blocks);
    L.bytes = L.nested_at + static_cast<std::size_t>(kernels::cpu::nf4_nested_blocks(n)) * 4;
  } else {
    L.bytes = L.absmax_at + blocks * 4;
  }
  return L;
}

// Is base tensor `name` a projection weight that NF4 holds? transformers + bitsandbytes quantize every nn.Linear
// but lm_head and the modules llm_int8_skip_modules keeps dense (bnb_skipped), matched against transformers' module
// names (a vision-language checkpoint's language model: model.language_model.layers...).
bool nf4_projection(const std::string& name, const std::vector<std::string>& skip, bool vlm) {
  bool projection = false;
  for (int m = 0; m < kNumModules; ++m) {
    const std::string suf = std::string(module_path(static_cast<Module>(m))) + ".weight";
    if (name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0) projection = true;
  }
  if (!projection) return false;
  std::string module = name.substr(0, name.size() - std::string(".weight").size());
  if (vlm && module.rfind("model.", 0) == 0) module = "model.language_model." + module.substr(6);
  return !bnb_skipped(module, skip);
}
}  // namespace

ModelDef::ModelDef(io::ModelConfig cfg, kernels::Ops& ops, ModelOptions opts, Gatherer* gatherer)
    : cfg_(std::move(cfg)), ops_(ops), opts_(opts), gatherer_(gatherer) {
  if (cfg_.head_dim % 2 != 0) throw UserError("head_dim must be even for rotary embeddings");
  // QLoRA: the projections as NF4, from a bitsandbytes 4-bit directory or quantized at load. Frozen: LoRA only.
  const bool bnb = cfg_.bnb4bit.has_value();
  const bool nf4 = bnb || opts_.quantize == Quantize::Nf4;
  if (nf4 && opts_.full_finetune) {
    if (bnb)
      throw UserError("the model's config.json has a bitsandbytes 4-bit quantization_config: its projections are "
                      "NF4 and frozen, so train.full_finetune = true is not possible (train LoRA adapters, or give "
                      "the unquantized model)");
    throw UserError("key 'model.quantize' = \"nf4\" freezes the base projections as NF4: it cannot be combined "
                    "with train.full_finetune = true (QLoRA trains LoRA adapters)");
  }
  const bool double_quant = bnb ? cfg_.bnb4bit->double_quant : opts_.quantize_double;
  const std::vector<std::string> skip = bnb ? cfg_.bnb4bit->skip_modules : std::vector<std::string>{};
  for (const auto& t : io::expected_tensors(cfg_)) {
    BaseTensor b{t.name, t.shape, 0, -1};
    if (nf4 && nf4_projection(t.name, skip, cfg_.vlm())) {
      Nf4Slot slot;
      slot.rows = t.shape[0];
      slot.cols = t.shape[1];
      slot.double_quant = double_quant;
      slot.bytes = nf4_layout(slot.rows * slot.cols, double_quant).bytes;
      b.nf4 = static_cast<int>(nf4_.size());
      nf4_.push_back(slot);
    } else {
      b.offset = dense_numel_;
      dense_numel_ += static_cast<std::size_t>(io::shape_numel(t.shape));
    }
    base_.push_back(b);
    base_numel_ += static_cast<std::size_t>(io::shape_numel(t.shape));
  }
  // Where each tensor is stored. Unsharded: as in the base arena. shard_base: the tensors outside the decoder layers
  // in weights_, and this rank's part of each decoder layer's stored bytes in parts_mem_ (a layer's dense tensors are
  // contiguous in the base arena: expected_tensors order).
  const std::size_t n_layers = static_cast<std::size_t>(cfg_.num_hidden_layers);
  stored_offset_.assign(base_.size(), 0);
  tensor_layer_.assign(base_.size(), -1);
  if (!opts_.shard_base) {
    for (std::size_t i = 0; i < base_.size(); ++i) stored_offset_[i] = base_[i].offset;
    stored_numel_ = dense_numel_;
  } else {
    MGRL_CHECK(!opts_.full_finetune, "shard_base shards a frozen base: not with full fine-tuning");
    if (gatherer_) {
      parts_ = gatherer_->parts();
      part_index_ = gatherer_->index();
    }
    MGRL_CHECK(parts_ >= 1 && part_index_ >= 0 && part_index_ < parts_, "bad gatherer parts");
    shards_.resize(n_layers);
    std::vector<bool> seen(n_layers, false);
    const std::string prefix = "model.layers.";
    for (std::size_t i = 0; i < base_.size(); ++i) {
      const BaseTensor& t = base_[i];
      const std::size_t n = static_cast<std::size_t>(io::shape_numel(t.shape));
      if (t.name.compare(0, prefix.size(), prefix) != 0) {
        MGRL_CHECK(t.nf4 < 0, "an NF4 tensor outside the decoder layers");
        stored_offset_[i] = stored_numel_;
        stored_numel_ += n;
        continue;
      }
      const int l = std::stoi(t.name.substr(prefix.size()));
      tensor_layer_[i] = l;
      if (t.nf4 >= 0) continue;  // after the layer's dense tensors, below
      LayerShard& sh = shards_[static_cast<std::size_t>(l)];
      if (!seen[static_cast<std::size_t>(l)]) sh.begin = t.offset;
      seen[static_cast<std::size_t>(l)] = true;
      MGRL_CHECK(t.offset == sh.begin + sh.numel, "a decoder layer's dense tensors are not contiguous");
      sh.numel += n;
    }
    // A layer's stored bytes: its dense tensors, then its NF4 projections (codes and absmax state), 16-byte aligned.
    for (LayerShard& sh : shards_) sh.bytes = sh.numel * ops_.storage_size();
    for (std::size_t i = 0; i < base_.size(); ++i)
      if (tensor_layer_[i] >= 0 && base_[i].nf4 >= 0) {
        LayerShard& sh = shards_[static_cast<std::size_t>(tensor_layer_[i])];
        Nf4Slot& q = nf4_[static_cast<std::size_t>(base_[i].nf4)];
        q.layer = tensor_layer_[i];
        q.at = align16(sh.bytes);
        sh.bytes = q.at + q.bytes;
      }
    // P equal parts of a multiple of 16 bytes (so that no stored element straddles two parts), the last one padded;
    // every rank computes the same split from the config alone.
    const std::size_t P = static_cast<std::size_t>(parts_);
    for (LayerShard& sh : shards_) {
      sh.part_bytes = align16((sh.bytes + P - 1) / P);
      sh.stored = parts_bytes_;
      parts_bytes_ += sh.part_bytes;
      slot_bytes_ = std::max(slot_bytes_, sh.part_bytes * P);
    }
    if (parts_bytes_ > 0) parts_mem_ = ops_.alloc(parts_bytes_);
  }
  weights_ = ops_.alloc(stored_numel_ * ops_.storage_size());
  if (!nf4_.empty()) {
    nf4_tables_ = static_cast<float*>(ops_.alloc((16 + 256) * sizeof(float)));
    ops_.upload(nf4_tables_, kernels::cpu::nf4_code(), 16 * sizeof(float));
    ops_.upload(nf4_tables_ + 16, kernels::cpu::dynamic_code(), 256 * sizeof(float));
    for (Nf4Slot& s : nf4_) {
      nf4_bytes_ += s.bytes;
      if (opts_.shard_base) continue;  // stored in its layer's parts; gathered, then read through nf4_at
      s.mem = ops_.alloc(s.bytes);
      s.w = nf4_at(s, static_cast<const char*>(s.mem));
    }
  }
  // base_grads_ and master_ below exist for full fine-tuning only, which has no NF4 tensor: base_numel_ = dense.
  if (opts_.full_finetune) base_grads_ = static_cast<float*>(ops_.alloc(base_numel_ * sizeof(float)));
  if (opts_.full_finetune && (ops_.storage() != DType::F32 || opts_.master_weights))
    master_ = static_cast<float*>(ops_.alloc(base_numel_ * sizeof(float)));

  // The only string lookups: every handle is resolved here, once.
  layer_nf4_.assign(n_layers, false);
  // The NF4 workspace: a slot for each of a layer's seven projections (every layer has the same shapes), dense,
  // storage dtype, 16-byte aligned: room for whichever of them a layer holds as NF4 (llm_int8_skip_modules may leave
  // some dense in some layers), and what memory_plan's nf4_workspace_bytes counts.
  ws_offset_.assign(kNumModules, 0);
  if (!nf4_.empty() && n_layers > 0) {
    for (int m = 0; m < kNumModules; ++m) {
      ws_offset_[static_cast<std::size_t>(m)] = ws_bytes_;
      ws_bytes_ += align16(static_cast<std::size_t>(module_in(cfg_, static_cast<Module>(m))) *
                           static_cast<std::size_t>(module_out(cfg_, static_cast<Module>(m))) * ops_.storage_size());
    }
    workspace_ = ops_.alloc(ws_bytes_);
  }
  layers_.resize(n_layers);
  if (!opts_.shard_base) dense_layers_.resize(n_layers);
  grads_.resize(n_layers);
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    LayerHandles& H = layers_[static_cast<std::size_t>(l)];
    H.attn_norm = handle(layer_name(l, "input_layernorm.weight"));
    if (cfg_.gemma) {
      H.post_attn_norm = handle(layer_name(l, "post_attention_layernorm.weight"));
      H.mlp_norm = handle(layer_name(l, "pre_feedforward_layernorm.weight"));
      H.post_mlp_norm = handle(layer_name(l, "post_feedforward_layernorm.weight"));
    } else {
      H.mlp_norm = handle(layer_name(l, "post_attention_layernorm.weight"));
    }
    if (cfg_.qk_norm) {
      H.q_norm = handle(layer_name(l, "self_attn.q_norm.weight"));
      H.k_norm = handle(layer_name(l, "self_attn.k_norm.weight"));
    }
    for (int m = 0; m < kNumModules; ++m) {
      const std::string base = layer_name(l, module_path(static_cast<Module>(m)));
      H.W[m] = handle(base + ".weight");
      const bool has_bias = std::any_of(base_.begin(), base_.end(), [&](const BaseTensor& t) {
        return t.name == base + ".bias";
      });
      if (has_bias) H.bias[m] = handle(base + ".bias");
    }
    if (!opts_.shard_base) dense_layers_[static_cast<std::size_t>(l)] = resolve(H);
    LayerGrads& G = grads_[static_cast<std::size_t>(l)];
    G.post_attn_norm = grad(H.post_attn_norm);
    G.post_mlp_norm = grad(H.post_mlp_norm);
    G.attn_norm = grad(H.attn_norm);
    G.mlp_norm = grad(H.mlp_norm);
    G.q_norm = grad(H.q_norm);
    G.k_norm = grad(H.k_norm);
    for (int m = 0; m < kNumModules; ++m) {
      if (is_nf4(H.W[m])) layer_nf4_[static_cast<std::size_t>(l)] = true;
      G.W[m] = grad(H.W[m]);
      G.bias[m] = grad(H.bias[m]);
    }
  }
  embed_ = handle("model.embed_tokens.weight");
  final_norm_ = handle("model.norm.weight");
  head_ = handle(cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");

  if (opts_.shard_base) {  // the gather workspace: double-buffered, or one slot per layer when kept
    const std::size_t n_slots = opts_.shard_keep ? n_layers : std::min<std::size_t>(2, n_layers);
    for (std::size_t i = 0; i < n_slots; ++i) slots_.push_back(ops_.alloc(slot_bytes_));
    slot_layer_.assign(n_slots, -1);
    slot_pending_.assign(n_slots, false);
    slot_weights_.resize(n_slots);
  }

  // Rotary inverse frequencies, computed once on the host as transformers does: the global layers' (rope_theta,
  // rope_scaling) and, for Gemma 3, the sliding layers' (rope_local_theta, never scaled).
  const auto upload_inv_freq = [&](double theta, const std::optional<io::RopeScaling>& rs) {
    std::vector<float> inv(static_cast<std::size_t>(cfg_.head_dim / 2));
    Llama3RopeScaling scaling{};
    const bool llama3 = rs && rs->rope_type == "llama3";
    if (llama3) {
      scaling.factor = rs->factor;
      scaling.low_freq_factor = rs->low_freq_factor;
      scaling.high_freq_factor = rs->high_freq_factor;
      scaling.original_max_position_embeddings = static_cast<double>(rs->original_max_position_embeddings);
    }
    if (rs && rs->rope_type == "yarn") {
      YarnRopeScaling yarn;
      yarn.factor = rs->factor;
      yarn.beta_fast = rs->beta_fast;
      yarn.beta_slow = rs->beta_slow;
      yarn.original_max_position_embeddings = static_cast<double>(rs->original_max_position_embeddings);
      yarn.truncate = rs->truncate;
      rope_yarn_inv_freq(inv.data(), static_cast<int>(cfg_.head_dim), theta, yarn);
    } else {
      rope_inv_freq(inv.data(), static_cast<int>(cfg_.head_dim), theta, llama3 ? &scaling : nullptr);
    }
    if (rs && rs->rope_type == "linear") {
      const float factor = static_cast<float>(rs->factor);  // transformers: inv_freq /= factor, in fp32
      for (float& f : inv) f /= factor;
    }
    float* dev = static_cast<float*>(ops_.alloc(inv.size() * sizeof(float)));
    ops_.upload(dev, inv.data(), inv.size() * sizeof(float));
    return dev;
  };
  inv_freq_ = upload_inv_freq(cfg_.rope_theta, cfg_.rope_scaling);
  if (cfg_.rope_local_theta > 0) inv_freq_local_ = upload_inv_freq(cfg_.rope_local_theta, std::nullopt);
}

kernels::AttentionOptions ModelDef::attention(int l) const {
  kernels::AttentionOptions o;
  // YaRN's attention factor m multiplies cos and sin in transformers, so every score by m^2: folded into the scale.
  const double m = cfg_.layer_rope_attention_factor(l);
  if (cfg_.query_pre_attn_scalar > 0 || m != 1.0) o.scale = static_cast<float>(cfg_.attention_scale() * m * m);
  o.window = static_cast<int>(std::min<std::int64_t>(cfg_.layer_window(l), 1 << 30));
  o.softcap = static_cast<float>(cfg_.attn_logit_softcapping);
  return o;
}

float ModelDef::embed_scale() const {
  // transformers: a tensor of hidden_size ** 0.5 (a Python float) in the weights' dtype.
  return cfg_.gemma ? static_cast<float>(std::sqrt(static_cast<double>(cfg_.hidden_size))) : 1.0f;
}

ModelDef::~ModelDef() {
  lora_.reset();
  for (void* p : slots_) ops_.release(p);
  ops_.release(inv_freq_);
  if (inv_freq_local_) ops_.release(inv_freq_local_);
  ops_.release(weights_);
  if (parts_mem_) ops_.release(parts_mem_);
  for (Nf4Slot& s : nf4_)
    if (s.mem) ops_.release(s.mem);
  if (nf4_tables_) ops_.release(nf4_tables_);
  if (workspace_) ops_.release(workspace_);
  if (base_grads_) ops_.release(base_grads_);
  if (master_) ops_.release(master_);
}

WeightHandle ModelDef::handle(const std::string& name) const {
  for (std::size_t i = 0; i < base_.size(); ++i)
    if (base_[i].name == name) {
      const int l = tensor_layer_[i];
      if (l >= 0) return WeightHandle{WeightKind::Shard, static_cast<int>(i), l};
      return WeightHandle{WeightKind::Dense, static_cast<int>(i)};
    }
  throw FatalError("model tensor '" + name + "' is not part of this architecture");
}

const void* ModelDef::dense(const WeightHandle& h) const {
  if (!h.present()) return nullptr;
  const std::size_t t = static_cast<std::size_t>(h.tensor), S = ops_.storage_size();
  MGRL_CHECK(base_[t].nf4 < 0, "an NF4 base weight is read through layer(l), not dense()");
  if (h.kind == WeightKind::Dense) return static_cast<const char*>(weights_) + stored_offset_[t] * S;
  for (std::size_t s = 0; s < slots_.size(); ++s)
    if (slot_layer_[s] == h.layer)
      return static_cast<const char*>(slots_[s]) +
             (base_[t].offset - shards_[static_cast<std::size_t>(h.layer)].begin) * S;
  throw FatalError("base tensor '" + base_[t].name + "' read while its layer is not gathered");
}

LayerWeights ModelDef::resolve(const LayerHandles& H) const {
  LayerWeights D;
  D.attn_norm = dense(H.attn_norm);
  D.mlp_norm = dense(H.mlp_norm);
  D.q_norm = dense(H.q_norm);
  D.k_norm = dense(H.k_norm);
  D.post_attn_norm = dense(H.post_attn_norm);
  D.post_mlp_norm = dense(H.post_mlp_norm);
  for (int m = 0; m < kNumModules; ++m) {
    if (is_nf4(H.W[m]))  // dequantized by layer(l)
      D.W[m] = static_cast<const char*>(workspace_) + ws_offset_[static_cast<std::size_t>(m)];
    else
      D.W[m] = dense(H.W[m]);
    D.bias[m] = dense(H.bias[m]);
  }
  return D;
}

std::size_t ModelDef::slot_of(int l) const {
  return opts_.shard_keep ? static_cast<std::size_t>(l) : static_cast<std::size_t>(l) % slots_.size();
}

const LayerWeights& ModelDef::layer(int l) const {
  if (!opts_.shard_base) {
    const std::size_t li = static_cast<std::size_t>(l);
    if (layer_nf4_[li] && ws_layer_ != l) dequantize_layer(l, nullptr);
    return dense_layers_[li];
  }
  if (last_layer_ >= 0 && l != last_layer_) direction_ = l > last_layer_ ? 1 : -1;
  last_layer_ = l;
  const std::size_t s = slot_of(l);
  if (slot_layer_[s] != l) gather(l, s, false);
  if (slot_pending_[s]) {  // prefetched: the backend's queue waits for it (on the GPU; nothing on the CPU)
    gatherer_->wait();
    slot_pending_.assign(slot_pending_.size(), false);
  }
  // NF4 projections: dequantized from the gathered bytes into the workspace, as the unsharded path does from its own.
  if (layer_nf4_[static_cast<std::size_t>(l)] && ws_layer_ != l)
    dequantize_layer(l, static_cast<const char*>(slots_[s]));
  // Prefetch the next layer of the walk into its slot. Its gather is queued after the work queued so far, which
  // includes the last reads of the layer that slot held (two back in the walk), and runs beside layer l.
  const int next = l + direction_;
  if (next >= 0 && next < cfg_.num_hidden_layers) {
    const std::size_t t = slot_of(next);
    if (t != s && slot_layer_[t] != next) gather(next, t, true);
  }
  return slot_weights_[s];
}

void ModelDef::gather(int l, std::size_t slot, bool prefetch) const {
  const LayerShard& sh = shards_[static_cast<std::size_t>(l)];
  const void* part = static_cast<const char*>(parts_mem_) + sh.stored;
  if (gatherer_ && parts_ > 1) {
    if (prefetch) gatherer_->all_gather_async(part, slots_[slot], sh.part_bytes);
    else gatherer_->all_gather(part, slots_[slot], sh.part_bytes);
    slot_pending_[slot] = prefetch;
  } else {
    ops_.copy(slots_[slot], part, sh.part_bytes);
  }
  slot_layer_[slot] = l;
  slot_weights_[slot] = resolve(layers_[static_cast<std::size_t>(l)]);
  ++gathers_;
}

void ModelDef::end_of_pass() const {
  if (!opts_.shard_base || !opts_.shard_keep) return;
  if (gatherer_ && std::find(slot_pending_.begin(), slot_pending_.end(), true) != slot_pending_.end()) {
    gatherer_->wait();  // a prefetch still writing a slot that the next pass gathers into again
    slot_pending_.assign(slot_pending_.size(), false);
  }
  slot_layer_.assign(slot_layer_.size(), -1);
}

std::size_t ModelDef::gather_workspace_bytes() const { return slots_.size() * slot_bytes_; }

kernels::Nf4Weight ModelDef::nf4_at(const Nf4Slot& s, const char* mem) const {
  const Nf4Layout L = nf4_layout(s.rows * s.cols, s.double_quant);
  kernels::Nf4Weight w;
  w.codes = reinterpret_cast<const std::uint8_t*>(mem);
  w.code = nf4_tables_;
  const char* p = mem + L.absmax_at;
  if (s.double_quant) {
    w.qabsmax = reinterpret_cast<const std::uint8_t*>(p);
    w.nested_absmax = reinterpret_cast<const float*>(mem + L.nested_at);
    w.nested_code = nf4_tables_ + 16;
    w.offset = s.w.offset;
  } else {
    w.absmax = reinterpret_cast<const float*>(p);
  }
  return w;
}

void ModelDef::dequantize_layer(int l, const char* gathered) const {
  const LayerHandles& H = layers_[static_cast<std::size_t>(l)];
  for (int m = 0; m < kNumModules; ++m) {
    if (!H.W[m].present()) continue;
    const int q = base_[static_cast<std::size_t>(H.W[m].tensor)].nf4;
    if (q < 0) continue;
    const Nf4Slot& s = nf4_[static_cast<std::size_t>(q)];
    ops_.dequantize_nf4(static_cast<char*>(workspace_) + ws_offset_[static_cast<std::size_t>(m)],
                        gathered ? nf4_at(s, gathered + s.at) : s.w, 0, s.rows * s.cols);
  }
  ws_layer_ = l;
}

void ModelDef::store_part(int l, std::size_t at, const void* bytes, std::size_t n) {
  // Bytes [at, at + n) of layer l's stored range: this rank keeps those that fall into its part.
  const LayerShard& sh = shards_[static_cast<std::size_t>(l)];
  const std::size_t lo = static_cast<std::size_t>(part_index_) * sh.part_bytes, hi = lo + sh.part_bytes;
  const std::size_t from = std::max(at, lo), to = std::min(at + n, hi);
  if (from < to)
    ops_.upload(static_cast<char*>(parts_mem_) + sh.stored + (from - lo), static_cast<const char*>(bytes) + (from - at),
                to - from);
}

float* ModelDef::grad(const WeightHandle& h) const {
  if (!base_grads_ || !h.present()) return nullptr;
  return base_grads_ + base_[static_cast<std::size_t>(h.tensor)].offset;
}

float* ModelDef::trainable_base() {
  MGRL_CHECK(opts_.full_finetune, "trainable_base() without full_finetune");
  if (master_) return master_;
  MGRL_CHECK(ops_.storage() == DType::F32, "full fine-tuning on non-f32 storage needs master weights");
  return static_cast<float*>(weights_);
}

void ModelDef::master_weights_changed() {
  if (master_) ops_.f32_to_storage(weights_, master_, base_numel_);
}

void ModelDef::upload_nf4(Nf4Slot& s, const std::vector<std::uint8_t>& codes, const std::vector<float>& absmax,
                          const std::vector<std::uint8_t>& qabsmax, const std::vector<float>& nested, float offset) {
  if (opts_.shard_base) {  // the tensor's bytes as an unsharded slot holds them; this rank stores its part of them
    std::vector<char> img(s.bytes, 0);
    const Nf4Layout L = nf4_layout(s.rows * s.cols, s.double_quant);
    const std::size_t abs_at = L.absmax_at;
    std::memcpy(img.data(), codes.data(), codes.size());
    if (s.double_quant) {
      std::memcpy(img.data() + abs_at, qabsmax.data(), qabsmax.size());
      std::memcpy(img.data() + L.nested_at, nested.data(), nested.size() * sizeof(float));
      s.w.offset = offset;
    } else {
      std::memcpy(img.data() + abs_at, absmax.data(), absmax.size() * sizeof(float));
    }
    store_part(s.layer, s.at, img.data(), img.size());
    ws_layer_ = -1;
    return;
  }
  ops_.upload(const_cast<std::uint8_t*>(s.w.codes), codes.data(), codes.size());
  if (s.double_quant) {
    ops_.upload(const_cast<std::uint8_t*>(s.w.qabsmax), qabsmax.data(), qabsmax.size());
    ops_.upload(const_cast<float*>(s.w.nested_absmax), nested.data(), nested.size() * sizeof(float));
    s.w.offset = offset;
  } else {
    ops_.upload(const_cast<float*>(s.w.absmax), absmax.data(), absmax.size() * sizeof(float));
  }
  ws_layer_ = -1;
}

void ModelDef::upload_tensor(std::size_t index, const std::vector<float>& host) {
  const BaseTensor& t = base_[index];
  if (t.nf4 >= 0) {  // quantized here, as bitsandbytes does (kernels/cpu/nf4.h)
    Nf4Slot& s = nf4_[static_cast<std::size_t>(t.nf4)];
    const std::int64_t n = s.rows * s.cols, blocks = kernels::cpu::nf4_blocks(n);
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(kernels::cpu::nf4_code_bytes(n))), q;
    std::vector<float> absmax(static_cast<std::size_t>(blocks)), nested;
    kernels::cpu::nf4_quantize_parallel(host.data(), n, codes.data(), absmax.data(),
                                        static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    float offset = 0.0f;
    if (s.double_quant) {
      q.resize(absmax.size());
      nested.resize(static_cast<std::size_t>(kernels::cpu::nf4_nested_blocks(n)));
      kernels::cpu::nf4_double_quantize(absmax.data(), blocks, q.data(), nested.data(), &offset);
    }
    upload_nf4(s, codes, absmax, q, nested, offset);
    return;
  }
  const std::size_t S = ops_.storage_size();
  if (tensor_layer_[index] >= 0) {  // shard_base: the elements of this rank's part only
    const LayerShard& sh = shards_[static_cast<std::size_t>(tensor_layer_[index])];
    // In elements of the layer's stored range (a part is a whole number of elements: part_bytes is a multiple of 16).
    const std::size_t lo = static_cast<std::size_t>(part_index_) * sh.part_bytes / S, hi = lo + sh.part_bytes / S;
    const std::size_t first = t.offset - sh.begin;
    const std::size_t from = std::max(first, lo), to = std::min(first + host.size(), hi);
    if (from < to)
      ops_.upload_f32_as_storage(static_cast<char*>(parts_mem_) + sh.stored + (from - lo) * S,
                                 host.data() + (from - first), to - from);
    return;
  }
  ops_.upload_f32_as_storage(static_cast<char*>(weights_) + stored_offset_[index] * S, host.data(), host.size());
  if (master_) ops_.upload(master_ + t.offset, host.data(), host.size() * sizeof(float));
}

namespace {
constexpr std::size_t kFingerprintSamples = 4096;

// Up to kFingerprintSamples values of v spaced evenly (the first and the last among them), each through convert.
template <class R, class T, class Convert>
std::vector<R> fingerprint_sample(const std::vector<T>& v, Convert convert) {
  const std::size_t n = v.size(), k = std::min(n, kFingerprintSamples);
  std::vector<R> out(k);
  for (std::size_t i = 0; i < k; ++i) out[i] = convert(v[k > 1 ? i * (n - 1) / (k - 1) : 0]);
  return out;
}
// Dense values: rounded to bf16 (the same weights stored as f32 or bf16 agree).
std::vector<std::uint16_t> fingerprint_sample(const std::vector<float>& v) {
  return fingerprint_sample<std::uint16_t>(v, [](float x) { return io::float_to_bf16(x); });
}
}  // namespace

void ModelDef::add_to_fingerprint(const std::string& name, const void* sample, std::size_t bytes) {
  fingerprint_ += name + " " + io::checksum_hex(sample, bytes) + "\n";
}

std::string fingerprint_line(const std::string& name, const std::vector<float>& values) {
  const auto sample = fingerprint_sample(values);
  return name + " " + io::checksum_hex(sample.data(), sample.size() * sizeof(std::uint16_t));
}

std::string fingerprint_line_nf4(const std::string& name, const std::vector<std::uint8_t>& codes) {
  const auto sample = fingerprint_sample<std::uint8_t>(codes, [](std::uint8_t c) { return c; });
  return name + " nf4 " + io::checksum_hex(sample.data(), sample.size());
}

void ModelDef::load_weights(const std::string& dir) {
  io::SafetensorsModel model(dir);
  if (cfg_.vlm()) io::use_language_model_names(model);  // the language model of a vision-language checkpoint
  fingerprint_.clear();
  std::vector<float> host;
  for (std::size_t i = 0; i < base_.size(); ++i) {
    const BaseTensor& t = base_[i];
    if (io::has_bnb_nf4(model, t.name)) {  // a bitsandbytes 4-bit tensor: kept as it is stored, not dequantized
      const std::string stored = model.stored_name(t.name);  // messages name the file's tensors
      if (t.nf4 < 0)
        throw UserError(dir + ": tensor '" + stored + "' is bitsandbytes 4-bit, but config.json has no bitsandbytes "
                        "4-bit quantization_config (or names it in llm_int8_skip_modules)");
      Nf4Slot& s = nf4_[static_cast<std::size_t>(t.nf4)];
      const io::Nf4Tensor q = io::read_bnb_nf4(model, t.name, s.rows, s.cols);
      if (q.double_quant != s.double_quant)
        throw UserError(dir + ": tensor '" + stored + "' is " + (q.double_quant ? "" : "not ") +
                        "double-quantized, but config.json's bnb_4bit_use_double_quant is " +
                        (s.double_quant ? "true" : "false"));
      if (std::memcmp(q.code.data(), kernels::cpu::nf4_code(), 16 * sizeof(float)) != 0)
        throw UserError(dir + ": tensor '" + stored + ".quant_map' is not the NF4 code");
      if (q.double_quant && std::memcmp(q.nested_code.data(), kernels::cpu::dynamic_code(), 256 * sizeof(float)) != 0)
        throw UserError(dir + ": tensor '" + stored + ".nested_quant_map' is not bitsandbytes' dynamic 8-bit code");
      upload_nf4(s, q.codes, q.absmax, q.qabsmax, q.nested_absmax, q.offset);
      const auto sample = fingerprint_sample<std::uint8_t>(q.codes, [](std::uint8_t c) { return c; });
      add_to_fingerprint(t.name + " nf4", sample.data(), sample.size());
      continue;
    }
    // A bitsandbytes directory stores every projection its quantization_config quantizes as 4-bit: one stored dense
    // there is a config that does not describe the weights (an llm_int8_skip_modules entry mgrl reads otherwise than
    // transformers would be re-quantized here in silence).
    if (t.nf4 >= 0 && cfg_.bnb4bit)
      throw UserError(dir + ": tensor '" + model.stored_name(t.name) + "' is stored dense, but config.json's "
                      "bitsandbytes quantization_config quantizes it (no llm_int8_skip_modules entry keeps it dense)");
    const io::TensorInfo& info = model.get(t.name, t.shape);
    host.resize(static_cast<std::size_t>(info.numel()));
    io::copy_finite_to_f32(info, host.data());
    model.release_pages(info);  // the file's copy of it leaves this process's memory (one tensor mapped at a time)
    const auto sample = fingerprint_sample(host);
    add_to_fingerprint(t.name, sample.data(), sample.size() * sizeof(std::uint16_t));
    upload_tensor(i, host);
  }
  // Weights this config.json does not use (as transformers says of them): a num_hidden_layers lower than the
  // weights' layers, or another architecture's tensors. Said once; the run goes on with what it uses.
  std::set<std::string> used;
  for (const auto& t : base_) used.insert(t.name);
  std::vector<std::string> unused;
  std::size_t vision = 0;
  for (const auto& name : model.names()) {
    const bool buffer = name.find("rotary_emb.inv_freq") != std::string::npos;  // old checkpoints keep RoPE buffers
    const bool tied_head = name == "lm_head.weight" && cfg_.tie_word_embeddings;
    if (cfg_.vlm() && io::is_vision_tensor(name)) {
      ++vision;
      continue;
    }
    if (!used.count(name) && !io::is_bnb_companion(name) && !buffer && !tied_head) unused.push_back(name);
  }
  if (vision > 0)
    log::info(dir + ": " + cfg_.vlm_architecture + ": its language model, text only (the " +
                   std::to_string(vision) + " tensors of the vision tower and projector are not loaded)");
  if (!unused.empty())
    log::warn_once(dir + ": " + std::to_string(unused.size()) + " of its tensors are not used by its config.json (" +
                   unused.front() + (unused.size() > 1 ? ", ..." : "") +
                   "): check num_hidden_layers and the architecture against the weights");
}

void ModelDef::init_random(std::uint64_t seed, float std) {
  std::vector<float> host;
  std::uint64_t counter = 0;
  fingerprint_.clear();
  auto uniform = [&] { return random_uniform(seed, counter++) + 0.5 / 9007199254740992.0; };  // in (0, 1)
  for (std::size_t i = 0; i < base_.size(); ++i) {
    const BaseTensor& t = base_[i];
    host.assign(static_cast<std::size_t>(io::shape_numel(t.shape)), 0.0f);
    const bool norm = t.name.find("norm") != std::string::npos;
    const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    for (auto& x : host) {
      if (norm) x = cfg_.gemma ? 0.0f : 1.0f;  // Gemma norms scale by (1 + w)
      else if (!bias) x = static_cast<float>(std * std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
    }
    const auto sample = fingerprint_sample(host);
    add_to_fingerprint(t.name, sample.data(), sample.size() * sizeof(std::uint16_t));
    upload_tensor(i, host);
  }
}

LoraParams& ModelDef::add_lora(const LoraConfig& cfg, std::uint64_t seed) {
  lora_ = std::make_unique<LoraParams>(cfg_, cfg, ops_);
  lora_->init(seed);
  return *lora_;
}

std::vector<float> ModelDef::base_tensor_host(const std::string& name) const {
  for (std::size_t i = 0; i < base_.size(); ++i)
    if (base_[i].name == name) {
      MGRL_CHECK(tensor_layer_[i] < 0, "base_tensor_host('" + name + "'): the tensor is sharded over the ranks");
      std::vector<float> out(static_cast<std::size_t>(io::shape_numel(base_[i].shape)));
      if (base_[i].nf4 >= 0) {  // dequantized into a buffer of its own
        const Nf4Slot& s = nf4_[static_cast<std::size_t>(base_[i].nf4)];
        void* tmp = ops_.alloc(out.size() * ops_.storage_size());
        ops_.dequantize_nf4(tmp, s.w, 0, s.rows * s.cols);
        ops_.download_storage_as_f32(out.data(), tmp, out.size());
        ops_.release(tmp);
        return out;
      }
      ops_.download_storage_as_f32(out.data(), dense(WeightHandle{WeightKind::Dense, static_cast<int>(i)}),
                                   out.size());
      return out;
    }
  throw FatalError("no base tensor '" + name + "'");
}

}  // namespace mgrl::model
