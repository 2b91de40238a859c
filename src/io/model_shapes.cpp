// model_shapes.cpp: the table of built-in model shapes. The numbers are those of each model's config.json on the
// Hugging Face Hub (meta-llama/Llama-3.1-8B, meta-llama/Llama-3.1-70B, meta-llama/Llama-3.2-1B and -3B,
// Qwen/Qwen2.5-0.5B ... -72B, Qwen/Qwen3-0.6B, -8B, -32B): hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, vocab_size, rope_theta (+ rope_scaling), max_position_embeddings,
// tie_word_embeddings; biases and q/k norms follow from the architecture (Qwen2: q/k/v biases; Qwen3: q/k norms).
#include "io/model_shapes.h"

#include "core/error.h"

namespace mgrl::io {

namespace {

struct NamedShape {
  const char* name;
  Architecture arch;
  std::int64_t vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_pos;
  double rope_theta, rms_eps;
  bool tie;
  double llama3_factor;  // rope_scaling of type llama3 with this factor (low 1, high 4, original 8192); 0: none
  std::int64_t bos, eos;
};

// clang-format off
constexpr NamedShape kShapes[] = {
  // A tiny Llama for tests (not a released model).
  {"tiny-llama",    Architecture::Llama, 256,    64,   128,   2,  4, 2,  16,    512,    10000.0, 1e-5, false, 0, 1, 2},
  {"llama-3.2-1b",  Architecture::Llama, 128256, 2048, 8192,  16, 32, 8, 64,  131072, 500000.0, 1e-5, true, 32, 128000, 128001},
  {"llama-3.2-3b",  Architecture::Llama, 128256, 3072, 8192,  28, 24, 8, 128, 131072, 500000.0, 1e-5, true, 32, 128000, 128001},
  {"llama-3.1-8b",  Architecture::Llama, 128256, 4096, 14336, 32, 32, 8, 128, 131072, 500000.0, 1e-5, false, 8, 128000, 128001},
  {"llama-3.1-70b", Architecture::Llama, 128256, 8192, 28672, 80, 64, 8, 128, 131072, 500000.0, 1e-5, false, 8, 128000, 128001},
  {"qwen2.5-0.5b",  Architecture::Qwen2, 151936, 896,  4864,  24, 14, 2, 64,   32768, 1000000.0, 1e-6, true, 0, 151643, 151643},
  {"qwen2.5-1.5b",  Architecture::Qwen2, 151936, 1536, 8960,  28, 12, 2, 128,  32768, 1000000.0, 1e-6, true, 0, 151643, 151643},
  {"qwen2.5-3b",    Architecture::Qwen2, 151936, 2048, 11008, 36, 16, 2, 128,  32768, 1000000.0, 1e-6, true, 0, 151643, 151643},
  {"qwen2.5-7b",    Architecture::Qwen2, 152064, 3584, 18944, 28, 28, 4, 128,  32768, 1000000.0, 1e-6, false, 0, 151643, 151643},
  {"qwen2.5-14b",   Architecture::Qwen2, 152064, 5120, 13824, 48, 40, 8, 128,  32768, 1000000.0, 1e-5, false, 0, 151643, 151643},
  {"qwen2.5-32b",   Architecture::Qwen2, 152064, 5120, 27648, 64, 40, 8, 128,  32768, 1000000.0, 1e-5, false, 0, 151643, 151643},
  {"qwen2.5-72b",   Architecture::Qwen2, 152064, 8192, 29568, 80, 64, 8, 128,  32768, 1000000.0, 1e-5, false, 0, 151643, 151643},
  {"qwen3-0.6b",    Architecture::Qwen3, 151936, 1024, 3072,  28, 16, 8, 128,  40960, 1000000.0, 1e-6, true, 0, 151643, 151645},
  {"qwen3-8b",      Architecture::Qwen3, 151936, 4096, 12288, 36, 32, 8, 128,  40960, 1000000.0, 1e-6, false, 0, 151643, 151645},
  {"qwen3-32b",     Architecture::Qwen3, 151936, 5120, 25600, 64, 64, 8, 128,  40960, 1000000.0, 1e-6, false, 0, 151643, 151645},
};
// clang-format on

}  // namespace

std::vector<std::string> model_shape_names() {
  std::vector<std::string> out;
  for (const NamedShape& s : kShapes) out.emplace_back(s.name);
  return out;
}

ModelConfig model_shape(const std::string& name, const std::string& key) {
  for (const NamedShape& s : kShapes) {
    if (name != s.name) continue;
    ModelConfig c;
    c.arch = s.arch;
    c.vocab_size = s.vocab;
    c.hidden_size = s.hidden;
    c.intermediate_size = s.intermediate;
    c.num_hidden_layers = s.layers;
    c.num_attention_heads = s.heads;
    c.num_key_value_heads = s.kv_heads;
    c.head_dim = s.head_dim;
    c.max_position_embeddings = s.max_pos;
    c.rope_theta = s.rope_theta;
    c.rms_norm_eps = s.rms_eps;
    c.tie_word_embeddings = s.tie;
    if (s.llama3_factor > 0) {
      RopeScaling r;
      r.factor = s.llama3_factor;
      c.rope_scaling = r;  // low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192
    }
    c.qkv_bias = s.arch == Architecture::Qwen2;
    c.o_bias = false;
    c.qk_norm = s.arch == Architecture::Qwen3;
    c.torch_dtype = "bfloat16";
    c.bos_token_id = s.bos;
    c.eos_token_ids = {s.eos};
    return c;
  }
  std::string names;
  for (const NamedShape& s : kShapes) names += (names.empty() ? "" : ", ") + std::string(s.name);
  throw UserError("key '" + key + "': unknown model shape '" + name + "' (known: " + names + ")");
}

}  // namespace mgrl::io
