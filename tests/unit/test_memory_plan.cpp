// test_memory_plan.cpp: the arithmetic of `mgrl plan` (model/memory_plan.h) against what the model really
// allocates (Transformer::activation_bytes, KvCache), the built-in shapes against the published parameter counts
// of those models, and the largest fitting micro-batch (monotone, consistent with the total).
#include <gtest/gtest.h>

#include <memory>

#include "core/error.h"
#include "io/model_shapes.h"
#include "kernels/ops.h"
#include "model/kv_cache.h"
#include "model/memory_plan.h"
#include "model/transformer.h"

namespace mgrl::model {
namespace {

const std::string kData = MGRL_TEST_DATA_DIR;

// Every model of tests/data/models (Llama GQA, Qwen2 with biases and tied embeddings, Qwen3 with q/k norms, Gemma 2
// and 3, Mistral with a window), with and without recompute, LoRA dropout and a subset of targets: the plan's arena
// (memory_plan's arena_bytes, from the config and the settings) is the count of the model built from them.
TEST(MemoryPlan, ArenaEqualsTheModelsOwnCount) {
  auto ops = kernels::make_cpu_ops();
  for (const char* name :
       {"llama_gqa", "qwen2_bias_tied", "qwen3_qknorm", "gemma2_softcap", "gemma3_text", "mistral_window", "qwen3_yarn"}) {
    const io::ModelConfig mc = io::parse_hf_config(kData + "/models/" + name + "/config.json");
    for (const bool recompute : {false, true})
      for (const double dropout : {0.0, 0.1})
        for (const bool all_targets : {true, false}) {
          Transformer net(mc, *ops, ModelOptions{false, recompute, false});
          LoraConfig lc;
          lc.r = 4;
          lc.dropout = dropout;
          if (!all_targets) lc.targets = {"q_proj", "v_proj", "down_proj"};
          net.add_lora(lc, 1);
          for (const int T : {1, 37, 128}) {
            const std::size_t head = ops->lm_head_scratch_bytes(static_cast<int>(mc.vocab_size));
            EXPECT_EQ(arena_bytes(mc, 4, &lc, recompute, true, static_cast<std::size_t>(T), head),
                      net.activation_bytes(T))
                << name << " recompute " << recompute << " dropout " << dropout << " T " << T;
          }
          EXPECT_EQ(lora_numel(mc, lc), net.lora()->numel()) << name;
        }
  }
}

// An NF4 base (the bitsandbytes-saved tiny Llama): the dequantization workspace the plan counts is the one the
// model allocates, and the NF4 bytes are those it holds.
TEST(MemoryPlan, Nf4WorkspaceAndBytesAsAllocated) {
  auto ops = kernels::make_cpu_ops();
  const std::string dir = kData + "/nf4/llama_nf4";
  const io::ModelConfig mc = io::parse_hf_config(dir + "/config.json");
  ModelOptions opts;
  opts.quantize = Quantize::Nf4;
  opts.quantize_double = mc.bnb4bit && mc.bnb4bit->double_quant;
  Transformer net(mc, *ops, opts);
  net.load_weights(dir);
  ASSERT_TRUE(net.definition().quantized());
  EXPECT_EQ(nf4_workspace_bytes(mc, 4), static_cast<double>(net.definition().nf4_workspace_bytes()));
  // The base as held (the NF4 projections' codes and absmax state, the rest dense) is the plan's NF4 count, within
  // the 16-byte alignment of each tensor's parts; dense it would be far more.
  const double held = base_weight_bytes(mc, 4, "nf4", opts.quantize_double, false, 1);
  EXPECT_NEAR(static_cast<double>(net.definition().base_bytes_held()), held, 0.01 * held);
  EXPECT_GT(base_weight_bytes(mc, 4, "none", false, false, 1), 2 * held);
}

// A sharded NF4 base on one process (one part): what it holds and its gather workspace are the plan's NF4 counts
// (base_weight_bytes, two layer_weight_bytes), within the 16-byte alignment of each tensor's NF4 bytes.
TEST(MemoryPlan, ShardedNf4BaseAsAllocated) {
  auto ops = kernels::make_cpu_ops();
  const std::string dir = kData + "/nf4/llama_nf4";
  const io::ModelConfig mc = io::parse_hf_config(dir + "/config.json");
  ModelOptions opts;
  opts.shard_base = true;
  Transformer net(mc, *ops, opts);
  net.load_weights(dir);
  const ModelDef& d = net.definition();
  ASSERT_TRUE(d.quantized() && d.sharded());
  const double held = base_weight_bytes(mc, 4, "nf4", true, true, 1);
  const double layer = layer_weight_bytes(mc, 4, "nf4", true);
  EXPECT_NEAR(static_cast<double>(d.base_bytes_held()), held, 0.01 * held);
  EXPECT_NEAR(static_cast<double>(d.gather_workspace_bytes()), 2 * layer, 0.01 * 2 * layer);
  // dense projections would be 8 times the NF4 bytes
  EXPECT_LT(static_cast<double>(d.gather_workspace_bytes()), 2 * layer_weight_bytes(mc, 4, "none", true) / 4);
}

TEST(MemoryPlan, KvCacheAndHeadScratchAsAllocated) {
  auto ops = kernels::make_cpu_ops();
  const io::ModelConfig mc = io::parse_hf_config(kData + "/models/llama_gqa/config.json");
  const KvCache cache(mc, *ops, 6, 40, 17, 8);
  EXPECT_EQ(kv_cache_bytes(mc, 4, 6, 40, 17, 8), cache.bytes() + 6 * 5 * sizeof(std::int32_t));
  EXPECT_EQ(lm_head_scratch_bytes(false, 4, mc.vocab_size), ops->lm_head_scratch_bytes(static_cast<int>(mc.vocab_size)));
  // CUDA: 1024 rows for V = 152k (kernels/cuda/README.md: 933 MB), fewer rows when a 1024-row chunk passes 1 GiB.
  EXPECT_EQ(lm_head_scratch_bytes(true, 2, 151936), std::size_t{1024} * 151936 * 6);
  EXPECT_EQ(lm_head_scratch_bytes(true, 2, 262144), std::size_t{512} * 262144 * 6);
}

// The shapes' parameter counts are those the model cards and safetensors indexes publish: a wrong hidden size,
// intermediate size, head count, vocabulary or tie flag in the table changes them.
TEST(ModelShapes, PublishedParameterCounts) {
  const std::pair<const char*, double> published[] = {
      {"llama-3.1-8b", 8030261248.0},  {"llama-3.1-70b", 70553706496.0}, {"llama-3.2-1b", 1235814400.0},
      {"qwen2.5-0.5b", 494032768.0},   {"qwen2.5-1.5b", 1543714304.0},   {"qwen2.5-7b", 7615616512.0},
      {"qwen2.5-32b", 32763876352.0},
  };
  for (const auto& [name, count] : published) EXPECT_EQ(io::parameter_count(io::model_shape(name)), count) << name;
  for (const auto& name : io::model_shape_names()) {
    const io::ModelConfig c = io::model_shape(name);
    EXPECT_EQ(c.num_attention_heads % c.num_key_value_heads, 0) << name;
    EXPECT_GT(c.head_dim, 0) << name;
  }
}

TEST(ModelShapes, UnknownNameListsTheKnownOnes) {
  try {
    io::model_shape("llama-3.1-7b");
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.shape"), std::string::npos) << m;
    EXPECT_NE(m.find("'llama-3.1-7b'"), std::string::npos) << m;
    EXPECT_NE(m.find("llama-3.1-70b"), std::string::npos) << m;
    EXPECT_NE(m.find("qwen2.5-32b"), std::string::npos) << m;
  }
}

// generate.merge_lora's merged copy: each adapted projection once more in the storage dtype. Qwen2.5-0.5B in bf16
// (every projection's bytes a multiple of 256: no padding): q, o 896 x 896, k, v 128 x 896, gate, up, down 4864 x 896,
// 24 layers = 715653120 bytes (0.67 GiB); q and v only: 44040192. The plan counts it when asked, and only then.
TEST(MemoryPlan, MergedLoraCopy) {
  const io::ModelConfig c = io::model_shape("qwen2.5-0.5b");
  LoraConfig all;
  EXPECT_EQ(InferenceEngine::merged_bytes(c, 2, all), std::size_t{715653120});
  LoraConfig qv;
  qv.targets = {"q_proj", "v_proj"};
  EXPECT_EQ(InferenceEngine::merged_bytes(c, 2, qv), std::size_t{44040192});
  PlanInput in;
  in.model = c;
  in.generate = true;
  const double without = memory_plan(in).total;
  in.merged_lora = true;
  const MemoryPlan with = memory_plan(in);
  EXPECT_DOUBLE_EQ(with.total - without, 715653120.0);
  bool named = false;
  for (const auto& p : with.parts) named = named || (p.name == "merged LoRA weights" && p.bytes == 715653120.0);
  EXPECT_TRUE(named);
  in.lora = false;  // full fine-tuning: no adapter, nothing merged
  in.full_finetune = true;
  const double full = memory_plan(in).total;
  in.merged_lora = false;
  EXPECT_EQ(memory_plan(in).total, full);
}

PlanInput gpu_plan(const std::string& shape, bool recompute) {
  PlanInput in;
  in.model = io::model_shape(shape);
  in.cuda = true;
  in.storage = 2;
  in.lora_cfg.r = 16;
  in.recompute = recompute;
  in.runtime_bytes = 0.5 * (1 << 30);
  return in;
}

// The largest fitting micro-batch grows with the budget, fits it, and one token more does not.
TEST(MemoryPlan, LargestFittingMicroBatchIsMonotoneAndConsistent) {
  for (const bool recompute : {false, true}) {
    const PlanInput in = gpu_plan("qwen2.5-7b", recompute);
    std::int64_t last = 0;
    for (double gib = 16; gib <= 160; gib += 8) {
      const double budget = gib * (1 << 30);
      const std::int64_t best = largest_fitting_tokens(in, budget, std::int64_t{1} << 22);
      EXPECT_GE(best, last) << gib;
      last = best;
      PlanInput at = in;
      at.train_tokens = best;
      if (best > 0) {
        EXPECT_LE(memory_plan(at).total, budget) << gib;
      }
      at.train_tokens = best + 1;
      if (best < (std::int64_t{1} << 22)) {
        EXPECT_GT(memory_plan(at).total, budget) << gib;
      }
    }
    EXPECT_GT(last, 0);
  }
  // Recompute keeps less a token: more tokens fit the same budget.
  const double budget = 80.0 * (1 << 30);
  EXPECT_GT(largest_fitting_tokens(gpu_plan("qwen2.5-7b", true), budget, 1 << 22),
            2 * largest_fitting_tokens(gpu_plan("qwen2.5-7b", false), budget, 1 << 22));
  // A 70B model's bf16 weights alone exceed one 80 GB GPU: nothing fits.
  EXPECT_EQ(largest_fitting_tokens(gpu_plan("llama-3.1-70b", true), budget, 1 << 22), 0);
}

// NF4 stores 4 bits a weight plus the absmax of each block of 64 (fp32: 4.5 bits; double-quantized: about 4.127
// bits) for the seven linear layers; sharding divides the decoder layers over the ranks and adds a two-layer workspace
// (every layer with model.shard_base_keep).
TEST(MemoryPlan, QuantizedAndShardedBase) {
  const io::ModelConfig c = io::model_shape("llama-3.1-70b");
  const double dense = base_weight_bytes(c, 2, "none", true, false, 1);
  EXPECT_DOUBLE_EQ(dense, io::parameter_count(c) * 2);
  const double embed = 2.0 * static_cast<double>(c.vocab_size) * c.hidden_size * 2 + c.hidden_size * 2;
  const double norms = static_cast<double>(c.num_hidden_layers) * 2 * c.hidden_size * 2;
  const double linear = io::parameter_count(c) - embed / 2 - norms / 2;
  EXPECT_NEAR(base_weight_bytes(c, 2, "nf4", false, false, 1), linear * 4.5 / 8 + embed + norms, 1e3);
  EXPECT_NEAR(base_weight_bytes(c, 2, "nf4", true, false, 1), linear * (0.5 + (1 + 4.0 / 256) / 64) + embed + norms,
              1e3);
  // Sharded: the decoder layers over the ranks, the embeddings, LM head and final norm whole on each.
  const double rest = embed;  // the embeddings, the LM head and the final norm
  EXPECT_NEAR(base_weight_bytes(c, 2, "nf4", true, true, 4),
              (base_weight_bytes(c, 2, "nf4", true, false, 1) - rest) / 4 + rest, 1.0);
  EXPECT_NEAR(base_weight_bytes(c, 2, "none", true, true, 4),
              c.num_hidden_layers * layer_weight_bytes(c, 2, "none", true) / 4 + rest, 1.0);
  PlanInput in = gpu_plan("llama-3.1-70b", true);
  in.shard_base = true;
  in.ranks = 4;
  in.train_tokens = 2048;
  const MemoryPlan p = memory_plan(in);
  bool workspace = false;
  for (const auto& part : p.parts)
    if (part.name == "gather workspace") {
      workspace = true;
      EXPECT_DOUBLE_EQ(part.bytes, 2 * layer_weight_bytes(c, 2, "none", true));
    }
  EXPECT_TRUE(workspace);
  in.shard_keep = true;  // model.shard_base_keep: all layers gathered at the step's peak
  workspace = false;
  for (const auto& part : memory_plan(in).parts)
    if (part.name == "gather workspace") {
      workspace = true;
      EXPECT_DOUBLE_EQ(part.bytes, c.num_hidden_layers * layer_weight_bytes(c, 2, "none", true));
    }
  EXPECT_TRUE(workspace);
}

}  // namespace
}  // namespace mgrl::model
