// lora.cpp: LoRA slots, PEFT names and files, initialisation.
#include "model/lora.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/error.h"
#include "core/random.h"
#include "io/atomic_file.h"
#include "io/jsonl.h"
#include "io/safetensors.h"

namespace mgrl::model {

const char* module_name(Module m) {
  static const char* names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names[static_cast<int>(m)];
}

const char* module_path(Module m) {
  static const char* paths[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  return paths[static_cast<int>(m)];
}

bool parse_module(const std::string& name, Module* out) {
  for (int i = 0; i < kNumModules; ++i)
    if (name == module_name(static_cast<Module>(i))) {
      *out = static_cast<Module>(i);
      return true;
    }
  return false;
}

int module_in(const io::ModelConfig& c, Module m) {
  switch (m) {
    case Module::O: return static_cast<int>(c.q_dim());
    case Module::Down: return static_cast<int>(c.intermediate_size);
    default: return static_cast<int>(c.hidden_size);
  }
}

int module_out(const io::ModelConfig& c, Module m) {
  switch (m) {
    case Module::Q: return static_cast<int>(c.q_dim());
    case Module::K:
    case Module::V: return static_cast<int>(c.kv_dim());
    case Module::Gate:
    case Module::Up: return static_cast<int>(c.intermediate_size);
    default: return static_cast<int>(c.hidden_size);
  }
}

bool lora_groups_enabled() {
  static const bool on = env::switch_on("MGRL_LORA_GROUPS");
  return on;
}

float LoraConfig::scale() const {
  return static_cast<float>(use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / r);
}

namespace {

std::regex target_regex(const std::string& pattern, const std::function<void(const std::string&)>& fail) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail("key 'target_modules' = \"" + pattern + "\" is not a regular expression mgrl can read (" + e.what() + ")");
  }
  return {};
}

// How many of `layers` layers a target_modules expression selects module m in (PEFT: re.fullmatch against each
// module's whole name), in the module trees `trees` ("model.layers.", ...).
int layers_selected(const std::regex& re, Module m, int layers, const std::vector<std::string>& trees) {
  int hits = 0;
  for (int l = 0; l < layers; ++l) {
    bool hit = false;
    for (const auto& tree : trees) hit = hit || std::regex_match(tree + std::to_string(l) + "." + module_path(m), re);
    hits += hit ? 1 : 0;
  }
  return hits;
}

// The projections a target_modules expression selects in some layer of some module tree mgrl reads (a causal LM's
// model.layers.N, a vision-language checkpoint's model.language_model.layers.N or language_model.model.layers.N);
// which of them its model takes is decided with the model (LoraParams).
std::vector<std::string> targets_of_regex(const std::string& pattern, const std::function<void(const std::string&)>& fail) {
  const std::regex re = target_regex(pattern, fail);
  std::vector<std::string> out;
  for (int i = 0; i < kNumModules; ++i)
    if (layers_selected(re, static_cast<Module>(i), 128,
                        {"model.layers.", "model.language_model.layers.", "language_model.model.layers."}) > 0)
      out.push_back(module_name(static_cast<Module>(i)));
  if (out.empty())
    fail("key 'target_modules' = \"" + pattern + "\" selects none of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
         "down_proj of the decoder layers");
  return out;
}

}  // namespace

std::string peft_name_of_vlm(const std::string& name) {
  const std::string plain = "base_model.model.model.layers.";
  if (name.rfind(plain, 0) != 0) return name;
  return "base_model.model.model.language_model.layers." + name.substr(plain.size());
}

std::string peft_name_from_vlm(const std::string& name) {
  for (const char* p : {"base_model.model.model.language_model.layers.", "base_model.model.language_model.model.layers."}) {
    const std::string prefix = p;
    if (name.rfind(prefix, 0) == 0) return "base_model.model.model.layers." + name.substr(prefix.size());
  }
  return name;
}

std::string vlm_target_regex(const LoraConfig& cfg) {
  std::string alt;
  for (const auto& t : cfg.targets) alt += (alt.empty() ? "" : "|") + t;
  return "model\\.language_model\\.layers\\.\\d+\\.(self_attn|mlp)\\.(" + alt + ")";
}

LoraConfig read_peft_config(const std::string& path) {
  return peft_config_from_json(io::read_json_file(path, "the adapter configuration"), path);
}

std::string peft_config_json(const LoraConfig& c) {
  return nlohmann::json{{"peft_type", "LORA"},      {"r", c.r},
                        {"lora_alpha", c.alpha},    {"lora_dropout", c.dropout},
                        {"use_rslora", c.use_rslora}, {"target_modules", c.targets}}
      .dump();
}

LoraConfig peft_config_from_json(const nlohmann::json& j, const std::string& path) {
  auto fail = [&](const std::string& what) -> void { throw UserError(path + ": " + what); };
  if (!j.is_object()) fail("not a JSON object");
  const auto pt = j.find("peft_type");
  if (pt != j.end() && !pt->is_null() && (!pt->is_string() || pt->get<std::string>() != "LORA"))
    fail("peft_type must be LORA");
  LoraConfig c;
  const auto number = [&](const char* key, bool required, double def) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) fail(std::string("missing required key '") + key + "'");
      return def;
    }
    if (!it->is_number()) fail(std::string("key '") + key + "' must be a number, not " + it->dump());
    return it->get<double>();
  };
  const double r = number("r", true, 0);
  if (r != std::floor(r) || r < 1 || r > 65536) fail("key 'r' must be a positive integer (at most 65536)");
  c.r = static_cast<int>(r);
  c.alpha = number("lora_alpha", true, 0);
  c.dropout = number("lora_dropout", false, 0.0);
  const auto rs = j.find("use_rslora");
  if (rs != j.end() && !rs->is_null() && !rs->is_boolean()) fail("key 'use_rslora' must be true or false");
  c.use_rslora = rs != j.end() && rs->is_boolean() && rs->get<bool>();
  const auto t = j.find("target_modules");
  if (t == j.end() || t->is_null()) fail("missing required key 'target_modules'");
  c.targets.clear();  // LoraConfig's default list is not the adapter's
  if (t->is_string() && t->get<std::string>() == "all-linear") {  // PEFT: every linear layer but the output layer
    c.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  } else if (t->is_string()) {
    c.targets = targets_of_regex(t->get<std::string>(), fail);
    c.target_regex = t->get<std::string>();
    c.source = path;
  } else {
    if (!t->is_array()) fail("key 'target_modules' must be a list of module names or a regular expression");
    for (const auto& m : *t) {
      if (!m.is_string()) fail("key 'target_modules' must be a list of module names, not " + t->dump());
      c.targets.push_back(m.get<std::string>());
    }
  }
  if (c.targets.empty()) fail("key 'target_modules' is empty: the adapter adapts nothing");
  const auto flag = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>());
  };
  if (flag("use_dora")) fail("DoRA adapters (use_dora) are not supported");
  // PEFT's activated LoRA applies the adapter from its invocation tokens on only (accepted and applied everywhere
  // until 2026-11-29).
  if (const auto it = j.find("alora_invocation_tokens");
      it != j.end() && !it->is_null() && !(it->is_array() && it->empty()))
    fail("activated LoRA adapters (alora_invocation_tokens) are not supported");
  if (flag("fan_in_fan_out")) fail("fan_in_fan_out adapters are not supported");
  if (j.contains("bias") && j["bias"].is_string() && j["bias"] != "none") fail("adapter biases are not supported");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    if (j.contains(k) && j[k].is_object() && !j[k].empty()) fail(std::string(k) + " is not supported");
  if (j.contains("layers_to_transform") && !j["layers_to_transform"].is_null())
    fail("layers_to_transform is not supported");
  if (const auto ex = j.find("exclude_modules");
      ex != j.end() && !ex->is_null() && !(ex->is_array() && ex->empty()) && !(ex->is_string() && ex->get<std::string>().empty()))
    fail("exclude_modules is not supported");
  for (const auto& t : c.targets) {
    Module m;
    if (!parse_module(t, &m)) fail("target module '" + t + "' is not a linear layer of a Llama/Qwen block");
  }
  return c;
}

LoraParams::LoraParams(const io::ModelConfig& model, LoraConfig cfg, kernels::Ops& ops)
    : cfg_(std::move(cfg)), ops_(ops), vlm_(model.vlm()) {
  if (cfg_.r <= 0) throw UserError("lora.r must be positive");
  if (!cfg_.target_regex.empty()) {
    // The adapter's expression against this model's own module names, every layer: PEFT puts LoRA where it matches.
    const std::string& pattern = cfg_.target_regex;
    const auto fail = [&](const std::string& what) { throw UserError(cfg_.source + ": " + what); };
    const std::regex re = target_regex(pattern, fail);
    const std::string tree = vlm_ ? "model.language_model.layers." : "model.layers.";
    const int L = static_cast<int>(model.num_hidden_layers);
    std::vector<std::string> kept;
    for (int i = 0; i < kNumModules; ++i) {
      const Module m = static_cast<Module>(i);
      const int hits = layers_selected(re, m, L, {tree});
      if (hits == L) kept.push_back(module_name(m));
      else if (hits > 0)
        fail("key 'target_modules' = \"" + pattern + "\" selects " + module_name(m) + " in " + std::to_string(hits) +
             " of this model's " + std::to_string(L) + " layers only; adapters on some layers are not supported");
    }
    if (kept.empty())
      fail("key 'target_modules' = \"" + pattern + "\" selects none of this model's projections (" + tree +
           "N.self_attn.q_proj, ...)");
    cfg_.targets = kept;
  }
  std::vector<bool> on(kNumModules, false);
  for (const auto& t : cfg_.targets) {
    Module m;
    if (!parse_module(t, &m))
      throw UserError("lora.targets: '" + t + "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                      "down_proj");
    on[static_cast<int>(m)] = true;
  }
  for (int l = 0; l < model.num_hidden_layers; ++l)
    for (int i = 0; i < kNumModules; ++i) {
      if (!on[i]) continue;
      const Module m = static_cast<Module>(i);
      LoraSlot s{l, m, module_in(model, m), module_out(model, m), 0, 0};
      s.a_offset = numel_;
      numel_ += static_cast<std::size_t>(cfg_.r) * s.in;
      s.b_offset = numel_;
      numel_ += static_cast<std::size_t>(s.out) * cfg_.r;
      slots_.push_back(s);
    }
  params_ = static_cast<float*>(ops_.alloc(numel_ * sizeof(float)));
  grads_ = static_cast<float*>(ops_.alloc(numel_ * sizeof(float)));
}

LoraParams::~LoraParams() {
  ops_.release(params_);
  ops_.release(grads_);
}

const LoraSlot* LoraParams::find(int layer, Module m) const {
  for (const auto& s : slots_)
    if (s.layer == layer && s.module == m) return &s;
  return nullptr;
}

void LoraParams::zero_grads() { ops_.zero(grads_, numel_ * sizeof(float)); }

std::string LoraParams::peft_name(const LoraSlot& s, bool a) {
  return "base_model.model.model.layers." + std::to_string(s.layer) + "." + module_path(s.module) +
         (a ? ".lora_A.weight" : ".lora_B.weight");
}

void LoraParams::init(std::uint64_t seed) {
  std::vector<float> host(numel_, 0.0f);
  for (const auto& s : slots_) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(s.in));
    for (std::size_t i = 0; i < static_cast<std::size_t>(cfg_.r) * s.in; ++i) {
      const double u = random_uniform(seed, s.a_offset + i);  // uniform in [-bound, bound)
      host[s.a_offset + i] = static_cast<float>((2.0 * u - 1.0) * bound);
    }
  }
  from_host(host);
  zero_grads();
}

std::vector<float> LoraParams::to_host() const {
  std::vector<float> v(numel_);
  ops_.download(v.data(), params_, numel_ * sizeof(float));
  return v;
}

void LoraParams::from_host(const std::vector<float>& v) {
  MGRL_CHECK(v.size() == numel_, "LoRA parameter count mismatch");
  ops_.upload(params_, v.data(), numel_ * sizeof(float));
}

void LoraParams::load_peft(const std::string& dir) {
  const std::string path = dir + "/adapter_model.safetensors";
  io::SafetensorsFile f(path);
  std::vector<float> host(numel_);
  // A vision-language checkpoint's adapter names its tensors by the language model's module names (either tree).
  std::map<std::string, const io::TensorInfo*> by_name;
  for (const auto& t : f.tensors()) by_name[vlm_ ? peft_name_from_vlm(t.name) : t.name] = &t;
  for (const auto& s : slots_) {
    for (const bool a : {true, false}) {
      const std::string name = peft_name(s, a);
      const auto it = by_name.find(name);
      const io::TensorInfo& t = it != by_name.end() ? *it->second : f.get(vlm_ ? peft_name_of_vlm(name) : name);
      const io::Shape want = a ? io::Shape{cfg_.r, s.in} : io::Shape{s.out, cfg_.r};
      io::check_shape(t, want, path);
      io::copy_finite_to_f32(t, host.data() + (a ? s.a_offset : s.b_offset));
    }
  }
  // Tensors of the adapter that this model would not use are a sign of a mismatched adapter.
  for (const auto& t : f.tensors()) {
    bool used = false;
    const std::string name = vlm_ ? peft_name_from_vlm(t.name) : t.name;
    for (const auto& s : slots_) used = used || name == peft_name(s, true) || name == peft_name(s, false);
    if (!used) throw UserError(path + ": tensor '" + t.name + "' does not belong to a LoRA slot of this model");
  }
  from_host(host);
}

void write_peft_adapter(const std::string& dir, const LoraConfig& cfg, const std::string& base_model_path,
                        const std::vector<io::TensorToWrite>& tensors, bool vlm) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw UserError(dir + ": cannot create the directory");
  std::vector<io::TensorToWrite> named = tensors;
  if (vlm)
    for (auto& t : named) t.name = peft_name_of_vlm(t.name);
  io::write_safetensors(dir + "/adapter_model.safetensors", named, {{"format", "pt"}});
  const nlohmann::json j = {{"peft_type", "LORA"},
                            {"task_type", "CAUSAL_LM"},
                            {"base_model_name_or_path", base_model_path},
                            {"r", cfg.r},
                            {"lora_alpha", cfg.alpha},
                            {"lora_dropout", cfg.dropout},
                            {"use_rslora", cfg.use_rslora},
                            {"target_modules", vlm ? nlohmann::json(vlm_target_regex(cfg)) : nlohmann::json(cfg.targets)},
                            {"bias", "none"},
                            {"fan_in_fan_out", false},
                            {"inference_mode", true},
                            {"init_lora_weights", true},
                            {"use_dora", false},
                            {"layers_to_transform", nullptr},
                            {"modules_to_save", nullptr}};
  io::write_file_atomically(dir + "/adapter_config.json", j.dump(2) + "\n");  // whole or not at all
}

void LoraParams::save_peft(const std::string& dir, const std::string& base_model_path) const {
  const auto host = to_host();
  std::vector<io::TensorToWrite> tensors;
  for (const auto& s : slots_) {
    tensors.push_back({peft_name(s, true), DType::F32, {cfg_.r, s.in}, host.data() + s.a_offset});
    tensors.push_back({peft_name(s, false), DType::F32, {s.out, cfg_.r}, host.data() + s.b_offset});
  }
  write_peft_adapter(dir, cfg_, base_model_path, tensors, vlm_);
}

}  // namespace mgrl::model
