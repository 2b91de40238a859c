// test_fused_norm.cpp: the decoder block really takes the fused residual + RMSNorm ops (Ops::residual_rmsnorm_forward,
// Ops::residual_add) when MGRL_FUSED_NORM is not 0, and the separate copy / residual_forward / rmsnorm_forward when it
// is: the CPU backend wrapped in an Ops that counts the calls, through the training forward and the inference engine,
// on a Llama-like and a Gemma 3 fixture model (post-norms). Registered twice in tests/CMakeLists.txt: the Fused test
// with the switch unset, the Unfused test with MGRL_FUSED_NORM=0 (each fails in the other setting).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "model/block.h"
#include "model/kv_cache.h"
#include "model/transformer.h"
#include "tests/unit/counting_ops.h"

namespace mgrl::model {
namespace {

const std::string kData = MGRL_TEST_DATA_DIR "/models/";

using test::CountingOps;

// The calls per op of one training forward and of one inference prefill of a fixture model, and its layer count.
struct Counts {
  std::map<std::string, int> train, infer;
  int layers = 0;
};

Counts count_calls(const std::string& name) {
  CountingOps ops;
  const io::ModelConfig cfg = io::parse_hf_config(kData + name + "/config.json");
  Transformer net(cfg, ops);
  net.load_weights(kData + name);
  net.add_lora(read_peft_config(kData + name + "/adapter_config.json"), 0).load_peft(kData + name);
  Counts c;
  c.layers = static_cast<int>(cfg.num_hidden_layers);
  const Batch b = Batch::from_sequences({{1, 5, 9, 2}, {3, 4, 7}});
  std::vector<float> lp(static_cast<std::size_t>(b.T()));
  c.train = ops.count([&] { net.forward(b, lp.data()); });
  KvCache cache(cfg, ops, 1, 8);
  c.infer = ops.count([&] { net.infer({1, 5, 9}, {0, 0, 0}, {0, 1, 2}, {2}, cache); });
  return c;
}

// Per layer: the residual before the MLP norm fused with it, the last residual out of place; the separate ops unused
// (the layer's only other norms are the attention norm, and on Gemma the two post-norms; plus the final norm).
TEST(FusedNorm, BlockTakesTheFusedOps) {
  ASSERT_TRUE(fused_norm_enabled()) << "run without MGRL_FUSED_NORM=0";
  for (const std::string name : {"llama_gqa", "gemma3_text"}) {
    const Counts c = count_calls(name);
    const int post = name == "gemma3_text" ? 2 : 0, qk = post;  // Gemma 3: post-norms and q/k norms
    for (const auto* m : {&c.train, &c.infer}) {
      const auto n = [m](const char* op) { return m->count(op) ? m->at(op) : 0; };
      EXPECT_EQ(n("residual_rmsnorm_forward"), c.layers) << name;
      EXPECT_EQ(n("residual_add"), c.layers) << name;
      EXPECT_EQ(n("residual_forward"), 0) << name;
      EXPECT_EQ(n("rmsnorm_forward"), c.layers * (1 + post + qk) + 1) << name;
    }
  }
}

TEST(FusedNorm, UnfusedTakesTheSeparateOps) {
  ASSERT_FALSE(fused_norm_enabled()) << "run with MGRL_FUSED_NORM=0";
  for (const std::string name : {"llama_gqa", "gemma3_text"}) {
    const Counts c = count_calls(name);
    const int post = name == "gemma3_text" ? 2 : 0, qk = post;  // Gemma 3: post-norms and q/k norms
    for (const auto* m : {&c.train, &c.infer}) {
      const auto n = [m](const char* op) { return m->count(op) ? m->at(op) : 0; };
      EXPECT_EQ(n("residual_rmsnorm_forward"), 0) << name;
      EXPECT_EQ(n("residual_add"), 0) << name;
      EXPECT_EQ(n("residual_forward"), 2 * c.layers) << name;
      EXPECT_EQ(n("rmsnorm_forward"), c.layers * (2 + post + qk) + 1) << name;
    }
  }
}

}  // namespace
}  // namespace mgrl::model
