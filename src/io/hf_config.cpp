// hf_config.cpp: reading config.json of Llama/Qwen2/Qwen3/Gemma2/Gemma3/Mistral models, and the list of tensors a model needs.
#include "io/hf_config.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/jsonl.h"
#include "io/safetensors.h"

namespace mgrl::io {

using json = nlohmann::json;

const char* architecture_name(Architecture a) {
  switch (a) {
    case Architecture::Llama: return "LlamaForCausalLM";
    case Architecture::Qwen2: return "Qwen2ForCausalLM";
    case Architecture::Qwen3: return "Qwen3ForCausalLM";
    case Architecture::Gemma2: return "Gemma2ForCausalLM";
    case Architecture::Gemma3: return "Gemma3ForCausalLM";
    case Architecture::Mistral: return "MistralForCausalLM";
  }
  return "?";
}

namespace {

constexpr const char* kSupported =
    "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, MistralForCausalLM, "
    "Gemma3ForConditionalGeneration (its language model)";

// What a JSON value is, for messages: "a string (\"x\")", "null", ...
std::string describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  if (v.is_null()) return "null";
  if (v.is_string()) return "a string (" + text + ")";
  if (v.is_boolean()) return "a boolean (" + text + ")";
  if (v.is_number()) return "a number (" + text + ")";
  if (v.is_array()) return "a list";
  return "an object";
}

// Typed access to the keys of one JSON object, with messages naming the file and the key.
class Keys {
 public:
  Keys(const json& obj, std::string file, std::string prefix = "")
      : obj_(obj), file_(std::move(file)), prefix_(std::move(prefix)) {}

  // The value of key, or nullptr when absent or null.
  const json* find(const std::string& key) const {
    const auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw UserError(file_ + ": key '" + prefix_ + key + "' " + what);
  }
  const json& require(const std::string& key) const {
    const json* v = find(key);
    if (!v) throw UserError(file_ + ": missing required key '" + prefix_ + key + "'");
    return *v;
  }

  std::int64_t int_of(const std::string& key, const json& v) const {
    if (!v.is_number_integer()) fail(key, "must be an integer, not " + describe(v));
    return v.get<std::int64_t>();
  }
  std::int64_t get_int(const std::string& key) const { return int_of(key, require(key)); }
  std::int64_t get_int(const std::string& key, std::int64_t def) const {
    const json* v = find(key);
    return v ? int_of(key, *v) : def;
  }
  std::int64_t get_positive(const std::string& key) const {
    const std::int64_t v = get_int(key);
    if (v <= 0) fail(key, "must be positive (got " + std::to_string(v) + ")");
    return v;
  }
  double num_of(const std::string& key, const json& v) const {
    if (!v.is_number()) fail(key, "must be a number, not " + describe(v));
    return v.get<double>();
  }
  double get_number(const std::string& key) const { return num_of(key, require(key)); }
  double get_number(const std::string& key, double def) const {
    const json* v = find(key);
    return v ? num_of(key, *v) : def;
  }
  bool get_bool(const std::string& key, bool def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) fail(key, "must be true or false, not " + describe(*v));
    return v->get<bool>();
  }
  std::string get_string(const std::string& key, const std::string& def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_string()) fail(key, "must be a string, not " + describe(*v));
    return v->get<std::string>();
  }

 private:
  const json& obj_;
  std::string file_;
  std::string prefix_;
};

Architecture parse_architecture(const json& j, const Keys& k, const std::string& file) {
  if (const json* a = k.find("architectures")) {
    if (!a->is_array() || a->empty()) k.fail("architectures", "must be a non-empty list of strings");
    std::string names;
    for (const json& n : *a) {
      if (!n.is_string()) k.fail("architectures", "must be a non-empty list of strings");
      const std::string s = n.get<std::string>();
      if (s == "LlamaForCausalLM") return Architecture::Llama;
      if (s == "Qwen2ForCausalLM") return Architecture::Qwen2;
      if (s == "Qwen3ForCausalLM") return Architecture::Qwen3;
      if (s == "Gemma2ForCausalLM") return Architecture::Gemma2;
      if (s == "Gemma3ForCausalLM") return Architecture::Gemma3;
      if (s == "MistralForCausalLM") return Architecture::Mistral;
      names += (names.empty() ? "'" : ", '") + s + "'";
    }
    throw UserError(file + ": unsupported architecture " + names + " (supported: " + kSupported + ")");
  }
  // No "architectures": fall back on model_type, as transformers' AutoConfig does.
  if (j.contains("model_type")) {
    const std::string t = k.get_string("model_type", "");
    if (t == "llama") return Architecture::Llama;
    if (t == "qwen2") return Architecture::Qwen2;
    if (t == "qwen3") return Architecture::Qwen3;
    if (t == "gemma2") return Architecture::Gemma2;
    if (t == "gemma3_text") return Architecture::Gemma3;
    if (t == "mistral") return Architecture::Mistral;
    throw UserError(file + ": unsupported model_type '" + t + "' and no \"architectures\" (supported: " +
                    kSupported + ")");
  }
  throw UserError(file + ": missing required key 'architectures' (one of " + kSupported + ")");
}

// rope_scaling (4.x) or rope_parameters (5.x): none for types "default" and "dynamic", the llama3, linear or yarn
// parameters, or an error. max_pos: the config's max_position_embeddings; top_original: its top-level
// original_max_position_embeddings (0: none), which transformers puts before the dict's for llama3 and yarn.
std::optional<RopeScaling> parse_rope(const json& obj, const std::string& key, const std::string& file,
                                      std::int64_t max_pos, std::int64_t top_original) {
  if (!obj.is_object()) {
    throw UserError(file + ": key '" + key + "' must be an object or null, not " + describe(obj));
  }
  const Keys r(obj, file, key + ".");
  std::string type;
  if (r.find("rope_type")) {
    type = r.get_string("rope_type", "");
  } else if (r.find("type")) {
    type = r.get_string("type", "");  // the name before transformers 4.43
  } else {
    throw UserError(file + ": key '" + key + "' has no 'rope_type'");
  }
  // dynamic NTK scaling changes the frequencies only for sequences longer than max_position_embeddings
  // (transformers' dynamic_rope_update; at that length its base is rope_theta exactly); mgrl refuses such sequences.
  if (type == "default" || type == "dynamic") return std::nullopt;
  if (type != "llama3" && type != "linear" && type != "yarn") {
    throw UserError(file + ": unsupported rope_scaling type '" + type + "' in key '" + key +
                    "' (supported: llama3, linear, yarn, dynamic, or none)");
  }
  RopeScaling s;
  s.rope_type = type;
  // yarn with a null factor: max_position_embeddings / original_max_position_embeddings (transformers; DeepSeek-V3).
  // An absent one is an error there too.
  const bool implicit_factor = type == "yarn" && obj.contains("factor") && obj["factor"].is_null();
  if (!implicit_factor) s.factor = r.get_number("factor");
  if (!(s.factor > 0)) r.fail("factor", "must be positive");
  if (type == "linear") return s;
  // transformers (standardize_rope_params): the config's top-level original_max_position_embeddings first, then the
  // dict's, then max_position_embeddings.
  s.original_max_position_embeddings =
      top_original > 0 ? top_original
                       : (r.find("original_max_position_embeddings") ? r.get_int("original_max_position_embeddings")
                                                                     : max_pos);
  if (s.original_max_position_embeddings <= 0) r.fail("original_max_position_embeddings", "must be positive");
  if (implicit_factor)
    s.factor = static_cast<double>(max_pos) / static_cast<double>(s.original_max_position_embeddings);
  if (type == "yarn") {
    // transformers' _compute_yarn_parameters: a null or absent beta takes its default (`or 32`, `or 1`).
    s.beta_fast = r.get_number("beta_fast", 32.0);
    s.beta_slow = r.get_number("beta_slow", 1.0);
    if (s.beta_fast == 0) s.beta_fast = 32.0;  // Python's `or`: 0 takes the default too
    if (s.beta_slow == 0) s.beta_slow = 1.0;
    if (!(s.beta_fast > 0) || !(s.beta_slow > 0)) r.fail(s.beta_fast > 0 ? "beta_slow" : "beta_fast", "must be positive");
    s.truncate = r.get_bool("truncate", true);
    // The attention factor: given, or 0.1 ln(factor) + 1 (factor > 1), or with mscale and mscale_all_dim both
    // given and non-zero, the ratio of that formula with each as a multiplier of the log.
    const auto mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    if (r.find("attention_factor")) {
      s.attention_factor = r.get_number("attention_factor");
      if (!(s.attention_factor > 0)) r.fail("attention_factor", "must be positive");
    } else {
      const double m = r.get_number("mscale", 0.0), m_all = r.get_number("mscale_all_dim", 0.0);
      s.attention_factor = m != 0 && m_all != 0 ? mscale(s.factor, m) / mscale(s.factor, m_all) : mscale(s.factor, 1);
    }
    return s;
  }
  s.low_freq_factor = r.get_number("low_freq_factor");
  s.high_freq_factor = r.get_number("high_freq_factor");
  if (!(s.low_freq_factor > 0)) r.fail("low_freq_factor", "must be positive");
  if (!(s.high_freq_factor >= s.low_freq_factor)) r.fail("high_freq_factor", "must be >= low_freq_factor");
  return s;
}

}  // namespace

double parameter_count(const ModelConfig& c) {
  const double h = static_cast<double>(c.hidden_size), q = static_cast<double>(c.q_dim()),
               kv = static_cast<double>(c.kv_dim()), f = static_cast<double>(c.intermediate_size);
  const double per_layer = (c.gemma ? 4 : 2) * h + 2 * q * h + 2 * kv * h + 3 * f * h + (c.qkv_bias ? q + 2 * kv : 0) +
                           (c.o_bias ? h : 0) + (c.qk_norm ? 2.0 * static_cast<double>(c.head_dim) : 0);
  return static_cast<double>(c.vocab_size) * h * (c.tie_word_embeddings ? 1 : 2) + h +
         static_cast<double>(c.num_hidden_layers) * per_layer;
}

std::uint64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

namespace {

// The largest value of a size key that mgrl supports (well above any released Llama/Qwen model; kernels index
// with 32-bit integers).
void check_limit(const Keys& k, const std::string& key, std::int64_t value, std::int64_t limit) {
  if (value > limit)
    k.fail(key, "is " + std::to_string(value) + ", more than mgrl supports (" + std::to_string(limit) + ")");
}

// quantization_config: absent -> nullopt; bitsandbytes 4-bit NF4 -> its settings; anything else -> UserError.
std::optional<Bnb4bitConfig> parse_quantization(const Keys& k, const std::string& path) {
  const json* q = k.find("quantization_config");
  if (!q) return std::nullopt;
  if (!q->is_object()) k.fail("quantization_config", "must be an object, not " + describe(*q));
  const Keys qk(*q, path, "quantization_config.");
  const std::string method = qk.get_string("quant_method", "bitsandbytes");
  if (method != "bitsandbytes")
    qk.fail("quant_method", "is '" + method + "': mgrl reads bitsandbytes 4-bit (NF4) models only");
  if (qk.get_bool("load_in_8bit", false) || qk.get_bool("_load_in_8bit", false))
    qk.fail("load_in_8bit", "is true: mgrl reads bitsandbytes 4-bit (NF4) models, not 8-bit ones");
  if (!qk.get_bool("load_in_4bit", false) && !qk.get_bool("_load_in_4bit", false))
    qk.fail("load_in_4bit", "is not true: mgrl reads bitsandbytes 4-bit (NF4) models only");
  const std::string type = qk.get_string("bnb_4bit_quant_type", "fp4");
  if (type != "nf4") qk.fail("bnb_4bit_quant_type", "is '" + type + "': mgrl reads NF4 only (not fp4)");
  const std::string storage = qk.get_string("bnb_4bit_quant_storage", "uint8");
  if (storage != "uint8")
    qk.fail("bnb_4bit_quant_storage", "is '" + storage + "': mgrl reads uint8 NF4 storage only");
  Bnb4bitConfig b;
  b.double_quant = qk.get_bool("bnb_4bit_use_double_quant", false);
  b.compute_dtype = qk.get_string("bnb_4bit_compute_dtype", "");
  if (const json* skip = qk.find("llm_int8_skip_modules")) {
    if (!skip->is_array()) qk.fail("llm_int8_skip_modules", "must be a list of module names");
    for (const json& m : *skip) {
      if (!m.is_string()) qk.fail("llm_int8_skip_modules", "must be a list of module names");
      b.skip_modules.push_back(m.get<std::string>());
    }
  }
  return b;
}

// A number key that transformers defaults to `def` when absent and turns off when null (soft-capping, windows).
double optional_number(const json& j, const Keys& k, const std::string& key, double def) {
  if (!j.contains(key)) return def;
  if (j.at(key).is_null()) return 0;
  const double v = k.get_number(key);
  if (!(v > 0)) k.fail(key, "must be positive or null");
  return v;
}

// Gemma's scalars (query_pre_attn_scalar, the soft-caps) and the sliding window with the layers it applies to.
void parse_gemma_and_windows(ModelConfig& c, const json& j, const Keys& k) {
  const bool gemma2 = c.arch == Architecture::Gemma2, gemma3 = c.arch == Architecture::Gemma3;
  if (c.gemma) {
    c.query_pre_attn_scalar = optional_number(j, k, "query_pre_attn_scalar", 256);
    if (c.query_pre_attn_scalar == 0) k.fail("query_pre_attn_scalar", "must be a positive number");
    c.attn_logit_softcapping = optional_number(j, k, "attn_logit_softcapping", gemma2 ? 50.0 : 0.0);
    // transformers' Gemma 3 attention never applies it (Gemma3Attention passes no softcap): a value there changes
    // nothing in transformers, and nothing here (it soft-capped mgrl's attention scores until 2026-11-29).
    if (gemma3) c.attn_logit_softcapping = 0.0;
    c.final_logit_softcapping = optional_number(j, k, "final_logit_softcapping", gemma2 ? 30.0 : 0.0);
    if (k.get_bool("use_bidirectional_attention", false)) {
      k.fail("use_bidirectional_attention", "is true: only causal attention is supported");
    }
  }
  const std::size_t n = static_cast<std::size_t>(c.num_hidden_layers);
  c.layer_sliding.assign(n, false);
  if (!c.gemma && c.arch != Architecture::Mistral) return;  // Llama, Qwen: no windows (Qwen's switch is refused)
  const double window = optional_number(j, k, "sliding_window", 4096);  // transformers' default for all three
  if (window != std::floor(window) || window > 1e9) k.fail("sliding_window", "must be a positive integer or null");
  c.sliding_window = static_cast<std::int64_t>(window);
  if (c.sliding_window == 0) return;
  if (c.arch == Architecture::Mistral) {  // transformers' Mistral slides on every layer (it ignores layer_types)
    c.layer_sliding.assign(n, true);
    return;
  }
  if (const json* types = k.find("layer_types")) {
    if (!types->is_array() || types->size() != n) {
      k.fail("layer_types", "must be a list of num_hidden_layers (" + std::to_string(n) + ") strings");
    }
    for (std::size_t i = 0; i < n; ++i) {
      const json& t = (*types)[i];
      if (t == "sliding_attention") {
        c.layer_sliding[i] = true;
      } else if (t != "full_attention") {
        k.fail("layer_types", "entry " + std::to_string(i) + " is " + describe(t) +
                                  "; only 'sliding_attention' and 'full_attention' are supported");
      }
    }
    return;
  }
  // transformers' defaults: Gemma 2 slides on even layers; Gemma 3 on all but every sliding_window_pattern-th.
  const std::int64_t pattern = gemma3 ? k.get_int("sliding_window_pattern", 6) : 2;
  if (pattern <= 0) k.fail("sliding_window_pattern", "must be positive");
  for (std::size_t i = 0; i < n; ++i) c.layer_sliding[i] = (static_cast<std::int64_t>(i) + 1) % pattern != 0;
}

// Gemma3ForConditionalGeneration (or, without "architectures", model_type gemma3).
bool is_gemma3_vlm(const json& top) {
  const auto a = top.find("architectures");
  if (a != top.end() && a->is_array()) {
    for (const json& n : *a)
      if (n == "Gemma3ForConditionalGeneration") return true;
    return false;
  }
  const auto t = top.find("model_type");
  return (a == top.end() || a->is_null()) && t != top.end() && *t == "gemma3";
}

// The language model's config of a Gemma3ForConditionalGeneration config.json as a Gemma3ForCausalLM one: its
// text_config over Gemma3TextConfig's defaults (transformers 5.24) for the keys this reader requires. The Hub's
// checkpoints (written by transformers 4.50) hold in text_config only what differs from those defaults:
// google/gemma-3-4b-it's names hidden_size, intermediate_size, num_hidden_layers, rope_scaling and sliding_window,
// and leaves vocab_size, the head counts, head_dim and rms_norm_eps to them. The other defaults (RoPE bases,
// query_pre_attn_scalar, sliding_window, activation) are the Gemma 3 defaults this reader has anyway. The dtype, a
// bitsandbytes quantization_config and tie_word_embeddings are the top level's (parse_hf_config), as transformers 5.24
// reads them; so is the absence of a final soft-cap (its Gemma3ForConditionalGeneration applies none).
json gemma3_text_of_vlm(const json& top, const std::string& path) {
  json t = {{"vocab_size", 262208},          {"hidden_size", 2304},    {"intermediate_size", 9216},
            {"num_hidden_layers", 26},       {"num_attention_heads", 8}, {"num_key_value_heads", 4},
            {"head_dim", 256},               {"rms_norm_eps", 1e-6},   {"max_position_embeddings", 131072}};
  const auto it = top.find("text_config");
  if (it != top.end() && !it->is_null()) {
    if (!it->is_object()) throw UserError(path + ": key 'text_config' must be an object, not " + describe(*it));
    for (const auto& [key, v] : it->items()) t[key] = v;
  }
  const auto mt = t.find("model_type");
  if (mt != t.end() && *mt != "gemma3_text")
    throw UserError(path + ": key 'text_config.model_type' is " + describe(*mt) +
                    "; a Gemma3ForConditionalGeneration's language model is gemma3_text");
  t["architectures"] = json::array({"Gemma3ForCausalLM"});
  return t;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

ModelConfig parse_hf_config(const std::string& path) {
  const json top = read_json_file(path, "the model config");
  if (!top.is_object()) throw UserError(path + ": not a JSON object");
  // Gemma 3's vision-language checkpoint: its language model (text_config), text only.
  const bool vlm = is_gemma3_vlm(top);
  const json j = vlm ? gemma3_text_of_vlm(top, path) : top;
  const Keys k(j, path, vlm ? "text_config." : "");

  ModelConfig c;
  if (vlm) c.vlm_architecture = "Gemma3ForConditionalGeneration";
  c.arch = parse_architecture(j, k, path);
  c.vocab_size = k.get_positive("vocab_size");
  c.hidden_size = k.get_positive("hidden_size");
  c.intermediate_size = k.get_positive("intermediate_size");
  c.num_hidden_layers = k.get_positive("num_hidden_layers");
  c.num_attention_heads = k.get_positive("num_attention_heads");
  check_limit(k, "vocab_size", c.vocab_size, std::int64_t{1} << 30);
  check_limit(k, "hidden_size", c.hidden_size, std::int64_t{1} << 20);
  check_limit(k, "intermediate_size", c.intermediate_size, std::int64_t{1} << 22);
  check_limit(k, "num_hidden_layers", c.num_hidden_layers, 4096);
  check_limit(k, "num_attention_heads", c.num_attention_heads, 4096);
  c.num_key_value_heads = k.get_int("num_key_value_heads", c.num_attention_heads);
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0) {
    k.fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) +
                                      "), got " + std::to_string(c.num_key_value_heads));
  }
  if (k.find("head_dim")) {
    c.head_dim = k.get_positive("head_dim");
    check_limit(k, "head_dim", c.head_dim, 4096);
  } else if (c.arch == Architecture::Qwen3) {
    // transformers' Qwen3 default (128) is not hidden_size / num_attention_heads; its configs name it.
    throw UserError(path + ": missing required key 'head_dim' (Qwen3 configs give it)");
  } else if (c.arch == Architecture::Gemma2 || c.arch == Architecture::Gemma3) {
    throw UserError(path + ": missing required key 'head_dim' (Gemma configs give it)");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      k.fail("num_attention_heads", "must divide hidden_size (" + std::to_string(c.hidden_size) +
                                        ") when there is no head_dim");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.rms_norm_eps = k.get_number("rms_norm_eps");
  if (!(c.rms_norm_eps > 0)) k.fail("rms_norm_eps", "must be positive");
  c.max_position_embeddings = k.get_positive("max_position_embeddings");

  // RoPE: rope_theta + rope_scaling (transformers 4.x), or rope_parameters holding both (5.x).
  // Gemma 3 has two RoPEs: the global layers' (rope_theta, rope_scaling) and the sliding layers'
  // (rope_local_base_freq, never scaled); 5.x nests both in rope_parameters by layer type.
  const bool gemma3 = c.arch == Architecture::Gemma3;
  const json* params = k.find("rope_parameters");
  if (params && !params->is_object()) k.fail("rope_parameters", "must be an object, not " + describe(*params));
  std::string params_key = "rope_parameters";
  if (params && (params->contains("full_attention") || params->contains("sliding_attention"))) {
    const Keys nested(*params, path, "rope_parameters.");
    if (const json* local = nested.find("sliding_attention")) {
      if (!local->is_object()) nested.fail("sliding_attention", "must be an object, not " + describe(*local));
      const Keys l(*local, path, "rope_parameters.sliding_attention.");
      if (parse_rope(*local, "rope_parameters.sliding_attention", path, c.max_position_embeddings, 0)) {
        l.fail("rope_type", "must be 'default': mgrl does not scale the RoPE of sliding layers");
      }
      c.rope_local_theta = l.get_number("rope_theta", 10000.0);
      if (!(c.rope_local_theta > 0)) l.fail("rope_theta", "must be positive");
    }
    params = nested.find("full_attention");
    if (params && !params->is_object()) nested.fail("full_attention", "must be an object, not " + describe(*params));
    params_key = "rope_parameters.full_attention";
  } else if (gemma3) {
    c.rope_local_theta = k.get_number("rope_local_base_freq", 10000.0);
    if (!(c.rope_local_theta > 0)) k.fail("rope_local_base_freq", "must be positive");
  }
  if (k.find("rope_theta")) {
    c.rope_theta = k.get_number("rope_theta");
  } else if (params && params->contains("rope_theta")) {
    c.rope_theta = Keys(*params, path, params_key + ".").get_number("rope_theta");
  } else {
    c.rope_theta = gemma3 ? 1000000.0 : 10000.0;  // transformers' defaults for these architectures
  }
  if (!(c.rope_theta > 0)) k.fail("rope_theta", "must be positive");
  const std::int64_t top_original =
      k.find("original_max_position_embeddings") ? k.get_positive("original_max_position_embeddings") : 0;
  if (const json* s = k.find("rope_scaling")) {
    c.rope_scaling = parse_rope(*s, "rope_scaling", path, c.max_position_embeddings, top_original);
  } else if (params) {
    c.rope_scaling = parse_rope(*params, params_key, path, c.max_position_embeddings, top_original);
  }
  if (gemma3 && c.rope_local_theta == 0) c.rope_local_theta = 10000.0;

  c.gemma = c.arch == Architecture::Gemma2 || gemma3;
  // Gemma's MLP reads hidden_activation alone (transformers' default gelu_pytorch_tanh): a hidden_act beside it, or in
  // its place, is not used (it was when hidden_activation was absent, until 2026-11-29: SwiGLU for "silu").
  const std::string act_key = c.gemma ? "hidden_activation" : "hidden_act";
  c.hidden_act = k.get_string(act_key, c.gemma ? "gelu_pytorch_tanh" : "silu");
  if (c.hidden_act != "silu" && c.hidden_act != "gelu_pytorch_tanh") {
    k.fail(act_key, "is '" + c.hidden_act + "'; only 'silu' and 'gelu_pytorch_tanh' are supported");
  }
  // transformers' Gemma default: tied. A vision-language checkpoint's is its top level's (transformers 5.24 ties by
  // the top-level config's; Gemma3Config(tie_word_embeddings=False) writes text_config's as true beside it).
  const Keys top_keys(top, path);
  const Keys& outer = vlm ? top_keys : k;
  c.tie_word_embeddings = outer.get_bool("tie_word_embeddings", c.gemma);
  switch (c.arch) {
    case Architecture::Llama:
      c.qkv_bias = c.o_bias = k.get_bool("attention_bias", false);
      if (k.get_bool("mlp_bias", false)) k.fail("mlp_bias", "is true: MLP biases are not supported");
      break;
    case Architecture::Qwen2:
      c.qkv_bias = true;
      c.o_bias = false;
      break;
    case Architecture::Qwen3:
      c.qkv_bias = c.o_bias = k.get_bool("attention_bias", false);
      c.qk_norm = true;
      break;
    case Architecture::Gemma2:
    case Architecture::Gemma3:
      c.qkv_bias = c.o_bias = k.get_bool("attention_bias", false);
      c.qk_norm = gemma3;
      break;
    case Architecture::Mistral:
      break;
  }
  parse_gemma_and_windows(c, j, k);
  // transformers 5.24's Gemma3ForConditionalGeneration computes its logits as lm_head(hidden) without the final
  // soft-cap that its Gemma3ForCausalLM applies (4.50's, which wrapped a causal LM, did): a text_config's
  // final_logit_softcapping changes nothing there, and nothing here.
  if (vlm) c.final_logit_softcapping = 0.0;
  if ((c.arch == Architecture::Qwen2 || c.arch == Architecture::Qwen3) && k.get_bool("use_sliding_window", false)) {
    k.fail("use_sliding_window", "is true: sliding-window attention is not supported");
  }
  c.torch_dtype = outer.find("torch_dtype") ? outer.get_string("torch_dtype", "") : outer.get_string("dtype", "");
  c.bnb4bit = parse_quantization(outer, path);

  if (c.q_dim() > (std::int64_t{1} << 20))
    k.fail("num_attention_heads", "x head_dim (" + std::to_string(c.q_dim()) + ") is more than mgrl supports (" +
                                      std::to_string(std::int64_t{1} << 20) + ")");
  // The whole model must fit this machine's memory as the least any configuration stores it: 2 bytes a parameter
  // (bf16/fp16; the CPU backend needs 4), its projections at about half a byte as NF4 (QLoRA: a bitsandbytes 4-bit
  // directory, or model.quantize = "nf4", which this reader does not see). The run's own check is exact.
  const double n_params = parameter_count(c), memory = static_cast<double>(host_memory_bytes());
  const double n_proj = static_cast<double>(c.num_hidden_layers) *
                        static_cast<double>(c.hidden_size) *
                        static_cast<double>(2 * c.q_dim() + 2 * c.kv_dim() + 3 * c.intermediate_size);
  const double stored = (n_params - n_proj) * 2 + n_proj * 0.516;
  if (memory > 0 && stored > memory) {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", n_params);
    throw UserError(path + ": the model it describes has " + count + " parameters (" + gib(stored) +
                    " with NF4 projections" + "), more than this machine's memory (" +
                    gib(memory) + "): check vocab_size, hidden_size, intermediate_size and num_hidden_layers");
  }

  if (k.find("bos_token_id")) c.bos_token_id = k.get_int("bos_token_id");
  // eos_token_id: one id or a list (null: none), of config.json and of generation_config.json beside it, which
  // transformers' generate reads (Qwen2.5-Instruct's lists <|im_end|> and <|endoftext|>; until 2026-11-28 only
  // config.json's were read). Every completion mgrl samples ends at any of them or the tokenizer's EOS.
  const auto read_eos = [&c](const Keys& keys) {
    const json* e = keys.find("eos_token_id");
    if (!e) return;
    std::vector<std::int64_t> ids;
    if (e->is_array()) {
      for (const json& id : *e) {
        if (!id.is_number_integer()) keys.fail("eos_token_id", "must be an integer or a list of integers");
        ids.push_back(id.get<std::int64_t>());
      }
    } else {
      if (!e->is_number_integer()) keys.fail("eos_token_id", "must be an integer or a list of integers");
      ids.push_back(e->get<std::int64_t>());
    }
    // An id the model cannot produce would never end a completion (every one running to its length, silently).
    for (const std::int64_t id : ids) {
      if (id < 0 || id >= c.vocab_size)
        keys.fail("eos_token_id", "holds " + std::to_string(id) + ", outside the vocabulary (vocab_size " +
                                      std::to_string(c.vocab_size) + ")");
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
        c.eos_token_ids.push_back(id);
    }
  };
  read_eos(k);
  if (vlm) read_eos(Keys(top, path));  // the Hub's checkpoints list [1, 106] (<eos>, <end_of_turn>) at the top level
  const auto slash = path.find_last_of('/');
  const std::string gen = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
                          "generation_config.json";
  std::error_code ec;
  if (std::filesystem::exists(gen, ec)) {
    const json g = read_json_file(gen, "the generation config");
    if (!g.is_object()) throw UserError(gen + ": not a JSON object");
    read_eos(Keys(g, gen));
  }
  return c;
}

std::optional<GenerationDefaults> read_generation_defaults(const std::string& model_dir) {
  const std::string gen = model_dir + "/generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(gen, ec)) return std::nullopt;
  const json g = read_json_file(gen, "the generation config");
  if (!g.is_object()) throw UserError(gen + ": not a JSON object");
  const Keys gk(g, gen);
  GenerationDefaults d;
  if (gk.find("do_sample")) d.do_sample = gk.get_bool("do_sample", false);
  const auto number = [&gk](const char* key, std::optional<double>& out, bool zero_ok) {
    if (!gk.find(key)) return;
    const double v = gk.get_number(key);
    if (!(zero_ok ? v >= 0 : v > 0)) gk.fail(key, zero_ok ? "must be >= 0" : "must be > 0");
    out = v;
  };
  number("temperature", d.temperature, true);
  number("top_p", d.top_p, true);
  number("min_p", d.min_p, true);
  number("repetition_penalty", d.repetition_penalty, false);
  if (gk.find("top_k")) {
    d.top_k = gk.get_int("top_k");
    if (*d.top_k < 0) gk.fail("top_k", "must be >= 0");
  }
  return d;
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  const std::int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  std::vector<TensorSpec> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "self_attn.q_proj.weight", {q, h}});
    if (c.qkv_bias) out.push_back({p + "self_attn.q_proj.bias", {q}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    if (c.qkv_bias) out.push_back({p + "self_attn.k_proj.bias", {kv}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    if (c.qkv_bias) out.push_back({p + "self_attn.v_proj.bias", {kv}});
    out.push_back({p + "self_attn.o_proj.weight", {h, q}});
    if (c.o_bias) out.push_back({p + "self_attn.o_proj.bias", {h}});
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    if (c.gemma) {
      out.push_back({p + "pre_feedforward_layernorm.weight", {h}});
      out.push_back({p + "post_feedforward_layernorm.weight", {h}});
    }
    out.push_back({p + "mlp.gate_proj.weight", {f, h}});
    out.push_back({p + "mlp.up_proj.weight", {f, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, f}});
  }
  out.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, h}});
  return out;
}

std::string model_name(const ModelConfig& c) {
  return c.vlm() ? c.vlm_architecture + " (its language model)" : std::string(architecture_name(c.arch));
}

void use_language_model_names(SafetensorsModel& m) {
  if (m.find("model.language_model.embed_tokens.weight")) {  // transformers >= 4.52 (lm_head stays lm_head)
    m.rename_prefix("model.language_model.", "model.");
    return;
  }
  if (m.find("language_model.model.embed_tokens.weight")) {  // the Hub's checkpoints (transformers 4.50)
    m.rename_prefix("language_model.model.", "model.");
    m.rename_prefix("language_model.lm_head.", "lm_head.");
    return;
  }
  throw UserError(m.dir() + ": config.json names a vision-language model (Gemma3ForConditionalGeneration), but its "
                  "weights hold no language model (no model.language_model.embed_tokens.weight or "
                  "language_model.model.embed_tokens.weight)");
}

bool is_vision_tensor(const std::string& name) {
  for (const char* p : {"model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector."})
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

}  // namespace mgrl::io
