// trainable.cpp: the flat trainable buffer of a model (LoRA or full fine-tuning).
#include "train/trainable.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "io/checksum.h"

namespace mgrl::train {

bool decays(const std::string& name) {
  const auto ends = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends(name, ".bias") || name == "bias") return false;
  const std::string module = ends(name, ".weight") ? name.substr(0, name.size() - 7) : name;
  std::string lower = module;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return !(ends(lower, "norm") || lower.find("layernorm") != std::string::npos ||
           lower.find("rmsnorm") != std::string::npos);
}

Trainable trainable_of(model::Transformer& m, bool full_finetune) {
  Trainable t;
  if (full_finetune) {
    t.params = m.trainable_base();
    t.grads = m.base_grads();
    if (m.has_master_weights()) t.changed = [&m] { m.master_weights_changed(); };
    MGRL_CHECK(t.grads != nullptr, "the model was built without full_finetune");
    t.n = m.base_numel();
    for (const auto& b : m.base_tensors()) t.tensors.push_back({b.name, b.shape, b.offset});
    return t;
  }
  model::LoraParams* lora = m.lora();
  if (!lora) throw UserError("nothing to train: no LoRA adapter and train.full_finetune = false");
  t.params = lora->params();
  t.grads = lora->grads();
  t.n = lora->numel();
  t.base = m.definition().base_fingerprint();
  for (const auto& s : lora->slots()) {
    t.tensors.push_back({model::LoraParams::peft_name(s, true), {lora->config().r, s.in}, s.a_offset});
    t.tensors.push_back({model::LoraParams::peft_name(s, false), {s.out, lora->config().r}, s.b_offset});
  }
  return t;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

std::string activations_beyond_memory(model::Transformer& m, long long tokens) {
  const std::size_t avail = m.ops().available_memory();
  if (avail == 0 || tokens <= 0 || tokens >= (1LL << 31)) return "";
  const std::size_t need = m.activation_bytes(static_cast<int>(tokens));
  if (need <= avail) return "";
  return gib(static_cast<double>(need)) + " of activations, more than the " + gib(static_cast<double>(avail)) +
         " this rank has available";
}

void refuse_activations_beyond_memory(const dist::MpiEnv& env, model::Transformer& m, long long tokens,
                                      const std::string& what, const std::string& advice) {
  env.agree([&] {
    const std::string beyond = activations_beyond_memory(m, tokens);
    if (beyond.empty()) return;
    const bool rc = m.options().recompute;
    throw UserError(what + ", needs up to " + beyond + (rc ? "" : " (model.recompute = false)") + ": " + advice +
                    (rc ? std::string() : ", or set model.recompute = true"));
  });
}

std::string reference_identity(kernels::Ops& ops, model::Transformer& m, const Trainable& tr, bool initial_is_base) {
  if (tr.base.empty()) return "model\n" + m.definition().base_fingerprint();  // full fine-tuning
  if (initial_is_base) return "base";
  std::vector<float> host(tr.n);
  ops.download(host.data(), tr.params, tr.n * sizeof(float));
  // The adapter's scale (lora_alpha / r, or / sqrt(r) with rsLoRA, from its adapter_config.json) weighs its tensors
  char scale[64];
  std::snprintf(scale, sizeof scale, "scale %.9g\n", static_cast<double>(m.lora()->config().scale()));
  std::string id = std::string("adapter\n") + scale;
  for (const auto& t : tr.tensors) {
    std::size_t count = 1;
    for (const auto d : t.shape) count *= static_cast<std::size_t>(d);
    id += t.name + " " + io::checksum_hex(host.data() + t.offset, count * sizeof(float)) + "\n";
  }
  return id;
}

FrozenCopy::FrozenCopy(kernels::Ops& ops, const Trainable& tr) : ops_(ops), tr_(tr) {
  initial_ = static_cast<float*>(ops_.alloc(tr_.n * sizeof(float)));
  swap_ = static_cast<float*>(ops_.alloc(tr_.n * sizeof(float)));
  ops_.copy(initial_, tr_.params, tr_.n * sizeof(float));
}

FrozenCopy::~FrozenCopy() {
  ops_.release(initial_);
  ops_.release(swap_);
}

void FrozenCopy::with_frozen(const std::function<void()>& pass) {
  ops_.copy(swap_, tr_.params, tr_.n * sizeof(float));
  ops_.copy(tr_.params, initial_, tr_.n * sizeof(float));
  tr_.params_changed();
  pass();
  ops_.copy(tr_.params, swap_, tr_.n * sizeof(float));
  tr_.params_changed();
}

void FrozenCopy::mix_in(double alpha) {
  const float keep = static_cast<float>(1.0 - alpha), take = static_cast<float>(alpha);
  constexpr std::size_t kChunk = std::size_t{1} << 22;  // floats a pass: 16 MiB of each buffer on the host
  std::vector<float> ref(std::min(kChunk, tr_.n)), cur(ref.size());
  for (std::size_t at = 0; at < tr_.n; at += kChunk) {
    const std::size_t n = std::min(kChunk, tr_.n - at);
    ops_.download(ref.data(), initial_ + at, n * sizeof(float));
    ops_.download(cur.data(), tr_.params + at, n * sizeof(float));
    for (std::size_t i = 0; i < n; ++i) ref[i] = std::fma(take, cur[i], ref[i] * keep);
    ops_.upload(initial_ + at, ref.data(), n * sizeof(float));
  }
}

std::vector<float> FrozenCopy::values() const {
  std::vector<float> v(tr_.n);
  ops_.download(v.data(), initial_, tr_.n * sizeof(float));
  return v;
}

void FrozenCopy::set_values(const std::vector<float>& v) {
  MGRL_CHECK(v.size() == tr_.n, "FrozenCopy::set_values: " + std::to_string(v.size()) + " values for " +
                                    std::to_string(tr_.n));
  ops_.upload(initial_, v.data(), tr_.n * sizeof(float));
}

}  // namespace mgrl::train
