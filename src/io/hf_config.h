// hf_config.h: a Hugging Face model's config.json (Llama, Qwen2, Qwen3 causal LMs) and the tensors it implies.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace mgrl::io {

enum class Architecture { Llama, Qwen2, Qwen3 };
const char* architecture_name(Architecture a);  // "LlamaForCausalLM", ...

// rope_scaling of type "llama3" (Llama 3.1+): per-frequency scaling of the rotary embedding.
struct RopeScaling {
  std::string rope_type = "llama3";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

// quantization_config of a model directory that transformers saved with bitsandbytes in 4-bit form
// (quant_method "bitsandbytes", load_in_4bit). mgrl reads NF4 with uint8 storage; other quantizations are refused.
struct Bnb4bitConfig {
  bool double_quant = false;                // bnb_4bit_use_double_quant
  std::string compute_dtype;                // bnb_4bit_compute_dtype (informative: mgrl computes in its own dtype)
  std::vector<std::string> skip_modules;    // llm_int8_skip_modules (modules left dense)
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
  std::string hidden_act = "silu";
  std::string torch_dtype;  // informative ("bfloat16", ...; "" when absent)
  std::optional<Bnb4bitConfig> bnb4bit;  // set when config.json has a bitsandbytes 4-bit quantization_config
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;  // config.json gives one id or a list

  std::int64_t q_dim() const { return num_attention_heads * head_dim; }
  std::int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

// Reads config.json. Throws UserError naming the file (and the key) when it is missing, not JSON, of an
// unsupported architecture or rope_scaling type, or lacks a required key or has one of the wrong type.
// Reads both the transformers 4.x layout (rope_theta, rope_scaling, torch_dtype) and the 5.x one
// (rope_parameters, dtype). Sizes are bounded before anything is built from them: each dimension within what
// mgrl supports (a UserError naming the key), and the whole model (at 2 bytes a parameter, the least any backend
// stores) within this machine's memory.
ModelConfig parse_hf_config(const std::string& config_json_path);

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

}  // namespace mgrl::io
