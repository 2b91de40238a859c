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

ModelDef::ModelDef(io::ModelConfig cfg, kernels::Ops& ops, ModelOptions opts)
    : cfg_(std::move(cfg)), ops_(ops), opts_(opts) {
  if (cfg_.head_dim % 2 != 0) throw UserError("head_dim must be even for rotary embeddings");
  for (const auto& t : io::expected_tensors(cfg_)) {
    base_.push_back({t.name, t.shape, base_numel_});
    base_numel_ += static_cast<std::size_t>(io::shape_numel(t.shape));
  }
  weights_ = ops_.alloc(base_numel_ * ops_.storage_size());
  if (opts_.full_finetune) base_grads_ = static_cast<float*>(ops_.alloc(base_numel_ * sizeof(float)));
  if (opts_.full_finetune && (ops_.storage() != DType::F32 || opts_.master_weights))
    master_ = static_cast<float*>(ops_.alloc(base_numel_ * sizeof(float)));

  // The only string lookups: every handle is resolved here, once.
  const std::size_t n_layers = static_cast<std::size_t>(cfg_.num_hidden_layers);
  layers_.resize(n_layers);
  dense_layers_.resize(n_layers);
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
    LayerWeights& D = dense_layers_[static_cast<std::size_t>(l)];
    LayerGrads& G = grads_[static_cast<std::size_t>(l)];
    D.attn_norm = dense(H.attn_norm);
    D.mlp_norm = dense(H.mlp_norm);
    D.q_norm = dense(H.q_norm);
    D.k_norm = dense(H.k_norm);
    D.post_attn_norm = dense(H.post_attn_norm);
    D.post_mlp_norm = dense(H.post_mlp_norm);
    G.post_attn_norm = grad(H.post_attn_norm);
    G.post_mlp_norm = grad(H.post_mlp_norm);
    G.attn_norm = grad(H.attn_norm);
    G.mlp_norm = grad(H.mlp_norm);
    G.q_norm = grad(H.q_norm);
    G.k_norm = grad(H.k_norm);
    for (int m = 0; m < kNumModules; ++m) {
      D.W[m] = dense(H.W[m]);
      D.bias[m] = dense(H.bias[m]);
      G.W[m] = grad(H.W[m]);
      G.bias[m] = grad(H.bias[m]);
    }
  }
  embed_ = handle("model.embed_tokens.weight");
  final_norm_ = handle("model.norm.weight");
  head_ = handle(cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");

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
    rope_inv_freq(inv.data(), static_cast<int>(cfg_.head_dim), theta, llama3 ? &scaling : nullptr);
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
  if (cfg_.query_pre_attn_scalar > 0) o.scale = static_cast<float>(cfg_.attention_scale());
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
  ops_.release(inv_freq_);
  if (inv_freq_local_) ops_.release(inv_freq_local_);
  ops_.release(weights_);
  if (base_grads_) ops_.release(base_grads_);
  if (master_) ops_.release(master_);
}

WeightHandle ModelDef::handle(const std::string& name) const {
  for (std::size_t i = 0; i < base_.size(); ++i)
    if (base_[i].name == name) return WeightHandle{WeightKind::Dense, static_cast<int>(i)};
  throw FatalError("model tensor '" + name + "' is not part of this architecture");
}

const void* ModelDef::dense(const WeightHandle& h) const {
  if (!h.present()) return nullptr;
  MGRL_CHECK(h.kind == WeightKind::Dense, "only dense base weights are implemented");
  return static_cast<const char*>(weights_) + base_[static_cast<std::size_t>(h.tensor)].offset * ops_.storage_size();
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

void ModelDef::upload_tensor(std::size_t index, const std::vector<float>& host) {
  const BaseTensor& t = base_[index];
  ops_.upload_f32_as_storage(static_cast<char*>(weights_) + t.offset * ops_.storage_size(), host.data(), host.size());
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
      if (norm) x = cfg_.gemma ? 0.0f : 1.0f;  // Gemma norms scale by (1 + w)
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
      std::vector<float> out(static_cast<std::size_t>(io::shape_numel(base_[i].shape)));
      ops_.download_storage_as_f32(out.data(), dense(WeightHandle{WeightKind::Dense, static_cast<int>(i)}),
                                   out.size());
      return out;
    }
  throw FatalError("no base tensor '" + name + "'");
}

}  // namespace mgrl::model
