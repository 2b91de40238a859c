// transformer.cpp: forward and backward of the Llama / Qwen2 / Qwen3 decoder with LoRA over kernels::Ops.
#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "core/random.h"
#include "io/safetensors.h"
#include "kernels/cpu/rope.h"

namespace mgrl::model {

int Batch::max_len() const {
  int m = 0;
  for (int b = 0; b < B(); ++b) m = std::max(m, length(b));
  return m;
}

void Batch::add(const std::vector<std::int32_t>& seq) {
  tokens.insert(tokens.end(), seq.begin(), seq.end());
  offsets.push_back(static_cast<std::int32_t>(tokens.size()));
}

Batch Batch::from_sequences(const std::vector<std::vector<std::int32_t>>& seqs) {
  Batch b;
  std::size_t n = 0;
  for (const auto& s : seqs) n += s.size();
  b.tokens.reserve(n);
  b.offsets.reserve(seqs.size() + 1);
  for (const auto& s : seqs) b.add(s);
  return b;
}

Batch Batch::from_padded(const std::int32_t* tokens, const std::int32_t* lengths, int B, int L) {
  Batch b;
  for (int i = 0; i < B; ++i) {
    const std::int32_t* row = tokens + static_cast<std::ptrdiff_t>(i) * L;
    b.add(std::vector<std::int32_t>(row, row + std::clamp(lengths[i], 0, L)));
  }
  return b;
}

// Pointers to one layer's base weights (storage dtype) and, for full fine-tuning, their f32 gradients.
struct Transformer::LayerW {
  const void *attn_norm, *q_norm, *k_norm, *mlp_norm;
  const void* W[kNumModules];
  const void* bias[kNumModules];
  float *d_attn_norm, *d_q_norm, *d_k_norm, *d_mlp_norm;
  float* dW[kNumModules];
  float* dbias[kNumModules];
};

// What one layer keeps from its forward for its backward.
struct Transformer::Acts {
  void *h1, *q, *k, *v, *q_pre, *k_pre, *attn, *x_mid, *h2, *gate, *up, *act;
  float *rstd1, *rstd_q, *rstd_k, *lse, *rstd2;
  float* xa[kNumModules];
  void* xd[kNumModules];  // LoRA inputs after dropout (training with dropout only)
};

// Buffers shared by all layers.
struct Transformer::Work {
  std::vector<void*> xs;  // residual stream at the input of each layer, and after the last
  void *tmp, *xf, *recompute_out;
  float *rstd_f, *lse_head, *lp, *wrow, *lora_scratch;
  std::int32_t *ids, *targets, *pos, *cu_seqlens;
  void* head_scratch;
  void *dx, *dh, *dq, *dk, *dv, *dq2, *dk2, *dattn, *dgate, *dup, *dact, *dxf, *dlora;
  std::vector<std::int32_t> host_ids, host_offsets;  // of the last forward
  std::vector<float> host_wrow;                      // its loss weights by LM-head row (kept: uploads are async)
};

// Buffers of infer(), sized for the largest call seen.
struct Transformer::InferWork {
  int cap_T = 0, cap_R = 0;
  std::vector<void*> allocations;
  void *x, *h, *q, *k, *v, *q_pre, *k_pre, *attn, *tmp, *gate, *up, *act, *hsel;
  float *rstd, *xa, *logits;
  std::int32_t *ids, *slot, *pos, *rows;
};

// The activations of one kind of pass: training forwards (kept for the backward) and no-grad scoring passes
// (score()) each have their own, so a scoring pass never overwrites what a pending backward needs.
struct Transformer::Arena {
  bool grads = true;  // allocates the backward's buffers and one activation set per layer
  int cap_T = 0;
  std::vector<void*> allocations;
  std::vector<std::unique_ptr<Acts>> acts;
  std::unique_ptr<Work> work;
  // The last forward through this arena.
  int B = 0, T = 0, max_len = 0;
  bool train = false, lora = false;
  bool weights_ready = false;  // add_loss uploaded this forward's loss weights
  std::uint64_t seed = 0;
  float logit_scale = 1.0f;
};

namespace {
std::string layer_name(int l, const std::string& rest) { return "model.layers." + std::to_string(l) + "." + rest; }

// The dropout stream of one adapter in one step.
std::uint64_t mix_seed(std::uint64_t seed, int layer, int module) {
  return random_bits(seed, static_cast<std::uint64_t>(layer * kNumModules + module));
}
}  // namespace

Transformer::Transformer(io::ModelConfig cfg, kernels::Ops& ops, ModelOptions opts)
    : cfg_(std::move(cfg)), ops_(ops), opts_(opts), train_arena_(std::make_unique<Arena>()),
      score_arena_(std::make_unique<Arena>()), cur_(train_arena_.get()) {
  score_arena_->grads = false;
  if (cfg_.head_dim % 2 != 0) throw UserError("head_dim must be even for rotary embeddings");
  // config.json features that io::parse_hf_config reads but this model does not compute yet.
  if (cfg_.gemma || cfg_.sliding_window > 0 || cfg_.hidden_act != "silu" ||
      (cfg_.rope_scaling && cfg_.rope_scaling->rope_type != "llama3")) {
    throw UserError(std::string("config.json: ") + io::architecture_name(cfg_.arch) +
                    (cfg_.sliding_window > 0 ? " with sliding_window" : "") +
                    " is not supported by the model yet (Gemma norms, GeGLU, sliding windows, soft-capping, linear "
                    "RoPE scaling)");
  }
  for (const auto& t : io::expected_tensors(cfg_)) {
    base_.push_back({t.name, t.shape, base_numel_});
    base_numel_ += static_cast<std::size_t>(io::shape_numel(t.shape));
  }
  weights_ = ops_.alloc(base_numel_ * ops_.storage_size());
  if (opts_.full_finetune) base_grads_ = static_cast<float*>(ops_.alloc(base_numel_ * sizeof(float)));
  if (opts_.full_finetune && (ops_.storage() != DType::F32 || opts_.master_weights))
    master_ = static_cast<float*>(ops_.alloc(base_numel_ * sizeof(float)));

  layers_.resize(static_cast<std::size_t>(cfg_.num_hidden_layers));
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    LayerW& L = layers_[l];
    L.attn_norm = w(layer_name(l, "input_layernorm.weight"));
    L.mlp_norm = w(layer_name(l, "post_attention_layernorm.weight"));
    L.q_norm = cfg_.qk_norm ? w(layer_name(l, "self_attn.q_norm.weight")) : nullptr;
    L.k_norm = cfg_.qk_norm ? w(layer_name(l, "self_attn.k_norm.weight")) : nullptr;
    L.d_attn_norm = g(layer_name(l, "input_layernorm.weight"));
    L.d_mlp_norm = g(layer_name(l, "post_attention_layernorm.weight"));
    L.d_q_norm = cfg_.qk_norm ? g(layer_name(l, "self_attn.q_norm.weight")) : nullptr;
    L.d_k_norm = cfg_.qk_norm ? g(layer_name(l, "self_attn.k_norm.weight")) : nullptr;
    for (int m = 0; m < kNumModules; ++m) {
      const std::string base = layer_name(l, module_path(static_cast<Module>(m)));
      L.W[m] = w(base + ".weight");
      L.dW[m] = g(base + ".weight");
      const bool has_bias = std::any_of(base_.begin(), base_.end(), [&](const BaseTensor& t) {
        return t.name == base + ".bias";
      });
      L.bias[m] = has_bias ? w(base + ".bias") : nullptr;
      L.dbias[m] = has_bias ? g(base + ".bias") : nullptr;
    }
  }
  embed_ = w("model.embed_tokens.weight");
  final_norm_ = w("model.norm.weight");
  head_ = w(cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  // Rotary inverse frequencies, computed once on the host as transformers does.
  std::vector<float> inv(static_cast<std::size_t>(cfg_.head_dim / 2));
  kernels::cpu::Llama3RopeScaling scaling{};
  if (cfg_.rope_scaling) {
    scaling.factor = cfg_.rope_scaling->factor;
    scaling.low_freq_factor = cfg_.rope_scaling->low_freq_factor;
    scaling.high_freq_factor = cfg_.rope_scaling->high_freq_factor;
    scaling.original_max_position_embeddings =
        static_cast<double>(cfg_.rope_scaling->original_max_position_embeddings);
  }
  kernels::cpu::rope_inv_freq(inv.data(), static_cast<int>(cfg_.head_dim), cfg_.rope_theta,
                              cfg_.rope_scaling ? &scaling : nullptr);
  inv_freq_ = static_cast<float*>(ops_.alloc(inv.size() * sizeof(float)));
  ops_.upload(inv_freq_, inv.data(), inv.size() * sizeof(float));
}

Transformer::~Transformer() {
  ops_.forget_recordings();  // decode recordings use this model's buffers
  for (Arena* a : {train_arena_.get(), score_arena_.get()})
    for (void* p : a->allocations) ops_.release(p);
  if (infer_)
    for (void* p : infer_->allocations) ops_.release(p);
  ops_.release(inv_freq_);
  ops_.release(weights_);
  if (base_grads_) ops_.release(base_grads_);
  if (master_) ops_.release(master_);
}

float* Transformer::trainable_base() {
  MGRL_CHECK(opts_.full_finetune, "trainable_base() without full_finetune");
  if (master_) return master_;
  MGRL_CHECK(ops_.storage() == DType::F32, "full fine-tuning on non-f32 storage needs master weights");
  return static_cast<float*>(weights_);
}

void Transformer::master_weights_changed() {
  if (master_) ops_.f32_to_storage(weights_, master_, base_numel_);
}

const void* Transformer::w(const std::string& name) const {
  for (const auto& t : base_)
    if (t.name == name) return static_cast<const char*>(weights_) + t.offset * ops_.storage_size();
  throw FatalError("model tensor '" + name + "' is not part of this architecture");
}

float* Transformer::g(const std::string& name) {
  if (!base_grads_) return nullptr;
  for (const auto& t : base_)
    if (t.name == name) return base_grads_ + t.offset;
  throw FatalError("model tensor '" + name + "' is not part of this architecture");
}

void Transformer::load_weights(const std::string& dir) {
  io::SafetensorsModel model(dir);
  std::vector<float> host;
  for (const auto& t : base_) {
    const io::TensorInfo& info = model.get(t.name, t.shape);
    host.resize(static_cast<std::size_t>(info.numel()));
    io::copy_finite_to_f32(info, host.data());
    ops_.upload_f32_as_storage(const_cast<void*>(w(t.name)), host.data(), host.size());
    if (master_) ops_.upload(master_ + t.offset, host.data(), host.size() * sizeof(float));
  }
}

void Transformer::init_random(std::uint64_t seed, float std) {
  std::vector<float> host;
  std::uint64_t counter = 0;
  auto uniform = [&] { return random_uniform(seed, counter++) + 0.5 / 9007199254740992.0; };  // in (0, 1)
  for (const auto& t : base_) {
    host.assign(static_cast<std::size_t>(io::shape_numel(t.shape)), 0.0f);
    const bool norm = t.name.find("norm") != std::string::npos;
    const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    for (auto& x : host) {
      if (norm) x = 1.0f;
      else if (!bias) x = static_cast<float>(std * std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
    }
    ops_.upload_f32_as_storage(const_cast<void*>(w(t.name)), host.data(), host.size());
    if (master_) ops_.upload(master_ + t.offset, host.data(), host.size() * sizeof(float));
  }
}

LoraParams& Transformer::add_lora(const LoraConfig& cfg, std::uint64_t seed) {
  lora_ = std::make_unique<LoraParams>(cfg_, cfg, ops_);
  lora_->init(seed);
  for (Arena* a : {train_arena_.get(), score_arena_.get()}) {  // LoRA buffers depend on r: rebuilt when next used
    for (void* p : a->allocations) ops_.release(p);
    a->allocations.clear();
    a->acts.clear();
    a->work.reset();
    a->cap_T = 0;
  }
  return *lora_;
}

void Transformer::plan(int max_tokens, bool scoring) {
  struct Restore {
    Transformer* t;
    ~Restore() { t->cur_ = t->train_arena_.get(); }
  } restore{this};
  cur_ = train_arena_.get();
  reserve(max_tokens, 1);
  if (!scoring) return;
  cur_ = score_arena_.get();
  reserve(max_tokens, 1);
}

std::size_t Transformer::activation_bytes(int T) {
  Arena probe;  // a training arena that nothing is allocated for
  Arena* const saved = cur_;
  cur_ = &probe;
  counting_ = true;
  counted_ = 0;
  reserve(T, 1);
  counting_ = false;
  cur_ = saved;
  return counted_;
}

void Transformer::reserve(int T, int B) {
  // All or nothing: an allocation that fails (OutOfMemory) leaves the arena empty, so that a smaller plan can follow.
  try {
    reserve_arena(T, B);
  } catch (...) {
    if (!counting_) {
      for (void* p : cur_->allocations) ops_.release(p);
      cur_->allocations.clear();
      cur_->acts.clear();
      cur_->work.reset();
      cur_->cap_T = 0;
    }
    throw;
  }
}

void Transformer::reserve_arena(int T, int B) {
  if (T <= cur_->cap_T && B <= cur_->cap_T) return;
  T = std::max(T, B);
  for (void* p : cur_->allocations) ops_.release(p);
  cur_->allocations.clear();
  cur_->acts.clear();
  cur_->cap_T = T;
  const std::size_t S = ops_.storage_size();
  const std::size_t t = static_cast<std::size_t>(T);
  const std::size_t D = cfg_.hidden_size, Q = cfg_.q_dim(), K = cfg_.kv_dim(), I = cfg_.intermediate_size;
  const std::size_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
  const std::size_t r = lora_ ? static_cast<std::size_t>(lora_->config().r) : 0;
  const bool dropout = lora_ && lora_->config().dropout > 0;
  auto raw = [&](std::size_t bytes) -> void* {
    if (counting_) {
      counted_ += bytes;
      return nullptr;
    }
    void* p = ops_.alloc(bytes);
    cur_->allocations.push_back(p);
    return p;
  };
  auto st = [&](std::size_t n) { return raw(n * S); };  // storage-dtype buffer
  auto f32 = [&](std::size_t n) { return static_cast<float*>(raw(n * sizeof(float))); };
  auto i32 = [&](std::size_t n) { return static_cast<std::int32_t*>(raw(n * sizeof(std::int32_t))); };
  const bool grads = cur_->grads;
  const int n_acts = opts_.recompute || !grads ? 1 : static_cast<int>(cfg_.num_hidden_layers);
  for (int i = 0; i < n_acts; ++i) {
    auto a = std::make_unique<Acts>();
    a->h1 = st(t * D);
    a->q = st(t * Q);
    a->k = st(t * K);
    a->v = st(t * K);
    a->q_pre = cfg_.qk_norm ? st(t * Q) : nullptr;
    a->k_pre = cfg_.qk_norm ? st(t * K) : nullptr;
    a->attn = st(t * Q);
    a->x_mid = st(t * D);
    a->h2 = st(t * D);
    a->gate = st(t * I);
    a->up = st(t * I);
    a->act = st(t * I);
    a->rstd1 = f32(t);
    a->rstd2 = f32(t);
    a->rstd_q = cfg_.qk_norm ? f32(t * nh) : nullptr;
    a->rstd_k = cfg_.qk_norm ? f32(t * nkv) : nullptr;
    a->lse = f32(t * nh);
    for (int m = 0; m < kNumModules; ++m) {
      const auto mod = static_cast<Module>(m);
      const bool on = lora_ && lora_->find(0, mod) != nullptr;
      a->xa[m] = on ? f32(t * r) : nullptr;
      a->xd[m] = on && dropout && grads ? st(t * static_cast<std::size_t>(module_in(cfg_, mod))) : nullptr;
    }
    cur_->acts.push_back(std::move(a));
  }
  cur_->work = std::make_unique<Work>();
  Work& W = *cur_->work;
  for (int l = 0; l <= cfg_.num_hidden_layers; ++l) W.xs.push_back(st(t * D));
  W.tmp = st(t * D);
  W.xf = st(t * D);
  W.recompute_out = opts_.recompute && grads ? st(t * D) : nullptr;
  W.rstd_f = f32(t);
  W.lse_head = f32(t);
  W.lp = f32(t);
  W.wrow = f32(t);
  W.lora_scratch = r && grads ? f32(t * r) : nullptr;
  W.ids = i32(t);
  W.targets = i32(t);
  W.pos = i32(t);
  W.cu_seqlens = i32(t + 1);  // B <= T
  W.head_scratch = raw(ops_.lm_head_scratch_bytes(static_cast<int>(cfg_.vocab_size)));
  if (!grads) return;  // a scoring arena: no backward
  W.dx = st(t * D);
  W.dh = st(t * D);
  W.dq = st(t * Q);
  W.dk = st(t * K);
  W.dv = st(t * K);
  W.dq2 = cfg_.qk_norm ? st(t * Q) : nullptr;
  W.dk2 = cfg_.qk_norm ? st(t * K) : nullptr;
  W.dattn = st(t * Q);
  W.dgate = st(t * I);
  W.dup = st(t * I);
  W.dact = st(t * I);
  W.dxf = st(t * D);
  W.dlora = dropout ? st(t * std::max({D, Q, I})) : nullptr;
}

void Transformer::linear_with_lora(int l, Module m, void* y, const void* x, const void* W, const void* bias, int T,
                                   Acts& a, bool use_lora, bool train, std::uint64_t seed) {
  const int in = module_in(cfg_, m), out = module_out(cfg_, m);
  ops_.linear_forward(y, x, W, bias, T, in, out);
  const LoraSlot* s = use_lora && lora_ ? lora_->find(l, m) : nullptr;
  if (!s) return;
  const kernels::PhaseScope phase(ops_, kernels::Phase::Lora);
  const int mi = static_cast<int>(m);
  const void* xin = x;
  const float p = static_cast<float>(lora_->config().dropout);
  if (train && p > 0) {
    ops_.dropout(a.xd[mi], x, static_cast<std::int64_t>(T) * in, p, mix_seed(seed, l, mi));
    xin = a.xd[mi];
  }
  lora_add(l, m, y, xin, T, a.xa[mi]);
}

void Transformer::lora_add(int l, Module m, void* y, const void* x, int T, float* xa) {
  const LoraSlot* s = lora_ ? lora_->find(l, m) : nullptr;
  if (!s) return;
  ops_.lora_forward(y, xa, x, lora_->A(*s), lora_->B(*s), lora_->config().scale(), T, module_in(cfg_, m),
                    lora_->config().r, module_out(cfg_, m));
}

void Transformer::linear_with_lora_backward(int l, Module m, void* dx, const void* dy, const void* x, const void* W,
                                            float* dW, float* dbias, int T, Acts& a, bool accumulate) {
  const int in = module_in(cfg_, m), out = module_out(cfg_, m);
  ops_.linear_backward(dx, dW, dbias, dy, x, W, T, in, out, accumulate);
  const LoraSlot* s = cur_->lora && lora_ ? lora_->find(l, m) : nullptr;
  if (!s) return;
  const kernels::PhaseScope phase(ops_, kernels::Phase::Lora);
  const int mi = static_cast<int>(m);
  const auto& c = lora_->config();
  const float p = static_cast<float>(c.dropout);
  if (p > 0) {
    // The adapter saw dropout(x): its input gradient goes back through the same mask.
    const std::size_t n = static_cast<std::size_t>(T) * in;
    ops_.zero(cur_->work->dlora, n * ops_.storage_size());
    ops_.lora_backward(cur_->work->dlora, lora_->dA(*s), lora_->dB(*s), dy, a.xd[mi], a.xa[mi], lora_->A(*s),
                       lora_->B(*s), c.scale(), T, in, c.r, out, cur_->work->lora_scratch);
    ops_.dropout(cur_->work->dlora, cur_->work->dlora, static_cast<std::int64_t>(n), p, mix_seed(cur_->seed, l, mi));
    ops_.residual_forward(dx, cur_->work->dlora, static_cast<std::int64_t>(n));
  } else {
    ops_.lora_backward(dx, lora_->dA(*s), lora_->dB(*s), dy, x, a.xa[mi], lora_->A(*s), lora_->B(*s), c.scale(), T,
                       in, c.r, out, cur_->work->lora_scratch);
  }
}

void Transformer::layer_forward(int l, const void* x_in, void* x_out, Acts& a, bool use_lora, bool train,
                                std::uint64_t seed) {
  const LayerW& Lw = layers_[l];
  Work& W = *cur_->work;
  const int T = cur_->T;
  const int nh = static_cast<int>(cfg_.num_attention_heads), nkv = static_cast<int>(cfg_.num_key_value_heads);
  const int hd = static_cast<int>(cfg_.head_dim);
  const BlockIO io{x_in, a.x_mid, x_out, a.h1, a.q, a.k, a.v, a.q_pre, a.k_pre, a.attn, a.h2, a.gate, a.up, a.act,
                   W.tmp, a.rstd1, a.rstd_q, a.rstd_k, a.rstd2, W.pos};
  block_forward(
      l, io, T,
      [&](Module m, void* y, const void* x) {
        const int mi = static_cast<int>(m);
        linear_with_lora(l, m, y, x, Lw.W[mi], Lw.bias[mi], T, a, use_lora, train, seed);
      },
      [&] {
        const kernels::PhaseScope phase(ops_, kernels::Phase::Attention);
        ops_.attention_forward(a.attn, a.lse, a.q, a.k, a.v, W.cu_seqlens, cur_->B, T, cur_->max_len, nh, nkv, hd);
      });
}

void Transformer::block_forward(int l, const BlockIO& io, int T, const std::function<void(Module, void*, const void*)>& lin,
                                const std::function<void()>& attend) {
  const LayerW& Lw = layers_[l];
  const int D = static_cast<int>(cfg_.hidden_size), I = static_cast<int>(cfg_.intermediate_size);
  const int nh = static_cast<int>(cfg_.num_attention_heads), nkv = static_cast<int>(cfg_.num_key_value_heads);
  const int hd = static_cast<int>(cfg_.head_dim);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const std::size_t S = ops_.storage_size();

  ops_.rmsnorm_forward(io.h1, io.rstd1, io.x_in, Lw.attn_norm, T, D, eps);
  lin(Module::Q, cfg_.qk_norm ? io.q_pre : io.q, io.h1);
  lin(Module::K, cfg_.qk_norm ? io.k_pre : io.k, io.h1);
  lin(Module::V, io.v, io.h1);
  if (cfg_.qk_norm) {
    ops_.rmsnorm_forward(io.q, io.rstd_q, io.q_pre, Lw.q_norm, T * nh, hd, eps);
    ops_.rmsnorm_forward(io.k, io.rstd_k, io.k_pre, Lw.k_norm, T * nkv, hd, eps);
  }
  ops_.rope_forward(io.q, io.pos, inv_freq_, T, nh, hd);
  ops_.rope_forward(io.k, io.pos, inv_freq_, T, nkv, hd);
  attend();
  lin(Module::O, io.tmp, io.attn);
  ops_.copy(io.x_mid, io.x_in, static_cast<std::size_t>(T) * D * S);  // no-op when in place
  ops_.residual_forward(io.x_mid, io.tmp, static_cast<std::int64_t>(T) * D);

  ops_.rmsnorm_forward(io.h2, io.rstd2, io.x_mid, Lw.mlp_norm, T, D, eps);
  lin(Module::Gate, io.gate, io.h2);
  lin(Module::Up, io.up, io.h2);
  ops_.swiglu_forward(io.act, io.gate, io.up, static_cast<std::int64_t>(T) * I);
  lin(Module::Down, io.tmp, io.act);
  ops_.copy(io.x_out, io.x_mid, static_cast<std::size_t>(T) * D * S);
  ops_.residual_forward(io.x_out, io.tmp, static_cast<std::int64_t>(T) * D);
}

void Transformer::layer_backward(int l, Acts& a, void* dx) {
  const LayerW& Lw = layers_[l];
  Work& W = *cur_->work;
  const int T = cur_->T;
  const int D = static_cast<int>(cfg_.hidden_size), I = static_cast<int>(cfg_.intermediate_size);
  const int nh = static_cast<int>(cfg_.num_attention_heads), nkv = static_cast<int>(cfg_.num_key_value_heads);
  const int hd = static_cast<int>(cfg_.head_dim);
  auto lin_back = [&](Module m, void* dxin, const void* dy, const void* x, bool accumulate) {
    const int mi = static_cast<int>(m);
    linear_with_lora_backward(l, m, dxin, dy, x, Lw.W[mi], Lw.dW[mi], Lw.dbias[mi], T, a, accumulate);
  };
  // MLP: out = x_mid + down(swiglu(gate(h2), up(h2))), h2 = norm(x_mid)
  lin_back(Module::Down, W.dact, dx, a.act, false);
  ops_.swiglu_backward(W.dgate, W.dup, W.dact, a.gate, a.up, static_cast<std::int64_t>(T) * I);
  lin_back(Module::Gate, W.dh, W.dgate, a.h2, false);
  lin_back(Module::Up, W.dh, W.dup, a.h2, true);
  ops_.rmsnorm_backward(dx, Lw.d_mlp_norm, W.dh, a.x_mid, Lw.mlp_norm, a.rstd2, T, D, true);  // dx = d(x_mid)
  // Attention: x_mid = x_in + o(attention(rope(q), rope(k), v)), q/k/v from h1 = norm(x_in)
  lin_back(Module::O, W.dattn, dx, a.attn, false);
  ops_.phase_begin(kernels::Phase::Attention);
  ops_.attention_backward(W.dq, W.dk, W.dv, W.dattn, a.attn, a.q, a.k, a.v, a.lse, W.cu_seqlens, cur_->B, T,
                          cur_->max_len, nh, nkv, hd);
  ops_.phase_end(kernels::Phase::Attention);
  ops_.rope_backward(W.dq, W.pos, inv_freq_, T, nh, hd);
  ops_.rope_backward(W.dk, W.pos, inv_freq_, T, nkv, hd);
  void* dq = W.dq;
  void* dk = W.dk;
  if (cfg_.qk_norm) {
    ops_.rmsnorm_backward(W.dq2, Lw.d_q_norm, W.dq, a.q_pre, Lw.q_norm, a.rstd_q, T * nh, hd, false);
    ops_.rmsnorm_backward(W.dk2, Lw.d_k_norm, W.dk, a.k_pre, Lw.k_norm, a.rstd_k, T * nkv, hd, false);
    dq = W.dq2;
    dk = W.dk2;
  }
  lin_back(Module::Q, W.dh, dq, a.h1, false);
  lin_back(Module::K, W.dh, dk, a.h1, true);
  lin_back(Module::V, W.dh, W.dv, a.h1, true);
  ops_.rmsnorm_backward(dx, Lw.d_attn_norm, W.dh, W.xs[l], Lw.attn_norm, a.rstd1, T, D, true);  // dx = d(x_in)
}

void Transformer::forward(const Batch& batch, float* logprobs, bool use_lora, bool train, std::uint64_t dropout_seed,
                          float logit_scale) {
  cur_ = train_arena_.get();
  forward_pass(batch, logprobs, use_lora, train, dropout_seed, logit_scale);
}

void Transformer::score(const Batch& batch, float* logprobs, bool use_lora, float logit_scale) {
  struct Restore {
    Transformer* t;
    ~Restore() { t->cur_ = t->train_arena_.get(); }
  } restore{this};
  cur_ = score_arena_.get();
  forward_pass(batch, logprobs, use_lora, false, 0, logit_scale);
}

void Transformer::forward_pass(const Batch& batch, float* logprobs, bool use_lora, bool train,
                               std::uint64_t dropout_seed, float logit_scale) {
  MGRL_CHECK(!train || cur_->grads, "a training forward needs the training arena");
  const kernels::PhaseScope phase(ops_, kernels::Phase::Forward);
  const int B = batch.B(), T = batch.T();
  const int V = static_cast<int>(cfg_.vocab_size), D = static_cast<int>(cfg_.hidden_size);
  MGRL_CHECK(B > 0 && batch.offsets.front() == 0 && batch.tokens.size() == static_cast<std::size_t>(T),
             "malformed batch");
  int max_len = 0;
  for (int b = 0; b < B; ++b) {
    const int len = batch.length(b);
    if (len < 1) throw UserError("sequence " + std::to_string(b) + " of the batch is empty");
    if (len > cfg_.max_position_embeddings && cfg_.max_position_embeddings > 0)
      throw UserError("a sequence of " + std::to_string(len) + " tokens is longer than the model's " +
                      "max_position_embeddings (" + std::to_string(cfg_.max_position_embeddings) + ")");
    max_len = std::max(max_len, len);
  }
  reserve(T, B);
  cur_->B = B;
  cur_->T = T;
  cur_->max_len = max_len;
  cur_->train = train;
  cur_->lora = use_lora && lora_ != nullptr;
  cur_->seed = dropout_seed;
  cur_->logit_scale = logit_scale;
  Work& W = *cur_->work;

  W.host_ids.assign(static_cast<std::size_t>(T), -1);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(T), -1), pos(static_cast<std::size_t>(T), 0);
  for (int b = 0; b < B; ++b) {
    const int len = batch.length(b), row0 = batch.offsets[b];
    for (int t = 0; t < len; ++t) {
      const std::size_t i = static_cast<std::size_t>(row0 + t);
      pos[i] = t;
      const std::int32_t id = batch.tokens[i];
      if (id < 0 || id >= V)
        throw UserError("token id " + std::to_string(id) + " is outside the vocabulary (size " + std::to_string(V) +
                        ")");
      W.host_ids[i] = id;
      if (t + 1 < len) targets[i] = batch.tokens[i + 1];
    }
  }
  W.host_offsets = batch.offsets;
  ops_.upload(W.ids, W.host_ids.data(), static_cast<std::size_t>(T) * 4);
  ops_.upload(W.targets, targets.data(), static_cast<std::size_t>(T) * 4);
  ops_.upload(W.pos, pos.data(), static_cast<std::size_t>(T) * 4);
  ops_.upload(W.cu_seqlens, batch.offsets.data(), static_cast<std::size_t>(B + 1) * 4);

  ops_.embedding_forward(W.xs[0], W.ids, embed_, T, V, D);
  for (int l = 0; l < cfg_.num_hidden_layers; ++l)
    layer_forward(l, W.xs[l], W.xs[l + 1], *cur_->acts[cur_->acts.size() == 1 ? 0 : l], use_lora, train,
                  dropout_seed);
  ops_.rmsnorm_forward(W.xf, W.rstd_f, W.xs[cfg_.num_hidden_layers], final_norm_, T, D,
                       static_cast<float>(cfg_.rms_norm_eps));
  ops_.lm_head_logprob_forward(W.lp, W.lse_head, W.xf, head_, W.targets, T, D, V, logit_scale, W.head_scratch);
  cur_->weights_ready = false;
  if (!logprobs) return;

  // Row t predicts token t + 1.
  std::vector<float> lp(static_cast<std::size_t>(T));
  ops_.download(lp.data(), W.lp, lp.size() * sizeof(float));
  std::fill(logprobs, logprobs + T, 0.0f);
  for (int b = 0; b < B; ++b)
    for (int i = batch.offsets[b]; i + 1 < batch.offsets[b + 1]; ++i) logprobs[i + 1] = lp[static_cast<std::size_t>(i)];
}

// The loss weights of the packed tokens as the LM head's rows use them: row i predicts token i + 1.
void Transformer::upload_loss_weights(const float* weights) {
  Work& W = *cur_->work;
  W.host_wrow.assign(static_cast<std::size_t>(cur_->T), 0.0f);
  for (int b = 0; b < cur_->B; ++b)
    for (int i = W.host_offsets[b]; i + 1 < W.host_offsets[b + 1]; ++i)
      W.host_wrow[static_cast<std::size_t>(i)] = weights[i + 1];
  ops_.upload(W.wrow, W.host_wrow.data(), W.host_wrow.size() * sizeof(float));
  cur_->weights_ready = true;
}

void Transformer::add_loss(const float* weights, double* loss_acc) {
  cur_ = train_arena_.get();
  MGRL_CHECK(cur_->work && cur_->train, "add_loss() needs a forward(train = true) first");
  upload_loss_weights(weights);
  ops_.weighted_sum_accumulate(loss_acc, cur_->work->lp, cur_->work->wrow, static_cast<std::size_t>(cur_->T), -1.0);
}

void Transformer::backward(const float* weights, const std::function<void(int)>& layer_done) {
  cur_ = train_arena_.get();
  MGRL_CHECK(cur_->work && cur_->train, "backward() needs a forward(train = true) first");
  MGRL_CHECK(cur_->lora || opts_.full_finetune, "backward() with nothing trainable");
  const kernels::PhaseScope phase(ops_, kernels::Phase::Backward);
  Work& W = *cur_->work;
  const int T = cur_->T;
  const int V = static_cast<int>(cfg_.vocab_size), D = static_cast<int>(cfg_.hidden_size);
  if (weights) {
    upload_loss_weights(weights);
  } else {
    MGRL_CHECK(cur_->weights_ready, "backward(nullptr) needs add_loss() after the forward");
  }

  float* dhead = base_grads_ ? g(cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight") : nullptr;
  ops_.lm_head_logprob_backward(W.dxf, dhead, W.wrow, W.xf, head_, W.targets, W.lse_head, T, D, V, cur_->logit_scale,
                                W.head_scratch);
  ops_.rmsnorm_backward(W.dx, g("model.norm.weight"), W.dxf, W.xs[cfg_.num_hidden_layers], final_norm_,
                        W.rstd_f, T, D, false);
  for (int l = cfg_.num_hidden_layers - 1; l >= 0; --l) {
    Acts& a = *cur_->acts[opts_.recompute ? 0 : l];
    if (opts_.recompute) layer_forward(l, W.xs[l], W.recompute_out, a, cur_->lora, true, cur_->seed);
    layer_backward(l, a, W.dx);
    if (layer_done) layer_done(l);
  }
  if (base_grads_) ops_.embedding_backward(g("model.embed_tokens.weight"), W.dx, W.ids, T, V, D);
}


void Transformer::reserve_infer(int T, int R) {
  if (!infer_) infer_ = std::make_unique<InferWork>();
  InferWork& I = *infer_;
  if (T <= I.cap_T && R <= I.cap_R) return;
  ops_.forget_recordings();  // recorded decode steps use these buffers
  for (void* p : I.allocations) ops_.release(p);
  I.allocations.clear();
  I.cap_T = std::max(T, I.cap_T);
  I.cap_R = std::max(R, I.cap_R);
  const std::size_t t = static_cast<std::size_t>(I.cap_T), r = static_cast<std::size_t>(I.cap_R);
  const std::size_t S = ops_.storage_size();
  const std::size_t D = cfg_.hidden_size, Q = cfg_.q_dim(), K = cfg_.kv_dim(), In = cfg_.intermediate_size;
  auto buf = [&](std::size_t bytes) {
    void* p = ops_.alloc(bytes);
    I.allocations.push_back(p);
    return p;
  };
  I.x = buf(t * D * S);
  I.h = buf(t * D * S);
  I.q = buf(t * Q * S);
  I.k = buf(t * K * S);
  I.v = buf(t * K * S);
  I.q_pre = cfg_.qk_norm ? buf(t * Q * S) : nullptr;
  I.k_pre = cfg_.qk_norm ? buf(t * K * S) : nullptr;
  I.attn = buf(t * Q * S);
  I.tmp = buf(t * D * S);
  I.gate = buf(t * In * S);
  I.up = buf(t * In * S);
  I.act = buf(t * In * S);
  I.hsel = buf(r * D * S);
  I.rstd = static_cast<float*>(buf(t * static_cast<std::size_t>(cfg_.num_attention_heads) * sizeof(float)));
  I.xa = static_cast<float*>(buf(t * static_cast<std::size_t>(lora_ ? lora_->config().r : 1) * sizeof(float)));
  I.logits = static_cast<float*>(buf(r * static_cast<std::size_t>(cfg_.vocab_size) * sizeof(float)));
  I.ids = static_cast<std::int32_t*>(buf(t * 4));
  I.slot = static_cast<std::int32_t*>(buf(t * 4));
  I.pos = static_cast<std::int32_t*>(buf(t * 4));
  I.rows = static_cast<std::int32_t*>(buf(r * 4));
}

const float* Transformer::infer(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& slot,
                                const std::vector<std::int32_t>& pos, const std::vector<std::int32_t>& out_rows,
                                KvCache& cache, bool use_lora) {
  const int T = static_cast<int>(tokens.size()), R = static_cast<int>(out_rows.size());
  MGRL_CHECK(T > 0 && slot.size() == tokens.size() && pos.size() == tokens.size() && R > 0, "malformed infer call");
  const int V = static_cast<int>(cfg_.vocab_size), D = static_cast<int>(cfg_.hidden_size);
  const int nh = static_cast<int>(cfg_.num_attention_heads), nkv = static_cast<int>(cfg_.num_key_value_heads);
  const int hd = static_cast<int>(cfg_.head_dim);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
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
  reserve_infer(T, R);
  InferWork& I = *infer_;
  // A sequence's logits must not depend on what it is batched with (generation on N ranks = on 1 rank).
  struct Invariant {
    kernels::Ops& ops;
    explicit Invariant(kernels::Ops& o) : ops(o) { ops.set_batch_invariant(true); }
    ~Invariant() { ops.set_batch_invariant(false); }
  } invariant(ops_);
  ops_.upload(I.ids, tokens.data(), tokens.size() * 4);
  ops_.upload(I.slot, slot.data(), slot.size() * 4);
  ops_.upload(I.pos, pos.data(), pos.size() * 4);
  ops_.upload(I.rows, out_rows.data(), out_rows.size() * 4);
  const bool lora = use_lora && lora_ != nullptr;
  const kernels::KvPages& pages = cache.pages();

  // The forward from the ids to the logits. Decode steps (every row an output row) are recorded once per shape and
  // buffer set and replayed (a CUDA graph on the CUDA backend): every value that changes between steps (ids, slots,
  // positions, output rows, the block table) is read from device memory.
  const auto forward = [&] {
  ops_.embedding_forward(I.x, I.ids, embed_, T, V, D);
  // The residual stream stays in I.x (in place); the norms' rstd go to one scratch buffer.
  const BlockIO io{I.x, I.x, I.x, I.h, I.q, I.k, I.v, I.q_pre, I.k_pre, I.attn, I.h, I.gate, I.up, I.act,
                   I.tmp, I.rstd, I.rstd, I.rstd, I.rstd, I.pos};
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    const LayerW& Lw = layers_[l];
    block_forward(
        l, io, T,
        [&](Module m, void* y, const void* x) {
          const int mi = static_cast<int>(m);
          ops_.linear_forward(y, x, Lw.W[mi], Lw.bias[mi], T, module_in(cfg_, m), module_out(cfg_, m));
          if (lora) lora_add(l, m, y, x, T, I.xa);
        },
        [&] {
          ops_.kv_store(cache.k(l), cache.v(l), I.k, I.v, I.slot, I.pos, T, pages, nkv, hd);
          ops_.attention_cached(I.attn, I.q, cache.k(l), cache.v(l), I.slot, I.pos, T, pages, nh, nkv, hd);
        });
  }
  ops_.gather_rows(I.hsel, I.x, I.rows, R, D);
  ops_.rmsnorm_forward(I.hsel, I.rstd, I.hsel, final_norm_, R, D, eps);
  ops_.lm_head_logits(I.logits, I.hsel, head_, R, D, V, 1.0f);
  };
  if (T == R && T <= kMaxRecordedRows) {
    // The key: everything the recorded launches take by value (sizes, pointers): this model's buffers, the
    // cache's pools and block table, LoRA on or off.
    std::uint64_t key = 1469598103934665603ull;
    const auto mix = [&key](std::uint64_t v) {
      for (int b = 0; b < 8; ++b) key = (key ^ ((v >> (8 * b)) & 0xffu)) * 1099511628211ull;
    };
    const auto ptr = [&mix](const void* p) { mix(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p))); };
    mix(static_cast<std::uint64_t>(T));
    mix(lora ? 1 : 0);
    ptr(weights_);
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

std::vector<float> Transformer::input_embedding_grad() const {
  MGRL_CHECK(train_arena_->work != nullptr, "no backward yet");
  const Arena& a = *train_arena_;
  const std::size_t n = static_cast<std::size_t>(a.T) * cfg_.hidden_size;
  std::vector<float> out(n);
  ops_.download_storage_as_f32(out.data(), a.work->dx, n);
  return out;
}

std::vector<float> Transformer::logits() const {
  MGRL_CHECK(train_arena_->work != nullptr, "no forward yet");
  const Arena& a = *train_arena_;
  const int T = a.T, V = static_cast<int>(cfg_.vocab_size), D = static_cast<int>(cfg_.hidden_size);
  std::vector<float> out(static_cast<std::size_t>(T) * V);
  float* dev = static_cast<float*>(ops_.alloc(out.size() * sizeof(float)));
  ops_.lm_head_logits(dev, a.work->xf, head_, T, D, V, a.logit_scale);
  ops_.download(out.data(), dev, out.size() * sizeof(float));
  ops_.release(dev);
  return out;
}

std::vector<float> Transformer::base_tensor_host(const std::string& name) const {
  for (const auto& t : base_)
    if (t.name == name) {
      std::vector<float> out(static_cast<std::size_t>(io::shape_numel(t.shape)));
      ops_.download_storage_as_f32(out.data(), w(name), out.size());
      return out;
    }
  throw FatalError("no base tensor '" + name + "'");
}

}  // namespace mgrl::model
