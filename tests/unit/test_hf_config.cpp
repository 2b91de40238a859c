// test_hf_config.cpp: config.json of Llama-3, Qwen2, Qwen3, Gemma 2, Gemma 3 and Mistral models, its errors, the expected tensor lists, and
// (when tests/data/models/ holds them) the real fixture models written by transformers.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "tests/unit/test_util.h"

namespace mgrl::io {
namespace {

std::string write_config(const std::string& name, const std::string& text) {
  return test::write_temp("hf_" + name + ".json", text);
}


// Llama 3.1 8B, as published (GQA: 32 query heads, 8 key/value heads; llama3 rope scaling).
const char* kLlama3 = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Qwen2.5 0.5B: q/k/v biases, tied embeddings, head_dim = 896 / 14 = 64.
const char* kQwen2 = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen3 0.6B: head_dim 128 although hidden_size / num_attention_heads = 64; q/k norms.
const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// name -> shape of a tensor list (and checks names are unique).
std::map<std::string, Shape> by_name(const std::vector<TensorSpec>& v) {
  std::map<std::string, Shape> m;
  for (const TensorSpec& t : v) EXPECT_TRUE(m.emplace(t.name, t.shape).second) << "duplicate " << t.name;
  return m;
}

TEST(HfConfig, Llama3) {
  const ModelConfig c = parse_hf_config(write_config("llama3", kLlama3));
  EXPECT_EQ(c.arch, Architecture::Llama);
  EXPECT_STREQ(architecture_name(c.arch), "LlamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->rope_type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{128001, 128008, 128009}));

  const auto t = expected_tensors(c);
  EXPECT_EQ(t.size(), 1u + 32 * 9 + 1 + 1);
  EXPECT_EQ(t.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(t.back().name, "lm_head.weight");
  const auto m = by_name(t);
  EXPECT_EQ(m.at("model.embed_tokens.weight"), (Shape{128256, 4096}));
  EXPECT_EQ(m.at("model.layers.0.input_layernorm.weight"), (Shape{4096}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.q_proj.weight"), (Shape{4096, 4096}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.k_proj.weight"), (Shape{1024, 4096}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.v_proj.weight"), (Shape{1024, 4096}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.o_proj.weight"), (Shape{4096, 4096}));
  EXPECT_EQ(m.at("model.layers.31.post_attention_layernorm.weight"), (Shape{4096}));
  EXPECT_EQ(m.at("model.layers.31.mlp.gate_proj.weight"), (Shape{14336, 4096}));
  EXPECT_EQ(m.at("model.layers.31.mlp.up_proj.weight"), (Shape{14336, 4096}));
  EXPECT_EQ(m.at("model.layers.31.mlp.down_proj.weight"), (Shape{4096, 14336}));
  EXPECT_EQ(m.at("model.norm.weight"), (Shape{4096}));
  EXPECT_EQ(m.at("lm_head.weight"), (Shape{128256, 4096}));
  EXPECT_EQ(m.count("model.layers.0.self_attn.q_proj.bias"), 0u);
  EXPECT_EQ(m.count("model.layers.32.input_layernorm.weight"), 0u);
}

TEST(HfConfig, Qwen2) {
  const ModelConfig c = parse_hf_config(write_config("qwen2", kQwen2));
  EXPECT_EQ(c.arch, Architecture::Qwen2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.eos_token_ids, std::vector<std::int64_t>{151643});

  const auto t = expected_tensors(c);
  EXPECT_EQ(t.size(), 1u + 24 * 12 + 1);
  const auto m = by_name(t);
  EXPECT_EQ(m.at("model.layers.5.self_attn.q_proj.weight"), (Shape{896, 896}));
  EXPECT_EQ(m.at("model.layers.5.self_attn.q_proj.bias"), (Shape{896}));
  EXPECT_EQ(m.at("model.layers.5.self_attn.k_proj.weight"), (Shape{128, 896}));
  EXPECT_EQ(m.at("model.layers.5.self_attn.k_proj.bias"), (Shape{128}));
  EXPECT_EQ(m.at("model.layers.5.self_attn.v_proj.bias"), (Shape{128}));
  EXPECT_EQ(m.count("model.layers.5.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(m.count("lm_head.weight"), 0u);  // tied
  EXPECT_EQ(m.at("model.layers.23.mlp.down_proj.weight"), (Shape{896, 4864}));
}

TEST(HfConfig, Qwen3) {
  const ModelConfig c = parse_hf_config(write_config("qwen3", kQwen3));
  EXPECT_EQ(c.arch, Architecture::Qwen3);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);  // an integer in the file

  const auto t = expected_tensors(c);
  EXPECT_EQ(t.size(), 1u + 28 * 11 + 1);
  const auto m = by_name(t);
  EXPECT_EQ(m.at("model.layers.0.self_attn.q_proj.weight"), (Shape{2048, 1024}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.k_proj.weight"), (Shape{1024, 1024}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.o_proj.weight"), (Shape{1024, 2048}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.q_norm.weight"), (Shape{128}));
  EXPECT_EQ(m.at("model.layers.27.self_attn.k_norm.weight"), (Shape{128}));
  EXPECT_EQ(m.count("model.layers.0.self_attn.q_proj.bias"), 0u);
  EXPECT_EQ(m.count("lm_head.weight"), 0u);
}

// A small Llama config to edit: replace "key": value, or add keys.
std::string llama_with(const std::string& extra, const std::string& drop = "") {
  std::string base = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512)";
  if (!drop.empty()) {
    const std::size_t at = base.find("\"" + drop + "\"");
    const std::size_t comma = base.find_first_of(",}", at);
    base.erase(at, comma + 1 - at);
    if (base.back() == ' ') base.pop_back();
    while (!base.empty() && (base.back() == ' ' || base.back() == '\n' || base.back() == ',')) base.pop_back();
  }
  return base + (extra.empty() ? "" : ", " + extra) + "}";
}

TEST(HfConfig, Defaults) {
  const ModelConfig c = parse_hf_config(write_config("defaults", llama_with("")));
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.torch_dtype, "");
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_EQ(expected_tensors(c).size(), 1u + 2 * 9 + 2);
}

TEST(HfConfig, LlamaAttentionBiasAndHeadDim) {
  const ModelConfig c =
      parse_hf_config(write_config("llama_bias", llama_with(R"("attention_bias": true, "head_dim": 32,
        "num_key_value_heads": 2, "rope_scaling": null, "bos_token_id": null, "eos_token_id": 2)")));
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);  // Llama's attention_bias covers o_proj too
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.eos_token_ids, std::vector<std::int64_t>{2});
  const auto m = by_name(expected_tensors(c));
  EXPECT_EQ(m.at("model.layers.1.self_attn.q_proj.weight"), (Shape{128, 64}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.q_proj.bias"), (Shape{128}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.v_proj.bias"), (Shape{64}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.o_proj.weight"), (Shape{64, 128}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.o_proj.bias"), (Shape{64}));
}

TEST(HfConfig, Qwen3AttentionBias) {
  std::string text = kQwen3;
  text.replace(text.find("\"attention_bias\": false"), 23, "\"attention_bias\": true");
  const ModelConfig c = parse_hf_config(write_config("qwen3_bias", text));
  EXPECT_TRUE(c.qkv_bias && c.o_bias && c.qk_norm);
}

TEST(HfConfig, OlderAndNewerRopeLayouts) {
  // Before transformers 4.43 the type was "type".
  ModelConfig c = parse_hf_config(write_config("rope_old", llama_with(R"("rope_scaling": {"type": "llama3",
      "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
      "rope_theta": 500000.0)")));
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 32.0);
  // transformers 5: rope_parameters holds rope_theta and the scaling; dtype instead of torch_dtype.
  c = parse_hf_config(write_config("rope_v5", llama_with(R"("rope_parameters": {"rope_type": "llama3",
      "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, "dtype": "float32")")));
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.torch_dtype, "float32");
  c = parse_hf_config(
      write_config("rope_v5_default", llama_with(R"("rope_parameters": {"rope_type": "default", "rope_theta": 1e6})")));
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.rope_scaling.has_value());
}

// Gemma 2 2B as published (4.x layout: no layer_types; soft-caps given; hidden_act and hidden_activation).
const char* kGemma2 = R"({
  "architectures": ["Gemma2ForCausalLM"],
  "attention_bias": false,
  "attn_logit_softcapping": 50.0,
  "bos_token_id": 2,
  "eos_token_id": [1, 107],
  "final_logit_softcapping": 30.0,
  "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 2304,
  "intermediate_size": 9216,
  "max_position_embeddings": 8192,
  "model_type": "gemma2",
  "num_attention_heads": 8,
  "num_hidden_layers": 26,
  "num_key_value_heads": 4,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "torch_dtype": "float32",
  "vocab_size": 256000
})";

// Gemma 3 4B's text part as a Gemma3ForCausalLM config (4.x layout: rope_local_base_freq, linear global scaling,
// sliding_window_pattern instead of layer_types).
const char* kGemma3 = R"({
  "architectures": ["Gemma3ForCausalLM"],
  "attn_logit_softcapping": null,
  "final_logit_softcapping": null,
  "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 2560,
  "intermediate_size": 10240,
  "max_position_embeddings": 131072,
  "model_type": "gemma3_text",
  "num_attention_heads": 8,
  "num_hidden_layers": 34,
  "num_key_value_heads": 4,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000.0,
  "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
  "rope_theta": 1000000.0,
  "sliding_window": 1024,
  "sliding_window_pattern": 6,
  "vocab_size": 262208
})";

// Mistral 7B v0.1: head_dim = 4096 / 32, a 4096-token window on every layer.
const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "vocab_size": 32000
})";

std::string with_replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(HfConfig, Gemma2) {
  const ModelConfig c = parse_hf_config(write_config("gemma2", kGemma2));
  EXPECT_EQ(c.arch, Architecture::Gemma2);
  EXPECT_STREQ(architecture_name(c.arch), "Gemma2ForCausalLM");
  EXPECT_TRUE(c.gemma);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);  // transformers' Gemma default when the key is absent
  EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / 16);
  EXPECT_EQ(c.sliding_window, 4096);
  for (int l = 0; l < 26; ++l) EXPECT_EQ(c.is_sliding(l), l % 2 == 0) << l;  // even layers slide
  EXPECT_EQ(c.layer_rope_theta(0), 10000.0);
  const auto m = by_name(expected_tensors(c));
  EXPECT_EQ(m.at("model.layers.25.pre_feedforward_layernorm.weight"), (Shape{2304}));
  EXPECT_EQ(m.at("model.layers.25.post_feedforward_layernorm.weight"), (Shape{2304}));
  EXPECT_EQ(m.count("lm_head.weight"), 0u);
  double sum = 0;
  for (const auto& t : expected_tensors(c)) sum += static_cast<double>(shape_numel(t.shape));
  EXPECT_EQ(parameter_count(c), sum);
  // Absent soft-caps take transformers' Gemma 2 defaults; null switches them off.
  std::string text = with_replaced(kGemma2, R"("attn_logit_softcapping": 50.0,)", "");
  text = with_replaced(text, R"("final_logit_softcapping": 30.0,)", R"("final_logit_softcapping": null,)");
  const ModelConfig d = parse_hf_config(write_config("gemma2_caps", text));
  EXPECT_EQ(d.attn_logit_softcapping, 50.0);
  EXPECT_EQ(d.final_logit_softcapping, 0.0);
  // sliding_window null: no layer slides.
  const ModelConfig e = parse_hf_config(
      write_config("gemma2_nowin", with_replaced(kGemma2, R"("sliding_window": 4096)", R"("sliding_window": null)")));
  EXPECT_EQ(e.sliding_window, 0);
  EXPECT_FALSE(e.is_sliding(0));
}

// transformers' Gemma 2 and 3 read hidden_activation alone (default gelu_pytorch_tanh), and Gemma 3 applies no
// attention soft-cap whatever attn_logit_softcapping says (a hunt against transformers, 2026-11-29).
TEST(HfConfig, GemmaReadsWhatTransformersReads) {
  const ModelConfig g2 = parse_hf_config(write_config(
      "gemma2_act", with_replaced(kGemma2, R"("hidden_activation": "gelu_pytorch_tanh",)", R"("hidden_act": "silu",)")));
  EXPECT_EQ(g2.hidden_act, "gelu_pytorch_tanh");
  const ModelConfig g3 = parse_hf_config(write_config(
      "gemma3_caps", with_replaced(kGemma3, R"("attn_logit_softcapping": null,)", R"("attn_logit_softcapping": 2.0,)")));
  EXPECT_EQ(g3.attn_logit_softcapping, 0.0);
  const ModelConfig g3a = parse_hf_config(write_config(
      "gemma3_act", with_replaced(kGemma3, R"("hidden_activation": "gelu_pytorch_tanh",)", R"("hidden_act": "silu",)")));
  EXPECT_EQ(g3a.hidden_act, "gelu_pytorch_tanh");
}

TEST(HfConfig, Gemma3) {
  const ModelConfig c = parse_hf_config(write_config("gemma3", kGemma3));
  EXPECT_EQ(c.arch, Architecture::Gemma3);
  EXPECT_TRUE(c.gemma && c.qk_norm && c.tie_word_embeddings);
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_EQ(c.final_logit_softcapping, 0.0);
  for (int l = 0; l < 34; ++l) EXPECT_EQ(c.is_sliding(l), (l + 1) % 6 != 0) << l;  // 5 local per global
  EXPECT_EQ(c.layer_window(0), 1024);
  EXPECT_EQ(c.layer_window(5), 0);
  EXPECT_EQ(c.layer_rope_theta(0), 10000.0);
  EXPECT_EQ(c.layer_rope_theta(5), 1e6);
  EXPECT_FALSE(c.layer_rope_scaling(4).has_value());
  ASSERT_TRUE(c.layer_rope_scaling(11).has_value());
  EXPECT_EQ(c.layer_rope_scaling(11)->factor, 8.0);
  const auto m = by_name(expected_tensors(c));
  EXPECT_EQ(m.at("model.layers.0.self_attn.q_norm.weight"), (Shape{256}));
  EXPECT_EQ(m.at("model.layers.0.pre_feedforward_layernorm.weight"), (Shape{2560}));
  // transformers 5.x: rope_parameters by layer type, layer_types.
  const ModelConfig v5 = parse_hf_config(write_config("gemma3_v5", R"({
    "architectures": ["Gemma3ForCausalLM"], "head_dim": 8, "hidden_size": 16, "intermediate_size": 32,
    "max_position_embeddings": 64, "num_attention_heads": 2, "num_hidden_layers": 3, "rms_norm_eps": 1e-6,
    "vocab_size": 10, "sliding_window": 2, "layer_types": ["full_attention", "sliding_attention", "full_attention"],
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}})"));
  EXPECT_EQ(v5.layer_sliding, (std::vector<bool>{false, true, false}));
  EXPECT_EQ(v5.layer_rope_theta(0), 5e5);
  EXPECT_EQ(v5.layer_rope_theta(1), 2e4);
  EXPECT_FALSE(v5.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(v5.attention_scale(), 1.0 / 16);  // query_pre_attn_scalar's default, 256
}

TEST(HfConfig, Mistral) {
  const ModelConfig c = parse_hf_config(write_config("mistral", kMistral));
  EXPECT_EQ(c.arch, Architecture::Mistral);
  EXPECT_FALSE(c.gemma || c.qk_norm || c.qkv_bias || c.o_bias || c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.sliding_window, 4096);
  for (int l = 0; l < 32; ++l) EXPECT_TRUE(c.is_sliding(l));
  EXPECT_EQ(c.attn_logit_softcapping, 0.0);
  const ModelConfig n = parse_hf_config(
      write_config("mistral_nowin", with_replaced(kMistral, R"("sliding_window": 4096)", R"("sliding_window": null)")));
  EXPECT_EQ(n.sliding_window, 0);
  EXPECT_FALSE(n.is_sliding(0));
  EXPECT_EQ(expected_tensors(n).size(), expected_tensors(c).size());
}

// The message of parsing this config text, checked to start with the file's name.
std::string config_error(const std::string& name, const std::string& text) {
  const std::string p = write_config(name, text);
  const std::string msg = test::error_of([&] { parse_hf_config(p); });
  EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  return msg.substr(std::min(msg.size(), p.size() + 2));
}

TEST(HfConfigErrors, FileAndJson) {
  const std::string missing = ::testing::TempDir() + "mgrl_hf_missing/config.json";
  EXPECT_EQ(test::error_of([&] { parse_hf_config(missing); }).rfind(missing + ": cannot open", 0), 0u);
  EXPECT_EQ(config_error("badjson", "{\"vocab_size\": 1,").rfind("invalid JSON: ", 0), 0u);
  EXPECT_EQ(config_error("notobject", "[1]"), "not a JSON object");
}

TEST(HfConfigErrors, Architecture) {
  std::string text = kQwen2;
  text.replace(text.find("Qwen2ForCausalLM"), 16, "PhiForCausalLM");
  const std::string all = "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM, "
                          "Gemma3ForCausalLM, MistralForCausalLM, Gemma3ForConditionalGeneration (its language model)";
  EXPECT_EQ(config_error("phi", text), "unsupported architecture 'PhiForCausalLM' (supported: " + all + ")");
  EXPECT_EQ(config_error("noarch", llama_with("", "architectures")),
            "missing required key 'architectures' (one of " + all + ")");
  const std::map<std::string, Architecture> types{
      {"gemma2", Architecture::Gemma2}, {"gemma3_text", Architecture::Gemma3}, {"mistral", Architecture::Mistral}};
  for (const auto& [type, arch] : types) {
    const std::string extra = "\"head_dim\": 16, \"model_type\": \"" + type + "\"";
    EXPECT_EQ(parse_hf_config(write_config("mt_" + type, llama_with(extra, "architectures"))).arch, arch) << type;
  }
  // Without "architectures", model_type decides.
  EXPECT_EQ(parse_hf_config(write_config("modeltype", llama_with(R"("model_type": "qwen2")", "architectures"))).arch,
            Architecture::Qwen2);
  EXPECT_EQ(config_error("archtype", llama_with(R"("architectures": "LlamaForCausalLM")", "architectures")),
            "key 'architectures' must be a non-empty list of strings");
}

TEST(HfConfigErrors, MissingAndWrongKeys) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "rms_norm_eps", "max_position_embeddings"}) {
    EXPECT_EQ(config_error(std::string("missing_") + key, llama_with("", key)),
              std::string("missing required key '") + key + "'");
  }
  EXPECT_EQ(config_error("null_vocab", llama_with(R"("vocab_size": null)", "vocab_size")),
            "missing required key 'vocab_size'");
  EXPECT_EQ(config_error("str_hidden", llama_with(R"("hidden_size": "64")", "hidden_size")),
            "key 'hidden_size' must be an integer, not a string (\"64\")");
  EXPECT_EQ(config_error("float_layers", llama_with(R"("num_hidden_layers": 2.5)", "num_hidden_layers")),
            "key 'num_hidden_layers' must be an integer, not a number (2.5)");
  EXPECT_EQ(config_error("zero_heads", llama_with(R"("num_attention_heads": 0)", "num_attention_heads")),
            "key 'num_attention_heads' must be positive (got 0)");
  EXPECT_EQ(config_error("eps_str", llama_with(R"("rms_norm_eps": "1e-6")", "rms_norm_eps")),
            "key 'rms_norm_eps' must be a number, not a string (\"1e-6\")");
  EXPECT_EQ(config_error("tie_int", llama_with(R"("tie_word_embeddings": 1)")),
            "key 'tie_word_embeddings' must be true or false, not a number (1)");
  EXPECT_EQ(config_error("kv", llama_with(R"("num_key_value_heads": 3)")),
            "key 'num_key_value_heads' must divide num_attention_heads (4), got 3");
  EXPECT_EQ(config_error("headdiv", llama_with(R"("num_attention_heads": 5)", "num_attention_heads")),
            "key 'num_attention_heads' must divide hidden_size (64) when there is no head_dim");
  EXPECT_EQ(config_error("act", llama_with(R"("hidden_act": "gelu")")),
            "key 'hidden_act' is 'gelu'; only 'silu' and 'gelu_pytorch_tanh' are supported");
  EXPECT_EQ(config_error("eos", llama_with(R"("eos_token_id": [1, "x"])")),
            "key 'eos_token_id' must be an integer or a list of integers");
  EXPECT_EQ(config_error("mlpbias", llama_with(R"("mlp_bias": true)")),
            "key 'mlp_bias' is true: MLP biases are not supported");
  std::string q3 = kQwen3;
  q3.erase(q3.find("\"head_dim\": 128,"), 16);
  EXPECT_EQ(config_error("qwen3_nohd", q3), "missing required key 'head_dim' (Qwen3 configs give it)");
  std::string q2 = kQwen2;
  q2.replace(q2.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  EXPECT_EQ(config_error("sliding", q2), "key 'use_sliding_window' is true: sliding-window attention is not supported");
}

TEST(HfConfigErrors, GemmaAndWindows) {
  EXPECT_EQ(config_error("g2_nohd", with_replaced(kGemma2, R"("head_dim": 256,)", "")),
            "missing required key 'head_dim' (Gemma configs give it)");
  EXPECT_EQ(config_error("g2_cap", with_replaced(kGemma2, R"("attn_logit_softcapping": 50.0)",
                                                 R"("attn_logit_softcapping": -1)")),
            "key 'attn_logit_softcapping' must be positive or null");
  EXPECT_EQ(config_error("g2_capstr", with_replaced(kGemma2, R"("final_logit_softcapping": 30.0)",
                                                    R"("final_logit_softcapping": "30")")),
            "key 'final_logit_softcapping' must be a number, not a string (\"30\")");
  EXPECT_EQ(config_error("g2_act", with_replaced(kGemma2, R"("hidden_activation": "gelu_pytorch_tanh")",
                                                 R"("hidden_activation": "relu")")),
            "key 'hidden_activation' is 'relu'; only 'silu' and 'gelu_pytorch_tanh' are supported");
  EXPECT_EQ(config_error("g2_win", with_replaced(kGemma2, R"("sliding_window": 4096)", R"("sliding_window": 4.5)")),
            "key 'sliding_window' must be a positive integer or null");
  EXPECT_EQ(config_error("g2_win0", with_replaced(kGemma2, R"("sliding_window": 4096)", R"("sliding_window": 0)")),
            "key 'sliding_window' must be positive or null");
  EXPECT_EQ(config_error("g2_bidi", with_replaced(kGemma2, R"("sliding_window": 4096)",
                                                  R"("sliding_window": 4096, "use_bidirectional_attention": true)")),
            "key 'use_bidirectional_attention' is true: only causal attention is supported");
  EXPECT_EQ(config_error("g2_types", with_replaced(kGemma2, R"("sliding_window": 4096)",
                                                   R"("sliding_window": 4096, "layer_types": ["full_attention"])")),
            "key 'layer_types' must be a list of num_hidden_layers (26) strings");
  std::string types = R"("layer_types": [)";
  for (int i = 0; i < 26; ++i) types += i ? R"(, "full_attention")" : R"("chunked_attention")";
  EXPECT_EQ(config_error("g2_type", with_replaced(kGemma2, R"("sliding_window": 4096)",
                                                  R"("sliding_window": 4096, )" + types + "]")),
            "key 'layer_types' entry 0 is a string (\"chunked_attention\"); only 'sliding_attention' and "
            "'full_attention' are supported");
  EXPECT_EQ(config_error("g3_local", R"({"architectures": ["Gemma3ForCausalLM"], "head_dim": 8, "hidden_size": 16,
    "intermediate_size": 32, "max_position_embeddings": 64, "num_attention_heads": 2, "num_hidden_layers": 3,
    "rms_norm_eps": 1e-6, "vocab_size": 10, "rope_parameters": {"full_attention": {"rope_type": "default"},
    "sliding_attention": {"rope_type": "linear", "factor": 2.0}}})"),
            "key 'rope_parameters.sliding_attention.rope_type' must be 'default': mgrl does not scale the RoPE of "
            "sliding layers");
}

// Gemma3ForConditionalGeneration (or model_type gemma3): its language model, from text_config over Gemma3TextConfig's
// defaults (transformers 5.24's, for what a Hub text_config leaves out), the dtype and eos ids of the top level;
// errors name text_config's keys.
TEST(HfConfig, Gemma3VisionLanguageReadsItsLanguageModel) {
  const ModelConfig d = parse_hf_config(write_config("g3vl_default", R"({"architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3", "torch_dtype": "bfloat16"})"));
  EXPECT_EQ(d.vlm_architecture, "Gemma3ForConditionalGeneration");
  EXPECT_EQ(d.arch, Architecture::Gemma3);
  EXPECT_EQ(d.vocab_size, 262208);
  EXPECT_EQ(d.hidden_size, 2304);
  EXPECT_EQ(d.intermediate_size, 9216);
  EXPECT_EQ(d.num_hidden_layers, 26);
  EXPECT_EQ(d.num_attention_heads, 8);
  EXPECT_EQ(d.num_key_value_heads, 4);
  EXPECT_EQ(d.head_dim, 256);
  EXPECT_EQ(d.rms_norm_eps, 1e-6);
  EXPECT_EQ(d.max_position_embeddings, 131072);
  EXPECT_EQ(d.query_pre_attn_scalar, 256);
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.rope_theta, 1000000.0);
  EXPECT_EQ(d.rope_local_theta, 10000.0);
  EXPECT_TRUE(d.tie_word_embeddings);
  EXPECT_EQ(d.torch_dtype, "bfloat16");
  EXPECT_EQ(d.final_logit_softcapping, 0.0);
  EXPECT_EQ(d.layer_sliding[4], true);
  EXPECT_EQ(d.layer_sliding[5], false);
  // google/gemma-3-4b-it's config.json, as on the Hub (its vision_config left out)
  const ModelConfig g = parse_hf_config(write_config("g3vl_4b", R"({"architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
      "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0"})"));
  EXPECT_EQ(g.hidden_size, 2560);
  EXPECT_EQ(g.num_hidden_layers, 34);
  EXPECT_EQ(g.sliding_window, 1024);
  ASSERT_TRUE(g.rope_scaling.has_value());
  EXPECT_EQ(g.rope_scaling->factor, 8.0);
  EXPECT_EQ(g.eos_token_ids, (std::vector<std::int64_t>{1, 106}));
  const ModelConfig bare = parse_hf_config(write_config("g3vl_mt", R"({"model_type": "gemma3", "text_config": {}})"));
  EXPECT_EQ(bare.vlm_architecture, "Gemma3ForConditionalGeneration");
  EXPECT_EQ(config_error("g3vl_bad", R"({"architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {"rms_norm_eps": "small"}})"),
            "key 'text_config.rms_norm_eps' must be a number, not a string (\"small\")");
  EXPECT_EQ(config_error("g3vl_type", R"({"architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {"model_type": "llama"}})"),
            "key 'text_config.model_type' is a string (\"llama\"); a Gemma3ForConditionalGeneration's language model "
            "is gemma3_text");
  EXPECT_EQ(config_error("g3vl_list", R"({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": [1]})"),
            "key 'text_config' must be an object, not a list");
  // As transformers 5.24: no final soft-cap (its Gemma3ForConditionalGeneration applies none), the top level's
  // tie_word_embeddings (Gemma3Config(tie_word_embeddings=False) writes text_config's true beside it), and errors of
  // top-level keys name them as they stand.
  const ModelConfig v = parse_hf_config(write_config("g3vl_tf5", R"({"architectures": ["Gemma3ForConditionalGeneration"],
    "tie_word_embeddings": false, "text_config": {"final_logit_softcapping": 2.0, "tie_word_embeddings": true}})"));
  EXPECT_EQ(v.final_logit_softcapping, 0.0);
  EXPECT_FALSE(v.tie_word_embeddings);
  EXPECT_EQ(config_error("g3vl_tie", R"({"architectures": ["Gemma3ForConditionalGeneration"], "tie_word_embeddings": "yes"})"),
            "key 'tie_word_embeddings' must be true or false, not a string (\"yes\")");
}

TEST(HfConfigErrors, RopeScaling) {
  EXPECT_EQ(config_error("longrope", llama_with(R"("rope_scaling": {"rope_type": "longrope", "factor": 4.0})")),
            "unsupported rope_scaling type 'longrope' in key 'rope_scaling' (supported: llama3, linear, yarn, dynamic, "
            "or none)");
  EXPECT_EQ(config_error("v5su", llama_with(R"("rope_parameters": {"rope_type": "su", "rope_theta": 1e4})")),
            "unsupported rope_scaling type 'su' in key 'rope_parameters' (supported: llama3, linear, yarn, dynamic, or "
            "none)");
  // yarn needs a factor, as transformers does (its null means max_position_embeddings / original).
  EXPECT_EQ(config_error("v5yarn", llama_with(R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4})")),
            "missing required key 'rope_parameters.factor'");
  EXPECT_EQ(config_error("yarn_af", llama_with(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0,
      "attention_factor": -1})")),
            "key 'rope_scaling.attention_factor' must be positive");
  EXPECT_EQ(config_error("yarn_trunc", llama_with(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0,
      "truncate": 1})")),
            "key 'rope_scaling.truncate' must be true or false, not a number (1)");
  // dynamic NTK is the plain RoPE up to max_position_embeddings (mgrl's limit on every sequence): no scaling.
  EXPECT_FALSE(parse_hf_config(write_config("dynamic", llama_with(R"("rope_scaling": {"type": "dynamic",
      "factor": 2.0})"))).rope_scaling.has_value());
  EXPECT_EQ(config_error("linear0", llama_with(R"("rope_scaling": {"type": "linear", "factor": 0})")),
            "key 'rope_scaling.factor' must be positive");
  const ModelConfig lin = parse_hf_config(write_config("linear", llama_with(R"("rope_scaling": {"type": "linear",
      "factor": 2.0})")));
  ASSERT_TRUE(lin.rope_scaling.has_value());
  EXPECT_EQ(lin.rope_scaling->rope_type, "linear");
  EXPECT_DOUBLE_EQ(lin.rope_scaling->factor, 2.0);
  EXPECT_EQ(config_error("notype", llama_with(R"("rope_scaling": {"factor": 4.0})")),
            "key 'rope_scaling' has no 'rope_type'");
  EXPECT_EQ(config_error("nofactor", llama_with(R"("rope_scaling": {"rope_type": "llama3", "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})")),
            "missing required key 'rope_scaling.factor'");
  EXPECT_EQ(config_error("ropestr", llama_with(R"("rope_scaling": "llama3")")),
            "key 'rope_scaling' must be an object or null, not a string (\"llama3\")");
  EXPECT_EQ(config_error("theta", llama_with(R"("rope_theta": "big")")),
            "key 'rope_theta' must be a number, not a string (\"big\")");
}

// ---- the fixture models written by transformers (tests/data/models/<name>), when present ----

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

class FixtureModel : public ::testing::TestWithParam<const char*> {};

TEST_P(FixtureModel, HasEveryExpectedTensor) {
  const std::string dir = std::string(MGRL_TEST_DATA_DIR) + "/models/" + GetParam();
  if (!is_dir(dir)) GTEST_SKIP() << dir << " is absent";
  const ModelConfig c = parse_hf_config(dir + "/config.json");
  const SafetensorsModel model(dir);
  const auto expected = expected_tensors(c);
  std::set<std::string> names;
  for (const TensorSpec& t : expected) {
    names.insert(t.name);
    const TensorInfo* info = model.find(t.name);
    if (!info) {
      ADD_FAILURE() << dir << ": tensor '" << t.name << "' not found";
      continue;
    }
    EXPECT_EQ(info->shape, t.shape) << t.name;
    EXPECT_TRUE(dtype_is_float(info->dtype)) << t.name;
    EXPECT_EQ(static_cast<std::size_t>(info->numel()), to_f32(*info).size());
  }
  // And nothing the model would not use.
  for (const std::string& n : model.names()) EXPECT_TRUE(names.count(n)) << "unexpected tensor " << n;

  // The same config in the transformers 4.x layout (rope_theta/rope_scaling/torch_dtype), when there is one.
  const std::string v4 = dir + "/config.transformers4.json";
  if (std::ifstream(v4).good()) {
    const ModelConfig o = parse_hf_config(v4);
    EXPECT_EQ(o.arch, c.arch);
    EXPECT_EQ(o.head_dim, c.head_dim);
    EXPECT_EQ(o.num_key_value_heads, c.num_key_value_heads);
    EXPECT_EQ(o.rope_theta, c.rope_theta);
    EXPECT_EQ(o.rope_scaling.has_value(), c.rope_scaling.has_value());
    if (o.rope_scaling && c.rope_scaling) {
      EXPECT_EQ(o.rope_scaling->factor, c.rope_scaling->factor);
      EXPECT_EQ(o.rope_scaling->original_max_position_embeddings, c.rope_scaling->original_max_position_embeddings);
    }
    EXPECT_EQ(o.torch_dtype, c.torch_dtype);
    EXPECT_EQ(o.tie_word_embeddings, c.tie_word_embeddings);
    EXPECT_EQ(o.eos_token_ids, c.eos_token_ids);
  }

  // Our writer reproduces the tensors of a file written by the safetensors library.
  const SafetensorsFile original(dir + "/model.safetensors");
  std::vector<TensorToWrite> out;
  for (const TensorInfo& t : original.tensors()) out.push_back({t.name, t.dtype, t.shape, t.data});
  const std::string copy = ::testing::TempDir() + "mgrl_hf_copy_" + GetParam() + ".safetensors";
  write_safetensors(copy, out, original.metadata());
  const SafetensorsFile again(copy);
  ASSERT_EQ(again.tensors().size(), original.tensors().size());
  for (const TensorInfo& t : original.tensors()) {
    const TensorInfo& u = again.get(t.name);
    EXPECT_EQ(u.shape, t.shape);
    ASSERT_EQ(u.nbytes, t.nbytes);
    EXPECT_EQ(std::memcmp(u.data, t.data, t.nbytes), 0) << t.name;
  }
  EXPECT_EQ(again.metadata(), original.metadata());

  // The other safetensors files beside it (PEFT adapters, reference outputs) read as well.
  for (const char* other : {"/adapter_model.safetensors", "/reference.safetensors"}) {
    if (std::ifstream(dir + other).good()) {
      EXPECT_FALSE(SafetensorsFile(dir + other).tensors().empty()) << other;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, FixtureModel,
                         ::testing::Values("llama_gqa", "qwen2_bias_tied", "qwen3_qknorm", "gemma2_softcap",
                                           "gemma3_text", "mistral_window", "qwen3_yarn"));

TEST(FixtureModelFacts, WhatEachFixtureExercises) {
  const std::string base = std::string(MGRL_TEST_DATA_DIR) + "/models/";
  int found = 0;
  if (is_dir(base + "llama_gqa")) {
    const ModelConfig c = parse_hf_config(base + "llama_gqa/config.json");
    EXPECT_EQ(c.arch, Architecture::Llama);
    EXPECT_LT(c.num_key_value_heads, c.num_attention_heads);
    EXPECT_TRUE(c.rope_scaling.has_value());
    ++found;
  }
  if (is_dir(base + "qwen2_bias_tied")) {
    const ModelConfig c = parse_hf_config(base + "qwen2_bias_tied/config.json");
    EXPECT_EQ(c.arch, Architecture::Qwen2);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_TRUE(c.qkv_bias);
    ++found;
  }
  if (is_dir(base + "qwen3_qknorm")) {
    const ModelConfig c = parse_hf_config(base + "qwen3_qknorm/config.json");
    EXPECT_EQ(c.arch, Architecture::Qwen3);
    EXPECT_TRUE(c.qk_norm);
    ++found;
  }
  if (is_dir(base + "gemma2_softcap")) {
    const ModelConfig c = parse_hf_config(base + "gemma2_softcap/config.json");
    EXPECT_EQ(c.arch, Architecture::Gemma2);
    EXPECT_TRUE(c.gemma && c.tie_word_embeddings);
    EXPECT_EQ(c.hidden_act, "gelu_pytorch_tanh");
    EXPECT_EQ(c.query_pre_attn_scalar, 24);
    EXPECT_EQ(c.attn_logit_softcapping, 1.5);
    EXPECT_EQ(c.final_logit_softcapping, 2.5);
    EXPECT_EQ(c.sliding_window, 4);
    EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, false}));
    EXPECT_EQ(c.head_dim, 16);
    ++found;
  }
  if (is_dir(base + "gemma3_text")) {
    for (const char* file : {"config.json", "config.transformers4.json"}) {
      const ModelConfig c = parse_hf_config(base + "gemma3_text/" + file);
      EXPECT_EQ(c.arch, Architecture::Gemma3) << file;
      EXPECT_TRUE(c.gemma && c.qk_norm && c.tie_word_embeddings) << file;
      EXPECT_EQ(c.attn_logit_softcapping, 0) << file;
      EXPECT_EQ(c.final_logit_softcapping, 0) << file;
      EXPECT_EQ(c.sliding_window, 3) << file;
      EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, true, true, true, true, false, true})) << file;
      EXPECT_EQ(c.layer_rope_theta(0), 10000.0) << file;
      EXPECT_EQ(c.layer_rope_theta(5), 1e6) << file;
      EXPECT_FALSE(c.layer_rope_scaling(0).has_value()) << file;
      ASSERT_TRUE(c.layer_rope_scaling(5).has_value()) << file;
      EXPECT_EQ(c.layer_rope_scaling(5)->rope_type, "linear") << file;
      EXPECT_EQ(c.layer_rope_scaling(5)->factor, 4.0) << file;
      EXPECT_EQ(c.layer_window(6), 3) << file;
      EXPECT_EQ(c.layer_window(5), 0) << file;
      EXPECT_DOUBLE_EQ(c.attention_scale(), 1 / std::sqrt(12.0)) << file;
    }
    ++found;
  }
  if (is_dir(base + "mistral_window")) {
    const ModelConfig c = parse_hf_config(base + "mistral_window/config.json");
    EXPECT_EQ(c.arch, Architecture::Mistral);
    EXPECT_FALSE(c.gemma || c.qk_norm || c.tie_word_embeddings || c.qkv_bias);
    EXPECT_EQ(c.sliding_window, 5);
    EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, true}));
    EXPECT_EQ(c.head_dim, 10);
    EXPECT_DOUBLE_EQ(c.attention_scale(), 1 / std::sqrt(10.0));
    ++found;
  }
  if (is_dir(base + "qwen3_yarn")) {
    for (const char* file : {"config.json", "config.transformers4.json"}) {
      const ModelConfig c = parse_hf_config(base + "qwen3_yarn/" + file);
      EXPECT_EQ(c.arch, Architecture::Qwen3) << file;
      ASSERT_TRUE(c.rope_scaling.has_value()) << file;
      EXPECT_EQ(c.rope_scaling->rope_type, "yarn") << file;
      EXPECT_EQ(c.rope_scaling->factor, 4.0) << file;
      EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 32) << file;
      EXPECT_EQ(c.rope_scaling->beta_fast, 32.0) << file;
      EXPECT_EQ(c.rope_scaling->beta_slow, 1.0) << file;
      EXPECT_TRUE(c.rope_scaling->truncate) << file;
      EXPECT_DOUBLE_EQ(c.layer_rope_attention_factor(1), 0.1 * std::log(4.0) + 1.0) << file;
    }
    ++found;
  }
  if (found == 0) GTEST_SKIP() << base << " holds no fixture models";
}

// llama3 and yarn: the original context is the config's top-level original_max_position_embeddings, else the dict's,
// else max_position_embeddings (transformers' standardize_rope_params).
TEST(HfConfig, RopeOriginalContextAsTransformersReadsIt) {
  const std::string l3 = R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0)";
  EXPECT_EQ(parse_hf_config(write_config("orig_none", llama_with(l3 + "}")))
                .rope_scaling->original_max_position_embeddings,
            512);
  EXPECT_EQ(parse_hf_config(write_config("orig_dict", llama_with(l3 + R"(, "original_max_position_embeddings": 64})")))
                .rope_scaling->original_max_position_embeddings,
            64);
  EXPECT_EQ(parse_hf_config(write_config("orig_top", llama_with(l3 + R"(, "original_max_position_embeddings": 64},
      "original_max_position_embeddings": 128)"))).rope_scaling->original_max_position_embeddings,
            128);
  const ModelConfig y = parse_hf_config(write_config("yarn_null", llama_with(R"("rope_scaling": {"rope_type": "yarn",
      "factor": null, "original_max_position_embeddings": 128, "beta_fast": null, "mscale": 1, "mscale_all_dim": 0})")));
  EXPECT_EQ(y.rope_scaling->factor, 4.0);  // 512 / 128
  EXPECT_EQ(y.rope_scaling->beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(y.rope_scaling->attention_factor, 0.1 * std::log(4.0) + 1.0);  // mscale_all_dim 0: not used
  EXPECT_EQ(y.layer_rope_attention_factor(0), y.rope_scaling->attention_factor);
}

TEST(HfConfig, ParameterCountIsTheSumOfTheTensors) {
  for (const std::string& extra : {std::string(""), std::string(R"("tie_word_embeddings": true)"),
                                   std::string(R"("attention_bias": true, "num_key_value_heads": 2)")}) {
    const ModelConfig c = parse_hf_config(write_config("count", llama_with(extra)));
    double sum = 0;
    for (const auto& t : expected_tensors(c)) sum += static_cast<double>(shape_numel(t.shape));
    EXPECT_EQ(parameter_count(c), sum) << extra;
  }
}

TEST(HfConfig, SizesAreBoundedBeforeAnythingIsBuilt) {
  // A damaged config.json must not make mgrl loop over 1e8 layers or allocate terabytes: one line naming the key.
  const auto error = [](const std::string& name, const std::string& extra, const std::string& drop) {
    const std::string path = write_config(name, llama_with(extra, drop));
    return test::error_of([&] { parse_hf_config(path); });
  };
  std::string msg = error("layers", R"("num_hidden_layers": 100000000)", "num_hidden_layers");
  EXPECT_NE(msg.find("key 'num_hidden_layers' is 100000000, more than mgrl supports (4096)"), std::string::npos) << msg;
  msg = error("vocab", R"("vocab_size": 4000000000)", "vocab_size");
  EXPECT_NE(msg.find("key 'vocab_size' is 4000000000, more than mgrl supports"), std::string::npos) << msg;
  msg = error("heads", R"("num_attention_heads": 100000)", "num_attention_heads");
  EXPECT_NE(msg.find("key 'num_attention_heads' is 100000"), std::string::npos) << msg;
  msg = error("memory", R"("hidden_size": 1000000, "intermediate_size": 4000000, "num_hidden_layers": 4000)",
              "num_hidden_layers");
  EXPECT_TRUE(msg.empty() || msg.find("more than this machine's memory") != std::string::npos) << msg;
  EXPECT_FALSE(msg.empty()) << "a model of 4e16 parameters was accepted";
  EXPECT_GT(host_memory_bytes(), 0u);
}

// generation_config.json beside config.json: its eos_token_id (transformers' generate reads it) ends completions too,
// after config.json's, each id once; an id outside the vocabulary there is named by that file. (Read since
// 2026-11-28: GRPO, PPO and the held-out accuracies stopped at the tokenizer's EOS alone.)
TEST(HfConfig, GenerationConfigEosIds) {
  const std::string dir = test::temp_path("generation_config_dir");
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/config.json", std::ios::trunc) << kQwen2;
  std::ofstream(dir + "/generation_config.json", std::ios::trunc) << R"({"eos_token_id": [151645, 151643]})";
  EXPECT_EQ(parse_hf_config(dir + "/config.json").eos_token_ids, (std::vector<std::int64_t>{151643, 151645}));
  std::ofstream(dir + "/generation_config.json", std::ios::trunc) << R"({"eos_token_id": 999999})";
  const std::string msg = test::error_of([&] { parse_hf_config(dir + "/config.json"); });
  EXPECT_NE(msg.find("generation_config.json: key 'eos_token_id' holds 999999, outside the vocabulary"),
            std::string::npos)
      << msg;
  std::remove((dir + "/generation_config.json").c_str());
  EXPECT_EQ(parse_hf_config(dir + "/config.json").eos_token_ids, std::vector<std::int64_t>{151643});
}

}  // namespace
}  // namespace mgrl::io
