// test_decode_fused.cpp: the inference engine really takes the fused inference ops (Ops::rope_kv_store,
// Ops::linear_group_forward, Ops::gated_mlp_forward, Ops::linear_residual_forward) when MGRL_DECODE_FUSED is not 0,
// and the separate ones when it is, while the training forward never takes them: the CPU backend wrapped in an Ops
// that counts the calls (tests/unit/counting_ops.h), on Llama-like, Qwen2 (q/k/v biases) and Gemma 3 (post-norms,
// GeGLU) fixtures, without an adapter, with one on every projection (unmerged and merged) and with one on q and v
// only. Registered twice in tests/CMakeLists.txt: the Fused test with the switch unset, the SwitchOff test with
// MGRL_DECODE_FUSED=0 (each fails in the other setting). On the CPU backend the fused ops are their composition, so
// this checks the wiring, not the kernels (tests/gpu does those).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "model/inference_engine.h"
#include "model/kv_cache.h"
#include "model/transformer.h"
#include "tests/unit/counting_ops.h"

namespace mgrl::model {
namespace {

const std::string kData = MGRL_TEST_DATA_DIR "/models/";

using test::CountingOps;

enum class Adapter { None, Unmerged, Merged, QvOnly };
const char* adapter_name(Adapter a) {
  switch (a) {
    case Adapter::None: return "no adapter";
    case Adapter::Unmerged: return "adapter on every projection";
    case Adapter::Merged: return "merged adapter";
    case Adapter::QvOnly: return "adapter on q and v";
  }
  return "?";
}

// The calls per op of one training forward, of a prefill (3 rows) and of a decode step (1 row) of a fixture model.
struct Counts {
  std::map<std::string, int> train, prefill, decode;
  int layers = 0;
  bool gemma = false;
};

// The fixture's weights, and the adapter a says (merged into the engine's copy for Merged).
void load(Transformer& net, const std::string& name, Adapter a) {
  net.load_weights(kData + name);
  if (a == Adapter::Unmerged || a == Adapter::Merged) {
    net.add_lora(read_peft_config(kData + name + "/adapter_config.json"), 0).load_peft(kData + name);
  } else if (a == Adapter::QvOnly) {
    LoraConfig lc;
    lc.r = 2;
    lc.targets = {"q_proj", "v_proj"};
    net.add_lora(lc, 7);
  }
  if (a == Adapter::Merged) {
    EXPECT_TRUE(net.engine().merge_lora(true));
  }
}

Counts count_calls(const std::string& name, Adapter a) {
  CountingOps ops;
  const io::ModelConfig cfg = io::parse_hf_config(kData + name + "/config.json");
  Transformer net(cfg, ops);
  load(net, name, a);
  Counts c;
  c.layers = static_cast<int>(cfg.num_hidden_layers);
  c.gemma = cfg.gemma;
  const Batch b = Batch::from_sequences({{1, 5, 9, 2}, {3, 4, 7}});
  std::vector<float> lp(static_cast<std::size_t>(b.T()));
  c.train = ops.count([&] { net.forward(b, lp.data()); });
  KvCache cache(cfg, ops, 1, 8);
  c.prefill = ops.count([&] { net.infer({1, 5, 9}, {0, 0, 0}, {0, 1, 2}, {2}, cache); });
  c.decode = ops.count([&] { net.infer({4}, {0}, {3}, {0}, cache); });
  return c;
}

int n(const std::map<std::string, int>& m, const char* op) { return m.count(op) ? m.at(op) : 0; }

const char* const kFixtures[] = {"llama_gqa", "qwen2_bias_tied", "gemma3_text"};
const Adapter kAdapters[] = {Adapter::None, Adapter::Unmerged, Adapter::Merged, Adapter::QvOnly};
const char* const kFusedOps[] = {"rope_kv_store", "linear_group_forward", "gated_mlp_forward",
                                 "linear_residual_forward"};

TEST(DecodeFused, EngineTakesTheFusedOps) {
  ASSERT_TRUE(decode_fused_enabled()) << "run without MGRL_DECODE_FUSED=0";
  for (const std::string name : kFixtures)
    for (const Adapter a : kAdapters) {
      const Counts c = count_calls(name, a);
      const std::string tag = name + ", " + adapter_name(a);
      const int L = c.layers;
      for (const char* op : kFusedOps) EXPECT_EQ(n(c.train, op), 0) << tag << ": training took " << op;
      // MLP fused where no adapter runs on its projections (unmerged on every projection: none); the down projection
      // with the residual add only without Gemma's post-norms.
      const bool mlp = a != Adapter::Unmerged, down = mlp && !c.gemma;
      for (const auto* m : {&c.prefill, &c.decode}) {
        EXPECT_EQ(n(*m, "rope_kv_store"), L) << tag;
        EXPECT_EQ(n(*m, "rope_forward"), 0) << tag;
        EXPECT_EQ(n(*m, "kv_store"), 0) << tag;
        // q|k|v and o always; gate|up and down through the group op when they are not fused.
        EXPECT_EQ(n(*m, "linear_group_forward"), L * (2 + (mlp ? 0 : 1) + (down ? 0 : 1))) << tag;
        EXPECT_EQ(n(*m, "gated_mlp_forward"), mlp ? L : 0) << tag;
        EXPECT_EQ(n(*m, "swiglu_forward") + n(*m, "geglu_forward"), mlp ? 0 : L) << tag;
        EXPECT_EQ(n(*m, "linear_residual_forward"), down ? L : 0) << tag;
        EXPECT_EQ(n(*m, "residual_add"), down ? 0 : L) << tag;
        EXPECT_EQ(n(*m, "linear_forward"), 0) << tag;
        // The adapters that run: none merged or absent; the unmerged ones beside the fused ops.
        const int lora_calls = n(*m, "lora_group_forward") + n(*m, "lora_forward");
        if (a == Adapter::None || a == Adapter::Merged) {
          EXPECT_EQ(lora_calls, 0) << tag;
        } else {
          EXPECT_GT(lora_calls, 0) << tag;
        }
      }
    }
}

TEST(DecodeFused, SwitchOffTakesTheSeparateOps) {
  ASSERT_FALSE(decode_fused_enabled()) << "run with MGRL_DECODE_FUSED=0";
  for (const std::string name : kFixtures)
    for (const Adapter a : kAdapters) {
      const Counts c = count_calls(name, a);
      const std::string tag = name + ", " + adapter_name(a);
      const int L = c.layers;
      for (const auto* m : {&c.train, &c.prefill, &c.decode}) {
        for (const char* op : kFusedOps) EXPECT_EQ(n(*m, op), 0) << tag << ": took " << op;
        EXPECT_EQ(n(*m, "rope_forward"), 2 * L) << tag;
        EXPECT_EQ(n(*m, "linear_forward"), 7 * L) << tag;
        EXPECT_EQ(n(*m, "swiglu_forward") + n(*m, "geglu_forward"), L) << tag;
      }
      EXPECT_EQ(n(c.prefill, "kv_store"), L) << tag;
      EXPECT_EQ(n(c.decode, "kv_store"), L) << tag;
    }
}

// MGRL_DECODE_NORM_FOLD=1 (unit.decode_norm_fold): the engine takes the norm-folding ops where the backend accepts them
// (CountingOps::fold_norms composes them from the CPU's norm and op) and falls back to the separate ops where it
// declines (the plain CPU backend), with the same logits, bit for bit; the attention norm folds into q|k|v unless an
// unmerged adapter runs on q, k or v, and o + residual + MLP norm + gate|up unless one runs on o, gate or up, or the
// model has Gemma's post-norms. The training forward never takes them.
TEST(DecodeFused, NormFoldWiring) {
  ASSERT_TRUE(decode_norm_fold_enabled()) << "run with MGRL_DECODE_NORM_FOLD=1";
  for (const std::string name : kFixtures)
    for (const Adapter a : kAdapters) {
      const std::string tag = name + ", " + adapter_name(a);
      const io::ModelConfig cfg = io::parse_hf_config(kData + name + "/config.json");
      const int L = static_cast<int>(cfg.num_hidden_layers);
      std::map<std::string, int> counts[2][3];  // [fold][train, prefill, decode]
      std::vector<float> logits[2];
      for (const int fold : {0, 1}) {
        CountingOps ops;
        ops.fold_norms = fold == 1;
        Transformer net(cfg, ops);
        load(net, name, a);
        const Batch b = Batch::from_sequences({{1, 5, 9, 2}, {3, 4, 7}});
        std::vector<float> lp(static_cast<std::size_t>(b.T()));
        counts[fold][0] = ops.count([&] { net.forward(b, lp.data()); });
        KvCache cache(cfg, ops, 2, 8);
        counts[fold][1] =
            ops.count([&] { net.infer({1, 5, 9, 3, 4}, {0, 0, 0, 1, 1}, {0, 1, 2, 0, 1}, {2, 4}, cache); });
        const float* out = nullptr;
        counts[fold][2] = ops.count([&] { out = net.infer({4, 7}, {0, 1}, {3, 2}, {0, 1}, cache); });
        logits[fold].resize(static_cast<std::size_t>(2 * cfg.vocab_size));
        ops.download(logits[fold].data(), out, logits[fold].size() * 4);
      }
      EXPECT_EQ(logits[1], logits[0]) << tag << ": the folded decode step's logits differ from the separate ops'";
      const bool qkv = a == Adapter::None || a == Adapter::Merged;
      const bool mlp = a != Adapter::Unmerged && !cfg.gemma;
      for (int fold : {0, 1})
        for (const char* op : {"rmsnorm_linear_group_forward", "rmsnorm_gated_mlp_forward"})
          EXPECT_EQ(n(counts[fold][0], op), 0) << tag << ": training took " << op;
      for (int k : {1, 2}) {
        const auto &off = counts[0][k], &on = counts[1][k];
        EXPECT_EQ(n(off, "rmsnorm_linear_group_forward") + n(off, "rmsnorm_gated_mlp_forward"), 0) << tag;
        EXPECT_EQ(n(on, "rmsnorm_linear_group_forward"), qkv ? L : 0) << tag;
        EXPECT_EQ(n(on, "rmsnorm_gated_mlp_forward"), mlp ? L : 0) << tag;
        EXPECT_EQ(n(on, "rmsnorm_forward"), n(off, "rmsnorm_forward") - (qkv ? L : 0)) << tag;
        EXPECT_EQ(n(on, "residual_rmsnorm_forward"), n(off, "residual_rmsnorm_forward") - (mlp ? L : 0)) << tag;
        EXPECT_EQ(n(on, "linear_group_forward"), n(off, "linear_group_forward") - (qkv ? L : 0) - (mlp ? L : 0)) << tag;
        EXPECT_EQ(n(on, "linear_residual_forward"), n(off, "linear_residual_forward") + (mlp ? L : 0)) << tag;
        EXPECT_EQ(n(on, "gated_mlp_forward"), n(off, "gated_mlp_forward") - (mlp ? L : 0)) << tag;
      }
    }
}

}  // namespace
}  // namespace mgrl::model
