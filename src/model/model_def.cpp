// model_def.cpp: the base weights' arena and handles, loading and random initialisation, LoRA attachment.
#include "model/model_def.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/random.h"
#include "io/safetensors.h"
#include "model/rope_freq.h"

namespace mgrl::model {

namespace {
std::string layer_name(int l, const std::string& rest) { return "model.layers." + std::to_string(l) + "." + rest; }
}  // namespace

ModelDef::ModelDef(io::ModelConfig cfg, kernels::Ops& ops, ModelOptions opts, Gatherer* gatherer)
    : cfg_(std::move(cfg)), ops_(ops), opts_(opts), gatherer_(gatherer) {
  if (cfg_.head_dim % 2 != 0) throw UserError("head_dim must be even for rotary embeddings");
  for (const auto& t : io::expected_tensors(cfg_)) {
    base_.push_back({t.name, t.shape, base_numel_});
    base_numel_ += static_cast<std::size_t>(io::shape_numel(t.shape));
  }
  // Where each tensor is stored. Unsharded: as in the base arena. shard_base: the unsharded tensors first, then this
  // rank's part of each decoder layer (a layer's tensors are contiguous in the base arena: expected_tensors order).
  const std::size_t n_layers = static_cast<std::size_t>(cfg_.num_hidden_layers);
  stored_offset_.assign(base_.size(), 0);
  tensor_layer_.assign(base_.size(), -1);
  if (!opts_.shard_base) {
    for (std::size_t i = 0; i < base_.size(); ++i) stored_offset_[i] = base_[i].offset;
    stored_numel_ = base_numel_;
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
        stored_offset_[i] = stored_numel_;
        stored_numel_ += n;
        continue;
      }
      const int l = std::stoi(t.name.substr(prefix.size()));
      tensor_layer_[i] = l;
      LayerShard& sh = shards_[static_cast<std::size_t>(l)];
      if (!seen[static_cast<std::size_t>(l)]) sh.begin = t.offset;
      seen[static_cast<std::size_t>(l)] = true;
      MGRL_CHECK(t.offset == sh.begin + sh.numel, "a decoder layer's tensors are not contiguous");
      sh.numel += n;
    }
    const std::size_t P = static_cast<std::size_t>(parts_);
    for (LayerShard& sh : shards_) {
      sh.part_numel = (sh.numel + P - 1) / P;
      sh.stored = stored_numel_;
      stored_numel_ += sh.part_numel;
      slot_numel_ = std::max(slot_numel_, sh.part_numel * P);
    }
  }
  weights_ = ops_.alloc(stored_numel_ * ops_.storage_size());
  if (opts_.full_finetune) base_grads_ = static_cast<float*>(ops_.alloc(base_numel_ * sizeof(float)));
  if (opts_.full_finetune && (ops_.storage() != DType::F32 || opts_.master_weights))
    master_ = static_cast<float*>(ops_.alloc(base_numel_ * sizeof(float)));

  // The only string lookups: every handle is resolved here, once.
  layers_.resize(n_layers);
  if (!opts_.shard_base) dense_layers_.resize(n_layers);
  grads_.resize(n_layers);
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    LayerHandles& H = layers_[static_cast<std::size_t>(l)];
    H.attn_norm = handle(layer_name(l, "input_layernorm.weight"));
    H.mlp_norm = handle(layer_name(l, "post_attention_layernorm.weight"));
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
    G.attn_norm = grad(H.attn_norm);
    G.mlp_norm = grad(H.mlp_norm);
    G.q_norm = grad(H.q_norm);
    G.k_norm = grad(H.k_norm);
    for (int m = 0; m < kNumModules; ++m) {
      G.W[m] = grad(H.W[m]);
      G.bias[m] = grad(H.bias[m]);
    }
  }
  embed_ = handle("model.embed_tokens.weight");
  final_norm_ = handle("model.norm.weight");
  head_ = handle(cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");

  if (opts_.shard_base) {  // the gather workspace: double-buffered, or one slot per layer when kept
    const std::size_t n_slots = opts_.shard_keep ? n_layers : std::min<std::size_t>(2, n_layers);
    for (std::size_t i = 0; i < n_slots; ++i) slots_.push_back(ops_.alloc(slot_numel_ * ops_.storage_size()));
    slot_layer_.assign(n_slots, -1);
    slot_pending_.assign(n_slots, false);
    slot_weights_.resize(n_slots);
  }

  // Rotary inverse frequencies, computed once on the host as transformers does.
  std::vector<float> inv(static_cast<std::size_t>(cfg_.head_dim / 2));
  Llama3RopeScaling scaling{};
  if (cfg_.rope_scaling) {
    scaling.factor = cfg_.rope_scaling->factor;
    scaling.low_freq_factor = cfg_.rope_scaling->low_freq_factor;
    scaling.high_freq_factor = cfg_.rope_scaling->high_freq_factor;
    scaling.original_max_position_embeddings =
        static_cast<double>(cfg_.rope_scaling->original_max_position_embeddings);
  }
  rope_inv_freq(inv.data(), static_cast<int>(cfg_.head_dim), cfg_.rope_theta, cfg_.rope_scaling ? &scaling : nullptr);
  inv_freq_ = static_cast<float*>(ops_.alloc(inv.size() * sizeof(float)));
  ops_.upload(inv_freq_, inv.data(), inv.size() * sizeof(float));
}

ModelDef::~ModelDef() {
  lora_.reset();
  for (void* p : slots_) ops_.release(p);
  ops_.release(inv_freq_);
  ops_.release(weights_);
  if (base_grads_) ops_.release(base_grads_);
  if (master_) ops_.release(master_);
}

WeightHandle ModelDef::handle(const std::string& name) const {
  for (std::size_t i = 0; i < base_.size(); ++i)
    if (base_[i].name == name) {
      const int l = tensor_layer_[i];
      return WeightHandle{l >= 0 ? WeightKind::Shard : WeightKind::Dense, static_cast<int>(i), l};
    }
  throw FatalError("model tensor '" + name + "' is not part of this architecture");
}

const void* ModelDef::dense(const WeightHandle& h) const {
  if (!h.present()) return nullptr;
  const std::size_t t = static_cast<std::size_t>(h.tensor), S = ops_.storage_size();
  if (h.kind == WeightKind::Dense) return static_cast<const char*>(weights_) + stored_offset_[t] * S;
  MGRL_CHECK(h.kind == WeightKind::Shard, "NF4 base weights are not implemented");
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
  for (int m = 0; m < kNumModules; ++m) {
    D.W[m] = dense(H.W[m]);
    D.bias[m] = dense(H.bias[m]);
  }
  return D;
}

std::size_t ModelDef::slot_of(int l) const {
  return opts_.shard_keep ? static_cast<std::size_t>(l) : static_cast<std::size_t>(l) % slots_.size();
}

const LayerWeights& ModelDef::layer(int l) const {
  if (!opts_.shard_base) return dense_layers_[static_cast<std::size_t>(l)];
  if (last_layer_ >= 0 && l != last_layer_) direction_ = l > last_layer_ ? 1 : -1;
  last_layer_ = l;
  const std::size_t s = slot_of(l);
  if (slot_layer_[s] != l) gather(l, s, false);
  if (slot_pending_[s]) {  // prefetched: the backend's queue waits for it (on the GPU; nothing on the CPU)
    gatherer_->wait();
    slot_pending_.assign(slot_pending_.size(), false);
  }
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
  const std::size_t S = ops_.storage_size();
  const void* part = static_cast<const char*>(weights_) + sh.stored * S;
  if (gatherer_ && parts_ > 1) {
    if (prefetch) gatherer_->all_gather_async(part, slots_[slot], sh.part_numel * S);
    else gatherer_->all_gather(part, slots_[slot], sh.part_numel * S);
    slot_pending_[slot] = prefetch;
  } else {
    ops_.copy(slots_[slot], part, sh.part_numel * S);
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

std::size_t ModelDef::gather_workspace_bytes() const { return slots_.size() * slot_numel_ * ops_.storage_size(); }

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

void ModelDef::upload_tensor(std::size_t index, const std::vector<float>& host) {
  const BaseTensor& t = base_[index];
  const std::size_t S = ops_.storage_size();
  if (tensor_layer_[index] >= 0) {  // shard_base: the elements of this rank's part only
    const LayerShard& sh = shards_[static_cast<std::size_t>(tensor_layer_[index])];
    const std::size_t lo = sh.begin + static_cast<std::size_t>(part_index_) * sh.part_numel, hi = lo + sh.part_numel;
    const std::size_t from = std::max(t.offset, lo), to = std::min(t.offset + host.size(), hi);
    if (from < to)
      ops_.upload_f32_as_storage(static_cast<char*>(weights_) + (sh.stored + from - lo) * S,
                                 host.data() + (from - t.offset), to - from);
    return;
  }
  ops_.upload_f32_as_storage(static_cast<char*>(weights_) + stored_offset_[index] * S, host.data(), host.size());
  if (master_) ops_.upload(master_ + t.offset, host.data(), host.size() * sizeof(float));
}

void ModelDef::load_weights(const std::string& dir) {
  io::SafetensorsModel model(dir);
  std::vector<float> host;
  for (std::size_t i = 0; i < base_.size(); ++i) {
    const BaseTensor& t = base_[i];
    const io::TensorInfo& info = model.get(t.name, t.shape);
    host.resize(static_cast<std::size_t>(info.numel()));
    io::copy_finite_to_f32(info, host.data());
    upload_tensor(i, host);
  }
}

void ModelDef::init_random(std::uint64_t seed, float std) {
  std::vector<float> host;
  std::uint64_t counter = 0;
  auto uniform = [&] { return random_uniform(seed, counter++) + 0.5 / 9007199254740992.0; };  // in (0, 1)
  for (std::size_t i = 0; i < base_.size(); ++i) {
    const BaseTensor& t = base_[i];
    host.assign(static_cast<std::size_t>(io::shape_numel(t.shape)), 0.0f);
    const bool norm = t.name.find("norm") != std::string::npos;
    const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    for (auto& x : host) {
      if (norm) x = 1.0f;
      else if (!bias) x = static_cast<float>(std * std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
    }
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
      ops_.download_storage_as_f32(out.data(), dense(WeightHandle{WeightKind::Dense, static_cast<int>(i)}),
                                   out.size());
      return out;
    }
  throw FatalError("no base tensor '" + name + "'");
}

}  // namespace mgrl::model
