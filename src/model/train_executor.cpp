// train_executor.cpp: the activation arenas and the training forward/backward of the decoder with LoRA over
// kernels::Ops.
#include "model/train_executor.h"

#include <algorithm>

#include "core/env.h"
#include "core/error.h"
#include "core/random.h"
#include "model/block.h"

namespace mgrl::model {

namespace {
// MGRL_SCORED_ROWS=0: the LM head runs on every row whatever Batch::scored_from says (the pass of before).
bool scored_rows_enabled() {
  static const bool on = env::switch_on_logged(
      "MGRL_SCORED_ROWS", "MGRL_SCORED_ROWS=0: the LM head runs on every row, prompt rows included");
  return on;
}
}  // namespace

// What one layer keeps from its forward for its backward (storage dtype unless f32).
struct TrainExecutor::LayerActs {
  void *h1, *q, *k, *v, *q_pre, *k_pre, *attn, *x_mid, *h2, *gate, *up, *act;
  float *rstd1, *rstd_q, *rstd_k, *lse, *rstd2;
  void *o_raw, *m_raw;       // Gemma: the o / down projections' outputs before their norms (else null)
  float *rstd_pa, *rstd_pm;  // and those norms' rstd
  float* xa[kNumModules];
  void* xd[kNumModules];  // LoRA inputs after dropout (training with dropout only)
};

// Buffers of a pass shared by all layers: the residual stream, the LM head's, the uploaded batch, and the
// backward's gradients (d*: training arena only).
struct TrainExecutor::PassBuffers {
  std::vector<void*> xs;  // residual stream at the input of each layer, and after the last
  void *tmp, *xf, *recompute_out;
  float *rstd_f, *lse_head, *lp, *wrow, *lora_scratch;
  // the LM head's per-row entropy, top-1 hit, mean logit and log sum p^2 [4T] (set_token_stats, set_score_stats)
  float* stats;
  std::int32_t *ids, *targets, *pos, *cu_seqlens;
  std::uint64_t* row_keys;  // LoRA dropout, NEFTune: each token's key (Batch::seq_keys and its position; training arena)
  float* row_scale;         // NEFTune: each token's noise magnitude (training arena only)
  float* went;              // the entropy term's weights by LM-head row (backward with entropy_weights; training arena)
  std::int32_t* sel;  // the LM head's rows when it runs on the scored rows only (Batch::scored_from)
  void* head_scratch;
  void *dx, *dh, *dq, *dk, *dv, *dq2, *dk2, *dattn, *dgate, *dup, *dact, *dxf, *dlora;
  void* dpost;  // Gemma: the gradient of a post-norm's input (else null)
  std::vector<std::int32_t> host_ids, host_offsets;  // of the last forward
  std::vector<std::uint64_t> host_keys;              // its row keys (kept: uploads are async)
  std::vector<float> host_scale;                     // its NEFTune magnitudes (kept likewise)
  std::vector<std::int32_t> host_sel;                // its LM head's rows (compact passes)
  std::vector<float> host_wrow;                      // its loss weights by LM-head row (kept: uploads are async)
  std::vector<float> host_went;                      // its entropy weights likewise
  std::vector<float> host_wgrad;                     // forward_with_loss: those times the gradient scale
};

// The activations of one kind of pass: training forwards (kept for the backward) and no-grad scoring passes
// (score()) each have their own, so a scoring pass never overwrites what a pending backward needs.
struct TrainExecutor::Arena {
  bool grads = true;  // allocates the backward's buffers and one activation set per layer
  int cap_T = 0;
  std::vector<void*> allocations;
  std::vector<std::unique_ptr<LayerActs>> acts;
  std::unique_ptr<PassBuffers> work;
  // The last forward through this arena.
  int B = 0, T = 0, max_len = 0;
  int R = 0;             // the LM head's rows: T, or the scored rows (W.sel) when compact
  bool compact = false;  // the LM head ran on the scored rows only: its per-row buffers hold R rows
  bool train = false, lora = false;
  bool weights_ready = false;  // add_loss uploaded this forward's loss weights
  bool head_done = false;      // forward_with_loss: the LM head's backward ran in the forward (dxf holds its dh)
  bool stats_done = false;     // the LM head's pass wrote the rows' entropy and top-1 stats (W.stats)
  std::uint64_t seed = 0;
  float logit_scale = 1.0f;
};

// Everything an arena's size depends on.
struct TrainExecutor::ArenaSpec {
  const io::ModelConfig* cfg;
  bool recompute, grads;
  std::size_t storage_size, head_scratch_bytes;
  std::size_t r;  // LoRA rank, 0 without an adapter
  bool dropout;
  bool lora_on[kNumModules];
};

namespace {
// The dropout stream of one adapter in one step.
std::uint64_t mix_seed(std::uint64_t seed, int layer, int module) {
  return random_bits(seed, static_cast<std::uint64_t>(layer * kNumModules + module));
}
}  // namespace

TrainExecutor::TrainExecutor(ModelDef& def)
    : def_(def), cfg_(def.config()), ops_(def.ops()), opts_(def.options()), train_arena_(std::make_unique<Arena>()),
      score_arena_(std::make_unique<Arena>()), cur_(train_arena_.get()) {
  score_arena_->grads = false;
}

TrainExecutor::~TrainExecutor() {
  for (Arena* a : {train_arena_.get(), score_arena_.get()})
    for (void* p : a->allocations) ops_.release(p);
}

void TrainExecutor::release(Arena& a) {
  for (void* p : a.allocations) ops_.release(p);
  a.allocations.clear();
  a.acts.clear();
  a.work.reset();
  a.cap_T = 0;
}

void TrainExecutor::reset() {
  for (Arena* a : {train_arena_.get(), score_arena_.get()}) release(*a);
}

void TrainExecutor::plan(int max_tokens, bool scoring) {
  cur_ = train_arena_.get();
  reserve(max_tokens, 1);
  if (scoring) plan_scoring(max_tokens);
}

void TrainExecutor::plan_scoring(int max_tokens) {
  struct Restore {
    TrainExecutor* t;
    ~Restore() { t->cur_ = t->train_arena_.get(); }
  } restore{this};
  cur_ = score_arena_.get();
  reserve(max_tokens, 1);
}

TrainExecutor::ArenaSpec TrainExecutor::spec(bool grads) const {
  const LoraParams* lora = def_.lora();
  ArenaSpec s{&cfg_, opts_.recompute, grads, ops_.storage_size(),
              ops_.lm_head_scratch_bytes(static_cast<int>(cfg_.vocab_size)),
              lora ? static_cast<std::size_t>(lora->config().r) : 0, lora && lora->config().dropout > 0, {}};
  for (int m = 0; m < kNumModules; ++m) s.lora_on[m] = lora && lora->find(0, static_cast<Module>(m)) != nullptr;
  return s;
}

std::size_t TrainExecutor::activation_bytes(int T) const {
  Arena probe;  // a training arena that nothing is allocated for
  std::size_t bytes = 0;
  layout(spec(true), std::max(T, 1), probe, [&bytes](std::size_t n) -> void* {
    bytes += n;
    return nullptr;
  });
  return bytes;
}

std::size_t TrainExecutor::activation_bytes(const io::ModelConfig& cfg, const ModelOptions& opts,
                                            const LoraConfig* lora, DType storage, std::size_t head_scratch_bytes,
                                            int T, int B, bool grads) {
  ArenaSpec s{&cfg, opts.recompute, grads, dtype_size(storage), head_scratch_bytes,
              lora ? static_cast<std::size_t>(lora->r) : 0, lora && lora->dropout > 0, {}};
  if (lora)
    for (const auto& t : lora->targets) {
      Module m;
      if (parse_module(t, &m)) s.lora_on[static_cast<int>(m)] = true;
    }
  Arena probe;
  std::size_t bytes = 0;
  layout(s, std::max(T, B), probe, [&bytes](std::size_t n) -> void* {
    bytes += n;
    return nullptr;
  });
  return bytes;
}

void TrainExecutor::reserve(int T, int B) {
  if (T <= cur_->cap_T && B <= cur_->cap_T) return;
  T = std::max(T, B);
  // All or nothing: an allocation that fails (OutOfMemory) leaves the arena empty, so that a smaller plan can follow.
  release(*cur_);
  try {
    Arena& arena = *cur_;
    layout(spec(arena.grads), T, arena, [this, &arena](std::size_t bytes) {
      void* p = ops_.alloc(bytes);
      arena.allocations.push_back(p);
      return p;
    });
    cur_->cap_T = T;
  } catch (...) {
    release(*cur_);
    throw;
  }
}

// The arena's buffers for up to T tokens, each from raw(bytes) (which may count instead of allocating).
void TrainExecutor::layout(const ArenaSpec& sp, int T, Arena& arena, const std::function<void*(std::size_t)>& raw) {
  const io::ModelConfig& cfg = *sp.cfg;
  const std::size_t S = sp.storage_size;
  const std::size_t t = static_cast<std::size_t>(T);
  const std::size_t D = cfg.hidden_size, Q = cfg.q_dim(), K = cfg.kv_dim(), I = cfg.intermediate_size;
  const std::size_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const std::size_t r = sp.r;
  const bool dropout = sp.dropout;
  auto st = [&](std::size_t n) { return raw(n * S); };  // storage-dtype buffer
  auto f32 = [&](std::size_t n) { return static_cast<float*>(raw(n * sizeof(float))); };
  auto i32 = [&](std::size_t n) { return static_cast<std::int32_t*>(raw(n * sizeof(std::int32_t))); };
  const bool grads = sp.grads;
  const int n_acts = sp.recompute || !grads ? 1 : static_cast<int>(cfg.num_hidden_layers);
  for (int i = 0; i < n_acts; ++i) {
    auto a = std::make_unique<LayerActs>();
    a->h1 = st(t * D);
    a->q = st(t * Q);
    a->k = st(t * K);
    a->v = st(t * K);
    a->q_pre = cfg.qk_norm ? st(t * Q) : nullptr;
    a->k_pre = cfg.qk_norm ? st(t * K) : nullptr;
    a->attn = st(t * Q);
    a->x_mid = st(t * D);
    a->h2 = st(t * D);
    a->gate = st(t * I);
    a->up = st(t * I);
    a->act = st(t * I);
    a->rstd1 = f32(t);
    a->rstd2 = f32(t);
    a->rstd_q = cfg.qk_norm ? f32(t * nh) : nullptr;
    a->rstd_k = cfg.qk_norm ? f32(t * nkv) : nullptr;
    a->lse = f32(t * nh);
    a->o_raw = cfg.gemma ? st(t * D) : nullptr;
    a->m_raw = cfg.gemma ? st(t * D) : nullptr;
    a->rstd_pa = cfg.gemma ? f32(t) : nullptr;
    a->rstd_pm = cfg.gemma ? f32(t) : nullptr;
    for (int m = 0; m < kNumModules; ++m) {
      const auto mod = static_cast<Module>(m);
      const bool on = sp.lora_on[m];
      a->xa[m] = on ? f32(t * r) : nullptr;
      a->xd[m] = on && dropout && grads ? st(t * static_cast<std::size_t>(module_in(cfg, mod))) : nullptr;
    }
    arena.acts.push_back(std::move(a));
  }
  arena.work = std::make_unique<PassBuffers>();
  PassBuffers& W = *arena.work;
  for (int l = 0; l <= cfg.num_hidden_layers; ++l) W.xs.push_back(st(t * D));
  W.tmp = st(t * D);
  W.xf = st(t * D);
  W.recompute_out = sp.recompute && grads ? st(t * D) : nullptr;
  W.rstd_f = f32(t);
  W.lse_head = f32(t);
  W.lp = f32(t);
  W.wrow = f32(t);
  // The backward's dxa of one adapter (T r), or what a group's op takes (the CPU backend's stacked operands).
  W.lora_scratch = r ? f32(std::max(t * r, kernels::lora_group_scratch_floats(T, static_cast<int>(D),
                                                                              static_cast<int>(r),
                                                                              kernels::kMaxLoraGroup)))
                     : nullptr;
  W.ids = i32(t);
  W.targets = i32(t);
  W.pos = i32(t);
  W.cu_seqlens = i32(t + 1);  // B <= T
  W.sel = i32(t);
  W.head_scratch = raw(sp.head_scratch_bytes);
  W.row_keys = nullptr;
  W.row_scale = nullptr;
  W.went = nullptr;
  W.stats = f32(4 * t);
  if (!grads) return;  // a scoring arena: no backward
  W.row_keys = static_cast<std::uint64_t*>(raw(t * sizeof(std::uint64_t)));  // LoRA dropout, NEFTune
  W.row_scale = f32(t);
  W.went = f32(t);
  W.dx = st(t * D);
  W.dh = st(t * D);
  W.dq = st(t * Q);
  W.dk = st(t * K);
  W.dv = st(t * K);
  W.dq2 = cfg.qk_norm ? st(t * Q) : nullptr;
  W.dk2 = cfg.qk_norm ? st(t * K) : nullptr;
  W.dattn = st(t * Q);
  W.dgate = st(t * I);
  W.dup = st(t * I);
  W.dact = st(t * I);
  W.dxf = st(t * D);
  W.dlora = dropout ? st(t * std::max({D, Q, I})) : nullptr;
  W.dpost = cfg.gemma ? st(t * D) : nullptr;
}

void TrainExecutor::linear_with_lora(int l, Module m, void* y, const void* x, const void* W, const void* bias, int T,
                                   LayerActs& a, bool use_lora, bool train, std::uint64_t seed) {
  const int in = module_in(cfg_, m), out = module_out(cfg_, m);
  ops_.linear_forward(y, x, W, bias, T, in, out);
  LoraParams* lora = def_.lora();
  const LoraSlot* s = use_lora && lora ? lora->find(l, m) : nullptr;
  if (!s) return;
  const kernels::PhaseScope phase(ops_, kernels::Phase::Lora);
  const int mi = static_cast<int>(m);
  const void* xin = x;
  const float p = static_cast<float>(lora->config().dropout);
  if (train && p > 0) {
    ops_.dropout(a.xd[mi], x, T, in, p, mix_seed(seed, l, mi), cur_->work->row_keys);
    xin = a.xd[mi];
  }
  lora_add(def_, l, m, y, xin, T, a.xa[mi]);
}

void TrainExecutor::linear_with_lora_backward(int l, Module m, void* dx, const void* dy, const void* x, const void* W,
                                            float* dW, float* dbias, int T, LayerActs& a, bool accumulate) {
  const int in = module_in(cfg_, m), out = module_out(cfg_, m);
  ops_.linear_backward(dx, dW, dbias, dy, x, W, T, in, out, accumulate);
  LoraParams* lora = def_.lora();
  const LoraSlot* s = cur_->lora && lora ? lora->find(l, m) : nullptr;
  if (!s) return;
  const kernels::PhaseScope phase(ops_, kernels::Phase::Lora);
  const int mi = static_cast<int>(m);
  const auto& c = lora->config();
  const float p = static_cast<float>(c.dropout);
  if (p > 0) {
    // The adapter saw dropout(x): its input gradient goes back through the same mask.
    const std::size_t n = static_cast<std::size_t>(T) * in;
    ops_.zero(cur_->work->dlora, n * ops_.storage_size());
    ops_.lora_backward(cur_->work->dlora, lora->dA(*s), lora->dB(*s), dy, a.xd[mi], a.xa[mi], lora->A(*s),
                       lora->B(*s), c.scale(), T, in, c.r, out, cur_->work->lora_scratch);
    ops_.dropout(cur_->work->dlora, cur_->work->dlora, T, in, p, mix_seed(cur_->seed, l, mi), cur_->work->row_keys);
    ops_.residual_forward(dx, cur_->work->dlora, static_cast<std::int64_t>(n));
  } else {
    ops_.lora_backward(dx, lora->dA(*s), lora->dB(*s), dy, x, a.xa[mi], lora->A(*s), lora->B(*s), c.scale(), T,
                       in, c.r, out, cur_->work->lora_scratch);
  }
}

bool TrainExecutor::grouped_lora(bool train) const {
  const LoraParams* lora = def_.lora();
  return lora_groups_enabled() && !(train && lora && lora->config().dropout > 0);
}

void TrainExecutor::linears_with_lora(int l, const LayerWeights& Lw, const Module* ms, void* const* ys, int n,
                                      const void* x, int T, LayerActs& a, bool use_lora) {
  if (use_lora && def_.lora() && linears_with_lora_fused(l, Lw, ms, ys, n, x, T, a)) return;
  for (int i = 0; i < n; ++i) {
    const int mi = static_cast<int>(ms[i]);
    ops_.linear_forward(ys[i], x, Lw.W[mi], Lw.bias[mi], T, module_in(cfg_, ms[i]), module_out(cfg_, ms[i]));
  }
  if (!use_lora || !def_.lora()) return;
  const kernels::PhaseScope phase(ops_, kernels::Phase::Lora);
  float* xa[kernels::kMaxLoraGroup] = {};
  for (int i = 0; i < n; ++i) xa[i] = a.xa[static_cast<int>(ms[i])];
  lora_add_group(def_, l, ms, ys, n, x, T, xa, cur_->work->lora_scratch);
}

bool TrainExecutor::linears_with_lora_fused(int l, const LayerWeights& Lw, const Module* ms, void* const* ys, int n,
                                            const void* x, int T, LayerActs& a) {
  const LoraParams& lora = *def_.lora();
  kernels::LoraMember g[kernels::kMaxLoraGroup];
  const LoraSlot* slot[kernels::kMaxLoraGroup];
  int idx[kernels::kMaxLoraGroup];
  if (n > kernels::kMaxLoraGroup || lora_members(lora, l, ms, n, g, slot, idx) != n) return false;  // all adapted
  kernels::Ops::LinearMember lm[kernels::kMaxLoraGroup];
  for (int j = 0; j < n; ++j) {
    const int mi = static_cast<int>(ms[idx[j]]);
    g[j].y = ys[idx[j]];
    g[j].xa = a.xa[mi];
    lm[j].y = ys[idx[j]];
    lm[j].W = Lw.W[mi];
    lm[j].bias = Lw.bias[mi];
    lm[j].out = module_out(cfg_, ms[idx[j]]);
  }
  return ops_.linear_lora_group_forward(lm, g, n, x, T, module_in(cfg_, ms[0]), lora.config().r);
}

void TrainExecutor::linears_with_lora_backward(int l, const LayerWeights& Lw, const LayerGrads& Lg, const Module* ms,
                                               const void* const* dys, int n, void* dx, const void* x, int T,
                                               LayerActs& a) {
  for (int i = 0; i < n; ++i) {
    const int mi = static_cast<int>(ms[i]);
    ops_.linear_backward(dx, Lg.W[mi], Lg.bias[mi], dys[i], x, Lw.W[mi], T, module_in(cfg_, ms[i]),
                         module_out(cfg_, ms[i]), i > 0);
  }
  LoraParams* lora = def_.lora();
  if (!cur_->lora || !lora) return;
  const kernels::PhaseScope phase(ops_, kernels::Phase::Lora);
  const LoraConfig& c = lora->config();
  kernels::LoraMember g[kernels::kMaxLoraGroup];
  const LoraSlot* slot[kernels::kMaxLoraGroup];
  int idx[kernels::kMaxLoraGroup];
  const int k = lora_members(*lora, l, ms, n, g, slot, idx);
  for (int j = 0; j < k; ++j) {
    g[j].dy = dys[idx[j]];
    g[j].xa = a.xa[static_cast<int>(ms[idx[j]])];
    g[j].dA = lora->dA(*slot[j]);
    g[j].dB = lora->dB(*slot[j]);
  }
  const int in = module_in(cfg_, ms[0]);
  if (k == 1)
    ops_.lora_backward(dx, g[0].dA, g[0].dB, g[0].dy, x, g[0].xa, g[0].A, g[0].B, g[0].scale, T, in, c.r, g[0].out,
                       cur_->work->lora_scratch);
  else if (k > 1)
    ops_.lora_group_backward(dx, g, k, x, T, in, c.r, cur_->work->lora_scratch);
}

void TrainExecutor::layer_forward(int l, const void* x_in, void* x_out, LayerActs& a, bool use_lora, bool train,
                                std::uint64_t seed) {
  const LayerWeights& Lw = def_.layer(l);
  PassBuffers& W = *cur_->work;
  const int T = cur_->T;
  const int nh = static_cast<int>(cfg_.num_attention_heads), nkv = static_cast<int>(cfg_.num_key_value_heads);
  const int hd = static_cast<int>(cfg_.head_dim);
  const BlockIO io{x_in,    a.x_mid,   x_out,   a.h1,  a.q,   a.k,    a.v,     a.q_pre,  a.k_pre,  a.attn,
                   a.h2,    a.gate,    a.up,    a.act, W.tmp, a.rstd1, a.rstd_q, a.rstd_k, a.rstd2, W.pos,
                   a.o_raw, a.m_raw,   a.rstd_pa, a.rstd_pm};
  block_forward(
      def_, l, io, T,
      [&](const Module* ms, void* const* ys, int n, const void* x) {
        if (n > 1 && grouped_lora(train)) return linears_with_lora(l, Lw, ms, ys, n, x, T, a, use_lora);
        for (int i = 0; i < n; ++i) {
          const int mi = static_cast<int>(ms[i]);
          linear_with_lora(l, ms[i], ys[i], x, Lw.W[mi], Lw.bias[mi], T, a, use_lora, train, seed);
        }
      },
      [&] {
        const kernels::PhaseScope phase(ops_, kernels::Phase::Attention);
        ops_.attention_forward(a.attn, a.lse, a.q, a.k, a.v, W.cu_seqlens, cur_->B, T, cur_->max_len, nh, nkv, hd,
                               def_.attention(l));
      });
}

void TrainExecutor::layer_backward(int l, LayerActs& a, void* dx) {
  const LayerWeights& Lw = def_.layer(l);
  const LayerGrads& Lg = def_.layer_grads(l);
  PassBuffers& W = *cur_->work;
  const int T = cur_->T;
  const int D = static_cast<int>(cfg_.hidden_size), I = static_cast<int>(cfg_.intermediate_size);
  const int nh = static_cast<int>(cfg_.num_attention_heads), nkv = static_cast<int>(cfg_.num_key_value_heads);
  const int hd = static_cast<int>(cfg_.head_dim);
  auto lin_back = [&](Module m, void* dxin, const void* dy, const void* x, bool accumulate) {
    const int mi = static_cast<int>(m);
    linear_with_lora_backward(l, m, dxin, dy, x, Lw.W[mi], Lg.W[mi], Lg.bias[mi], T, a, accumulate);
  };
  const bool unit = def_.unit_offset_norms(), post = cfg_.gemma;
  // MLP: out = x_mid + down(act(gate(h2), up(h2))), h2 = norm(x_mid); Gemma: + post_norm(down(...)).
  const void* dmlp = dx;
  if (post) {
    ops_.rmsnorm_backward(W.dpost, Lg.post_mlp_norm, dx, a.m_raw, Lw.post_mlp_norm, a.rstd_pm, T, D, false, unit);
    dmlp = W.dpost;
  }
  lin_back(Module::Down, W.dact, dmlp, a.act, false);
  if (def_.geglu())
    ops_.geglu_backward(W.dgate, W.dup, W.dact, a.gate, a.up, static_cast<std::int64_t>(T) * I);
  else
    ops_.swiglu_backward(W.dgate, W.dup, W.dact, a.gate, a.up, static_cast<std::int64_t>(T) * I);
  // The dropout masks are drawn in training: the backward always follows a training forward.
  const bool grouped = grouped_lora(true);
  if (grouped) {
    const Module ms[] = {Module::Gate, Module::Up};
    const void* const dys[] = {W.dgate, W.dup};
    linears_with_lora_backward(l, Lw, Lg, ms, dys, 2, W.dh, a.h2, T, a);
  } else {
    lin_back(Module::Gate, W.dh, W.dgate, a.h2, false);
    lin_back(Module::Up, W.dh, W.dup, a.h2, true);
  }
  ops_.rmsnorm_backward(dx, Lg.mlp_norm, W.dh, a.x_mid, Lw.mlp_norm, a.rstd2, T, D, true, unit);  // dx = d(x_mid)
  // Attention: x_mid = x_in + o(attention(rope(q), rope(k), v)) (Gemma: post_norm(o(...))), q/k/v from
  // h1 = norm(x_in)
  const void* dattn_out = dx;
  if (post) {
    ops_.rmsnorm_backward(W.dpost, Lg.post_attn_norm, dx, a.o_raw, Lw.post_attn_norm, a.rstd_pa, T, D, false, unit);
    dattn_out = W.dpost;
  }
  lin_back(Module::O, W.dattn, dattn_out, a.attn, false);
  ops_.phase_begin(kernels::Phase::Attention);
  ops_.attention_backward(W.dq, W.dk, W.dv, W.dattn, a.attn, a.q, a.k, a.v, a.lse, W.cu_seqlens, cur_->B, T,
                          cur_->max_len, nh, nkv, hd, def_.attention(l));
  ops_.phase_end(kernels::Phase::Attention);
  ops_.rope_backward(W.dq, W.pos, def_.inv_freq(l), T, nh, hd);
  ops_.rope_backward(W.dk, W.pos, def_.inv_freq(l), T, nkv, hd);
  void* dq = W.dq;
  void* dk = W.dk;
  if (cfg_.qk_norm) {
    ops_.rmsnorm_backward(W.dq2, Lg.q_norm, W.dq, a.q_pre, Lw.q_norm, a.rstd_q, T * nh, hd, false, unit);
    ops_.rmsnorm_backward(W.dk2, Lg.k_norm, W.dk, a.k_pre, Lw.k_norm, a.rstd_k, T * nkv, hd, false, unit);
    dq = W.dq2;
    dk = W.dk2;
  }
  if (grouped) {
    const Module ms[] = {Module::Q, Module::K, Module::V};
    const void* const dys[] = {dq, dk, W.dv};
    linears_with_lora_backward(l, Lw, Lg, ms, dys, 3, W.dh, a.h1, T, a);
  } else {
    lin_back(Module::Q, W.dh, dq, a.h1, false);
    lin_back(Module::K, W.dh, dk, a.h1, true);
    lin_back(Module::V, W.dh, W.dv, a.h1, true);
  }
  ops_.rmsnorm_backward(dx, Lg.attn_norm, W.dh, W.xs[l], Lw.attn_norm, a.rstd1, T, D, true, unit);  // dx = d(x_in)
}


void TrainExecutor::forward(const Batch& batch, float* logprobs, bool use_lora, bool train, std::uint64_t dropout_seed,
                          float logit_scale) {
  cur_ = train_arena_.get();
  forward_pass(batch, logprobs, use_lora, train, dropout_seed, logit_scale);
}

void TrainExecutor::forward_with_loss(const Batch& batch, const float* weights, double grad_scale, double* loss_acc,
                                      std::uint64_t dropout_seed, double* stats_acc) {
  MGRL_CHECK(weights && loss_acc, "forward_with_loss() needs the loss weights and the loss accumulator");
  cur_ = train_arena_.get();
  const FusedLoss fused{weights, grad_scale, loss_acc, stats_acc};
  forward_pass(batch, nullptr, true, true, dropout_seed, 1.0f, &fused);
}

void TrainExecutor::forward_with_divergence(const Batch& batch, const float* weights, double grad_scale,
                                            double* loss_acc, const Teacher& teacher, float beta,
                                            float inv_temperature, std::uint64_t dropout_seed, double* entropy_acc) {
  MGRL_CHECK(weights && loss_acc && teacher.rows && teacher.head,
             "forward_with_divergence() needs the loss weights, the loss accumulator and the teacher's rows and head");
  cur_ = train_arena_.get();
  FusedLoss fused{weights, grad_scale, loss_acc, entropy_acc};
  fused.teacher = &teacher;
  fused.beta = beta;
  forward_pass(batch, nullptr, true, true, dropout_seed, inv_temperature, &fused);
}

void TrainExecutor::score_divergence(const Batch& batch, const float* weights, double* loss_acc,
                                     const Teacher& teacher, float beta, float inv_temperature, double* entropy_acc) {
  MGRL_CHECK(weights && loss_acc && teacher.rows && teacher.head,
             "score_divergence() needs the weights, the accumulator and the teacher's rows and head");
  struct Restore {
    TrainExecutor* t;
    ~Restore() { t->cur_ = t->train_arena_.get(); }
  } restore{this};
  cur_ = score_arena_.get();
  FusedLoss fused{weights, 1.0, loss_acc, entropy_acc};
  fused.teacher = &teacher;
  fused.beta = beta;
  forward_pass(batch, nullptr, true, false, 0, inv_temperature, &fused);
}

const void* TrainExecutor::head_input(const Batch& batch, int* rows) {
  struct Restore {
    TrainExecutor* t;
    ~Restore() {
      t->cur_ = t->train_arena_.get();
      t->head_input_only_ = false;
    }
  } restore{this};
  cur_ = score_arena_.get();
  head_input_only_ = true;
  head_input_rows_ = nullptr;
  forward_pass(batch, nullptr, true, false, 0, 1.0f);
  MGRL_CHECK(head_input_rows_ != nullptr, "head_input(): the pass did not reach the LM head");
  *rows = cur_->R;
  return head_input_rows_;
}

void TrainExecutor::score(const Batch& batch, float* logprobs, bool use_lora, float logit_scale) {
  struct Restore {
    TrainExecutor* t;
    ~Restore() { t->cur_ = t->train_arena_.get(); }
  } restore{this};
  cur_ = score_arena_.get();
  forward_pass(batch, logprobs, use_lora, false, 0, logit_scale);
}

void TrainExecutor::forward_pass(const Batch& batch, float* logprobs, bool use_lora, bool train,
                               std::uint64_t dropout_seed, float logit_scale, const FusedLoss* fused) {
  MGRL_CHECK(!train || cur_->grads, "a training forward needs the training arena");
  MGRL_CHECK(!fused || train || fused->teacher, "the LM head's backward in the forward needs a training forward");
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
  cur_->lora = use_lora && def_.lora() != nullptr;
  cur_->seed = dropout_seed;
  cur_->logit_scale = logit_scale;
  PassBuffers& W = *cur_->work;

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
  // The LM head runs on the rows that predict a scored token only (Batch::scored_from): its targets compacted.
  select_scored_rows(batch);
  if (cur_->compact)  // in place: host_sel is increasing, so row host_sel[j] >= j is read before it is overwritten
    for (std::size_t j = 0; j < W.host_sel.size(); ++j) targets[j] = targets[static_cast<std::size_t>(W.host_sel[j])];
  ops_.upload(W.ids, W.host_ids.data(), static_cast<std::size_t>(T) * 4);
  ops_.upload(W.targets, targets.data(), static_cast<std::size_t>(T) * 4);
  ops_.upload(W.pos, pos.data(), static_cast<std::size_t>(T) * 4);
  ops_.upload(W.cu_seqlens, batch.offsets.data(), static_cast<std::size_t>(B + 1) * 4);
  const bool noise = train && embedding_noise_ > 0;
  if ((train && cur_->lora && def_.lora()->config().dropout > 0) || noise) {
    MGRL_CHECK(W.row_keys != nullptr, "LoRA dropout or NEFTune without the row keys");
    MGRL_CHECK(batch.seq_keys.empty() || batch.seq_keys.size() == static_cast<std::size_t>(B), "malformed seq_keys");
    W.host_keys.resize(static_cast<std::size_t>(T));
    for (int b = 0; b < B; ++b) {
      const std::uint64_t key = batch.seq_keys.empty() ? static_cast<std::uint64_t>(b) : batch.seq_keys[b];
      for (int t = 0; t < batch.length(b); ++t)
        W.host_keys[static_cast<std::size_t>(batch.offsets[b] + t)] = random_bits(key, static_cast<std::uint64_t>(t));
    }
    ops_.upload(W.row_keys, W.host_keys.data(), W.host_keys.size() * sizeof(std::uint64_t));
  }

  ops_.embedding_forward(W.xs[0], W.ids, def_.embed(), T, V, D, def_.embed_scale());
  if (noise) {
    // NEFTune (Jain et al. 2023; transformers' neftune hook): uniform noise of magnitude alpha / sqrt(L d) on the
    // embeddings (after Gemma's scaling, as the hook sees the embedding module's output), L the sequence's own
    // length; drawn per token from its row key, so the noise of an example is the same on any rank count.
    W.host_scale.resize(static_cast<std::size_t>(T));
    for (int b = 0; b < B; ++b) {
      const float mag = static_cast<float>(static_cast<double>(embedding_noise_) /
                                           std::sqrt(static_cast<double>(batch.length(b)) * static_cast<double>(D)));
      for (int t = 0; t < batch.length(b); ++t) W.host_scale[static_cast<std::size_t>(batch.offsets[b] + t)] = mag;
    }
    ops_.upload(W.row_scale, W.host_scale.data(), W.host_scale.size() * sizeof(float));
    ops_.add_uniform_noise(W.xs[0], T, D, W.row_scale, random_bits(dropout_seed, 0x6e656674756e65ull), W.row_keys);
  }
  for (int l = 0; l < cfg_.num_hidden_layers; ++l)
    layer_forward(l, W.xs[l], W.xs[l + 1], *cur_->acts[cur_->acts.size() == 1 ? 0 : l], use_lora, train,
                  dropout_seed);
  if (!train) def_.end_of_pass();  // no backward follows
  ops_.rmsnorm_forward(W.xf, W.rstd_f, W.xs[cfg_.num_hidden_layers], def_.final_norm(), T, D,
                       static_cast<float>(cfg_.rms_norm_eps), def_.unit_offset_norms());
  cur_->weights_ready = false;
  cur_->head_done = false;
  const int R = cur_->R;
  const std::size_t row_bytes = static_cast<std::size_t>(D) * ops_.storage_size();
  // The head's input: the final norm's output, or its scored rows gathered into tmp (free after the last layer).
  const void* hx = W.xf;
  float* stats = (train ? token_stats_ || (fused && fused->stats_acc) : score_stats_) ? W.stats : nullptr;
  if (cur_->compact) {
    ops_.gather_rows(W.tmp, W.xf, W.sel, R, D);
    hx = W.tmp;
  }
  if (head_input_only_) {  // head_input(): the rows the LM head would read
    head_input_rows_ = hx;
    cur_->stats_done = false;
    return;
  }
  if (fused) {
    // The backward's weights (scaled) into wrow for the head's pass, then the loss's (unscaled) for the loss: two
    // uploads into one buffer, ordered on the backend's queue, each from a host vector kept until the next forward.
    // The LM head: the log-likelihood (forward_with_loss), or the distillation's divergence per row into lp with the
    // student's entropy into stats (forward_with_divergence; score_divergence: no gradient, train false).
    const Teacher* t = fused->teacher;
    MGRL_CHECK(!t || t->R == R, "forward_with_divergence(): the teacher's rows (" + std::to_string(t ? t->R : 0) +
                                    ") are not this pass's (" + std::to_string(R) + "): another batch?");
    upload_loss_weights(fused->weights);
    const bool scaled = train && fused->grad_scale != 1.0;
    if (scaled) {
      W.host_wgrad.resize(W.host_wrow.size());
      // As SFT scales its weights for backward(): the f32 weight times the double scale, rounded to f32.
      for (std::size_t i = 0; i < W.host_wrow.size(); ++i)
        W.host_wgrad[i] = static_cast<float>(W.host_wrow[i] * fused->grad_scale);
      ops_.upload(W.wrow, W.host_wgrad.data(), W.host_wgrad.size() * sizeof(float));
    }
    // Compact: the scored rows' dh into W.dh (free until the backward), then scattered into a zeroed dxf.
    void* dh = train ? (cur_->compact ? W.dh : W.dxf) : nullptr;
    if (t)
      ops_.lm_head_divergence(W.lp, fused->stats_acc ? W.stats : nullptr, dh, train ? def_.head_grad() : nullptr,
                              W.wrow, hx, def_.head(), R, D, V, logit_scale, def_.final_softcap(), t->rows, t->head,
                              t->Dt, logit_scale, t->softcap, fused->beta);
    else
      ops_.lm_head_logprob_forward_backward(W.lp, W.lse_head, dh, def_.head_grad(), W.wrow, hx, def_.head(),
                                            W.targets, R, D, V, logit_scale, W.head_scratch, def_.final_softcap(),
                                            stats);
    if (train && cur_->compact) {
      ops_.zero(W.dxf, static_cast<std::size_t>(T) * row_bytes);
      ops_.scatter_rows(W.dxf, W.dh, W.sel, R, D);
    }
    if (scaled) ops_.upload(W.wrow, W.host_wrow.data(), W.host_wrow.size() * sizeof(float));
    // loss += -sum w logprob, or + sum w divergence
    ops_.weighted_sum_accumulate(fused->loss_acc, W.lp, W.wrow, static_cast<std::size_t>(R), t ? 1.0 : -1.0);
    if (fused->stats_acc && t)
      ops_.weighted_sum_accumulate(fused->stats_acc, W.stats, W.wrow, static_cast<std::size_t>(R), 1.0);
    else if (fused->stats_acc)
      add_stats(fused->stats_acc);
    cur_->weights_ready = train;
    cur_->head_done = train;
    if (t) {  // W.stats holds entropies alone, not token_stats()'s four rows
      cur_->stats_done = false;
      return;
    }
  } else {
    ops_.lm_head_logprob_forward(W.lp, W.lse_head, hx, def_.head(), W.targets, R, D, V, logit_scale,
                                 W.head_scratch, def_.final_softcap(), stats);
  }
  cur_->stats_done = stats != nullptr;
  if (!logprobs) return;

  // Row t predicts token t + 1 (compact: row j is row host_sel[j]; the positions not scored get 0).
  std::vector<float> lp(static_cast<std::size_t>(R));
  ops_.download(lp.data(), W.lp, lp.size() * sizeof(float));
  std::fill(logprobs, logprobs + T, 0.0f);
  if (cur_->compact) {
    for (int j = 0; j < R; ++j) logprobs[W.host_sel[static_cast<std::size_t>(j)] + 1] = lp[static_cast<std::size_t>(j)];
    return;
  }
  for (int b = 0; b < B; ++b)
    for (int i = batch.offsets[b]; i + 1 < batch.offsets[b + 1]; ++i) logprobs[i + 1] = lp[static_cast<std::size_t>(i)];
}

// Batch::scored_from: the LM head's rows are those that predict a token at a position >= scored_from[b] of their
// sequence (row t of a sequence predicts its token t + 1). When they are fewer than the rows with a target, the head
// runs on them alone (cur_->compact, W.sel); else, and with MGRL_SCORED_ROWS=0, on all T rows as before.
void TrainExecutor::select_scored_rows(const Batch& batch) {
  PassBuffers& W = *cur_->work;
  const int B = batch.B(), T = batch.T();
  cur_->R = T;
  cur_->compact = false;
  W.host_sel.clear();
  if (batch.scored_from.empty() || !scored_rows_enabled()) return;
  MGRL_CHECK(static_cast<int>(batch.scored_from.size()) == B, "Batch::scored_from needs one entry per sequence");
  for (int b = 0; b < B; ++b) {
    const int row0 = batch.offsets[b], len = batch.length(b);
    for (int t = std::max(batch.scored_from[static_cast<std::size_t>(b)], 1); t < len; ++t)
      W.host_sel.push_back(row0 + t - 1);
  }
  const int R = static_cast<int>(W.host_sel.size());
  if (R == 0 || R == T - B) return;  // nothing scored (the plain pass is as cheap), or every row with a target
  cur_->R = R;
  cur_->compact = true;
  ops_.upload(W.sel, W.host_sel.data(), W.host_sel.size() * sizeof(std::int32_t));
}

// The loss weights of the packed tokens as the LM head's rows use them: row i predicts token i + 1.
void TrainExecutor::head_rows(const float* per_token, std::vector<float>* rows) const {
  const PassBuffers& W = *cur_->work;
  rows->assign(static_cast<std::size_t>(cur_->R), 0.0f);
  if (cur_->compact) {
    // Row j is row host_sel[j]; a weight on a position that was not scored would be lost: refused.
    std::size_t j = 0;
    for (int b = 0; b < cur_->B; ++b)
      for (int i = W.host_offsets[b]; i + 1 < W.host_offsets[b + 1]; ++i) {
        if (j < W.host_sel.size() && W.host_sel[j] == i) {
          (*rows)[j++] = per_token[i + 1];
        } else {
          MGRL_CHECK(per_token[i + 1] == 0.0f, "a loss weight on a token before its sequence's Batch::scored_from");
        }
      }
  } else {
    for (int b = 0; b < cur_->B; ++b)
      for (int i = W.host_offsets[b]; i + 1 < W.host_offsets[b + 1]; ++i)
        (*rows)[static_cast<std::size_t>(i)] = per_token[i + 1];
  }
}

void TrainExecutor::upload_loss_weights(const float* weights) {
  PassBuffers& W = *cur_->work;
  head_rows(weights, &W.host_wrow);
  ops_.upload(W.wrow, W.host_wrow.data(), W.host_wrow.size() * sizeof(float));
  cur_->weights_ready = true;
}

void TrainExecutor::add_loss(const float* weights, double* loss_acc, double* stats_acc) {
  cur_ = train_arena_.get();
  MGRL_CHECK(cur_->work && cur_->train, "add_loss() needs a forward(train = true) first");
  MGRL_CHECK(!cur_->head_done, "add_loss() after forward_with_loss(), which added the loss itself");
  upload_loss_weights(weights);
  ops_.weighted_sum_accumulate(loss_acc, cur_->work->lp, cur_->work->wrow, static_cast<std::size_t>(cur_->R), -1.0);
  if (stats_acc) {
    MGRL_CHECK(cur_->stats_done, "add_loss(stats_acc) needs a training forward with set_token_stats(true)");
    add_stats(stats_acc);
  }
}

// stats_acc[0] += sum_i w_i entropy_i, stats_acc[1] += sum_i w_i top1_i over the LM head's rows (W.wrow: the loss
// weights by row, uploaded).
void TrainExecutor::add_stats(double* stats_acc) {
  PassBuffers& W = *cur_->work;
  const auto R = static_cast<std::size_t>(cur_->R);
  ops_.weighted_sum_accumulate(stats_acc, W.stats, W.wrow, R, 1.0);
  ops_.weighted_sum_accumulate(stats_acc + 1, W.stats + R, W.wrow, R, 1.0);
}

void TrainExecutor::backward(const float* weights, const std::function<void(int)>& layer_done, const float* dhidden,
                             const float* entropy_weights) {
  cur_ = train_arena_.get();
  MGRL_CHECK(cur_->work && cur_->train, "backward() needs a forward(train = true) first");
  MGRL_CHECK(cur_->lora || opts_.full_finetune, "backward() with nothing trainable");
  const kernels::PhaseScope phase(ops_, kernels::Phase::Backward);
  PassBuffers& W = *cur_->work;
  const int T = cur_->T;
  const int V = static_cast<int>(cfg_.vocab_size), D = static_cast<int>(cfg_.hidden_size);
  if (cur_->head_done) {
    MGRL_CHECK(!weights, "backward(weights) after forward_with_loss(), which took the weights itself");
    MGRL_CHECK(cur_->weights_ready, "a second backward() after forward_with_loss()");
  } else if (weights) {
    upload_loss_weights(weights);
  } else {
    MGRL_CHECK(cur_->weights_ready, "backward(nullptr) needs add_loss() after the forward");
  }
  // The entropy term: its weights by head row, beside the forward's per-row entropies (W.stats).
  const float* went = nullptr;
  if (entropy_weights) {
    MGRL_CHECK(!cur_->head_done, "an entropy term after forward_with_loss()");
    MGRL_CHECK(cur_->stats_done, "an entropy term needs the forward's entropies (set_token_stats(true))");
    head_rows(entropy_weights, &W.host_went);
    ops_.upload(W.went, W.host_went.data(), W.host_went.size() * sizeof(float));
    went = W.went;
  }

  // After forward_with_loss the LM head's part is done: W.dxf already holds its gradient (and the head's own
  // gradient is accumulated), so the backward starts at the final norm.
  // Compact (Batch::scored_from): the scored rows gathered again into tmp, their dh into W.dh (free until the
  // dhidden below and the last layer's backward), scattered into a zeroed dxf.
  if (!cur_->head_done && cur_->compact) {
    const int R = cur_->R;
    ops_.gather_rows(W.tmp, W.xf, W.sel, R, D);
    ops_.lm_head_logprob_backward(W.dh, def_.head_grad(), W.wrow, W.tmp, def_.head(), W.targets, W.lse_head, R, D,
                                  V, cur_->logit_scale, W.head_scratch, def_.final_softcap(), went,
                                  went ? W.stats : nullptr);
    ops_.zero(W.dxf, static_cast<std::size_t>(T) * static_cast<std::size_t>(D) * ops_.storage_size());
    ops_.scatter_rows(W.dxf, W.dh, W.sel, R, D);
  } else if (!cur_->head_done) {
    ops_.lm_head_logprob_backward(W.dxf, def_.head_grad(), W.wrow, W.xf, def_.head(), W.targets, W.lse_head, T, D,
                                  V, cur_->logit_scale, W.head_scratch, def_.final_softcap(), went,
                                  went ? W.stats : nullptr);
  }
  if (dhidden) {  // W.dh is free until the last layer's backward: it carries dhidden in the storage dtype
    ops_.upload_f32_as_storage(W.dh, dhidden, static_cast<std::size_t>(T) * static_cast<std::size_t>(D));
    ops_.residual_forward(W.dxf, W.dh, static_cast<std::int64_t>(T) * D);
  }
  ops_.rmsnorm_backward(W.dx, def_.final_norm_grad(), W.dxf, W.xs[cfg_.num_hidden_layers], def_.final_norm(),
                        W.rstd_f, T, D, false, def_.unit_offset_norms());
  for (int l = cfg_.num_hidden_layers - 1; l >= 0; --l) {
    LayerActs& a = *cur_->acts[opts_.recompute ? 0 : l];
    if (opts_.recompute) layer_forward(l, W.xs[l], W.recompute_out, a, cur_->lora, true, cur_->seed);
    layer_backward(l, a, W.dx);
    if (layer_done) layer_done(l);
  }
  if (float* dembed = def_.embed_grad()) ops_.embedding_backward(dembed, W.dx, W.ids, T, V, D, def_.embed_scale());
  if (cur_->head_done) cur_->weights_ready = false;  // W.dxf is spent (dhidden was added to it)
  def_.end_of_pass();
}


std::vector<float> TrainExecutor::input_embedding_grad() const {
  MGRL_CHECK(train_arena_->work != nullptr, "no backward yet");
  const Arena& a = *train_arena_;
  const std::size_t n = static_cast<std::size_t>(a.T) * cfg_.hidden_size;
  std::vector<float> out(n);
  ops_.download_storage_as_f32(out.data(), a.work->dx, n);
  return out;
}

TokenStats TrainExecutor::token_stats(bool scoring) const {
  const Arena* arena = scoring ? score_arena_.get() : train_arena_.get();
  MGRL_CHECK(arena && arena->work != nullptr && arena->stats_done,
             "token_stats() needs a forward with set_token_stats(true) (a score() pass: set_score_stats(true))");
  const Arena& a = *arena;
  const PassBuffers& W = *a.work;
  const auto R = static_cast<std::size_t>(a.R);
  std::vector<float> rows(4 * R);
  ops_.download(rows.data(), W.stats, rows.size() * sizeof(float));
  // Row t predicts token t + 1 (compact: row j is row host_sel[j]), as the log-probs.
  TokenStats out;
  for (auto* v : {&out.entropy, &out.top1, &out.mean_logit, &out.log_sum_sq}) v->assign(static_cast<std::size_t>(a.T), 0.0f);
  const auto put = [&](std::size_t row, std::size_t pos) {
    out.entropy[pos] = rows[row];
    out.top1[pos] = rows[R + row];
    out.mean_logit[pos] = rows[2 * R + row];
    out.log_sum_sq[pos] = rows[3 * R + row];
  };
  if (a.compact) {
    for (std::size_t j = 0; j < R; ++j) put(j, static_cast<std::size_t>(W.host_sel[j]) + 1);
    return out;
  }
  for (std::size_t b = 0; b + 1 < W.host_offsets.size(); ++b)
    for (int i = W.host_offsets[b]; i + 1 < W.host_offsets[b + 1]; ++i)
      put(static_cast<std::size_t>(i), static_cast<std::size_t>(i) + 1);
  return out;
}

std::vector<float> TrainExecutor::final_hidden() const {
  MGRL_CHECK(train_arena_ && train_arena_->work != nullptr, "final_hidden() needs a forward() first");
  const Arena& a = *train_arena_;
  std::vector<float> out(static_cast<std::size_t>(a.T) * cfg_.hidden_size);
  ops_.download_storage_as_f32(out.data(), a.work->xf, out.size());
  return out;
}

std::vector<float> TrainExecutor::logits() const {
  MGRL_CHECK(train_arena_->work != nullptr, "no forward yet");
  const Arena& a = *train_arena_;
  const int T = a.T, V = static_cast<int>(cfg_.vocab_size), D = static_cast<int>(cfg_.hidden_size);
  std::vector<float> out(static_cast<std::size_t>(T) * V);
  float* dev = static_cast<float*>(ops_.alloc(out.size() * sizeof(float)));
  ops_.lm_head_logits(dev, a.work->xf, def_.head(), T, D, V, a.logit_scale, def_.final_softcap());
  ops_.download(out.data(), dev, out.size() * sizeof(float));
  ops_.release(dev);
  return out;
}

}  // namespace mgrl::model
