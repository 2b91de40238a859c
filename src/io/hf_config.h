// hf_config.h: a Hugging Face model's config.json (Llama, Qwen2, Qwen3, Gemma 2, Gemma 3 text, Mistral causal LMs)
// and the tensors it implies.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace mgrl::io {

enum class Architecture { Llama, Qwen2, Qwen3, Gemma2, Gemma3, Mistral };
const char* architecture_name(Architecture a);  // "LlamaForCausalLM", ...

// rope_scaling of type "llama3" (Llama 3.1+: per-frequency scaling of the rotary embedding), "linear" (every
// inverse frequency divided by factor; Gemma 3's global layers) or "yarn" (YaRN: NTK-by-parts interpolation between
// the plain and the factor-divided frequencies, and cos/sin multiplied by attention_factor; Qwen2.5/Qwen3 long
// context). "default" and "dynamic" (dynamic NTK, the plain RoPE up to max_position_embeddings, which mgrl never
// exceeds) are no scaling.
struct RopeScaling {
  std::string rope_type = "llama3";
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  std::int64_t original_max_position_embeddings = 8192;  // llama3, yarn
  double beta_fast = 32, beta_slow = 1;  // yarn: the ramp's bounds in rotations
  bool truncate = true;                  // yarn: the ramp's bounds rounded to whole dimensions
  double attention_factor = 1.0;         // yarn: cos and sin are multiplied by it (resolved from mscale, ...)
};

// quantization_config of a model directory that transformers saved with bitsandbytes in 4-bit form
// (quant_method "bitsandbytes", load_in_4bit). mgrl reads NF4 with uint8 storage; other quantizations are refused.
struct Bnb4bitConfig {
  bool double_quant = false;                // bnb_4bit_use_double_quant
  std::string compute_dtype;                // bnb_4bit_compute_dtype (informative: mgrl computes in its own dtype)
  std::vector<std::string> skip_modules;    // llm_int8_skip_modules (modules left dense)
};

// The sampling settings of generation_config.json beside config.json (each absent or null: not set), as transformers'
// generate reads them when it is given none (mgrl generate's defaults: app/mode_generate.cpp).
struct GenerationDefaults {
  std::optional<bool> do_sample;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<std::int64_t> top_k;
};

struct ModelConfig {
  Architecture arch = Architecture::Llama;
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;  // default: num_attention_heads
  std::int64_t head_dim = 0;             // default: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // none: plain RoPE
  std::int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;  // lm_head shares model.embed_tokens.weight
  bool qkv_bias = false;             // q/k/v_proj have biases (Llama, Qwen3: attention_bias; Qwen2: always)
  bool o_bias = false;               // o_proj has a bias (Llama, Qwen3: attention_bias; Qwen2: never)
  bool qk_norm = false;              // per-head RMSNorm of q and k before RoPE (Qwen3)
  std::string hidden_act = "silu";  // "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU, Gemma)
  // Gemma 2/3: RMSNorm scales by (1 + weight), the embeddings are multiplied by sqrt(hidden_size), and norms
  // stand before and after both attention and MLP (pre/post_feedforward_layernorm).
  bool gemma = false;
  double query_pre_attn_scalar = 0;    // attention scores scaled by its -1/2 power; 0: head_dim
  double attn_logit_softcapping = 0;   // scores s -> cap * tanh(s / cap); 0: none
  double final_logit_softcapping = 0;  // logits l -> cap * tanh(l / cap); 0: none
  std::int64_t sliding_window = 0;     // on sliding layers key j is seen by query i iff i - window < j <= i; 0: none
  std::vector<bool> layer_sliding;     // [num_hidden_layers]: the layer uses the sliding window
  double rope_local_theta = 0;         // RoPE base of sliding layers (Gemma 3, never scaled); 0: rope_theta
  std::string torch_dtype;  // informative ("bfloat16", ...; "" when absent)
  std::optional<Bnb4bitConfig> bnb4bit;  // set when config.json has a bitsandbytes 4-bit quantization_config
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;  // config.json gives one id or a list
  // The language model of a vision-language checkpoint (Gemma3ForConditionalGeneration: google/gemma-3-4b-it and
  // larger), read text only: the fields above are its text_config's, its tensors are stored under
  // model.language_model. (transformers 5) or language_model.model. (the Hub's, transformers 4.50), the vision tower
  // is not loaded, and LoRA adapters carry those module names (io::use_language_model_names, model/lora.h).
  std::string vlm_architecture;  // "Gemma3ForConditionalGeneration"; empty: a causal LM of its own
  bool vlm() const { return !vlm_architecture.empty(); }

  std::int64_t q_dim() const { return num_attention_heads * head_dim; }
  bool is_sliding(std::int64_t layer) const {
    return sliding_window > 0 && layer >= 0 && layer < static_cast<std::int64_t>(layer_sliding.size()) &&
           layer_sliding[static_cast<std::size_t>(layer)];
  }
  // The window of a layer's attention (0: none) and its RoPE base and scaling.
  std::int64_t layer_window(std::int64_t layer) const { return is_sliding(layer) ? sliding_window : 0; }
  double layer_rope_theta(std::int64_t layer) const {
    return is_sliding(layer) && rope_local_theta > 0 ? rope_local_theta : rope_theta;
  }
  const std::optional<RopeScaling>& layer_rope_scaling(std::int64_t layer) const {
    static const std::optional<RopeScaling> none;
    return is_sliding(layer) && rope_local_theta > 0 ? none : rope_scaling;
  }
  // The attention score scale: query_pre_attn_scalar^-1/2 (Gemma) or head_dim^-1/2.
  double attention_scale() const {
    return 1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar : static_cast<double>(head_dim));
  }
  // YaRN's attention factor m of a layer (1: none). transformers multiplies cos and sin by m, so q and k after RoPE
  // are m times the plain ones and every score m^2 times: mgrl folds m^2 into the layer's score scale instead.
  double layer_rope_attention_factor(std::int64_t layer) const {
    const auto& rs = layer_rope_scaling(layer);
    return rs ? rs->attention_factor : 1.0;
  }
  std::int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

// Reads config.json. Throws UserError naming the file (and the key) when it is missing, not JSON, of an
// unsupported architecture or rope_scaling type, or lacks a required key or has one of the wrong type.
// Reads both the transformers 4.x layout (rope_theta, rope_scaling, torch_dtype) and the 5.x one
// (rope_parameters, dtype). Sizes are bounded before anything is built from them: each dimension within what
// mgrl supports (a UserError naming the key), and the whole model (at 2 bytes a parameter, the least any backend
// stores) within this machine's memory.
ModelConfig parse_hf_config(const std::string& config_json_path);

// generation_config.json of a model directory: its sampling settings (nullopt when the file does not exist). Throws
// UserError naming the file and the key for a value of the wrong type or out of range.
std::optional<GenerationDefaults> read_generation_defaults(const std::string& model_dir);

struct TensorSpec {
  std::string name;
  Shape shape;
};

// Parameters of the model (every tensor of expected_tensors), as a double (no overflow for absurd configs).
double parameter_count(const ModelConfig& c);

// Bytes of memory of this machine (physical RAM); 0 when unknown.
std::uint64_t host_memory_bytes();

// The Hugging Face tensor names and shapes the model needs, in layer order.
std::vector<TensorSpec> expected_tensors(const ModelConfig& c);

// The model as start-up lines name it: its architecture, or "Gemma3ForConditionalGeneration (its language model)".
std::string model_name(const ModelConfig& c);

class SafetensorsModel;
// A vision-language checkpoint's weights read as its language model's (ModelConfig::vlm): the tensors under
// model.language_model. or language_model.model. are found as model.*, language_model.lm_head.* as lm_head.*
// (SafetensorsModel::rename_prefix); UserError naming the directory when neither layout is there.
void use_language_model_names(SafetensorsModel& m);
// Whether a tensor name is a vision-language checkpoint's vision part (its vision tower or projector), which a
// text-only reading leaves alone.
bool is_vision_tensor(const std::string& name);

}  // namespace mgrl::io
