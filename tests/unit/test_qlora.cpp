// test_qlora.cpp: QLoRA on the CPU backend: a model directory that transformers saved in bitsandbytes 4-bit form
// (tests/data/nf4/llama_nf4) with a PEFT adapter, against what transformers + PEFT + bitsandbytes compute for it
// (log-probs, loss, LoRA and input-embedding gradients); model.quantize = "nf4" at load gives the same model; the
// NF4 weights stay NF4 in memory (sharded with model.shard_base too); full fine-tuning over NF4 is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/nf4_tensor.h"
#include "io/safetensors.h"
#include "kernels/cpu/nf4.h"
#include "kernels/ops.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "tests/unit/reference_batch.h"
#include "tests/unit/test_util.h"

namespace mgrl::model {
namespace {

const std::string kNf4 = MGRL_TEST_DATA_DIR "/nf4/llama_nf4";
const std::string kDense = MGRL_TEST_DATA_DIR "/nf4/llama_dense";
const std::string kPlain = MGRL_TEST_DATA_DIR "/nf4/llama_nf4_plain";  // no double quantization

using test::rel_error;

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// A model over `dir` with llama_nf4's adapter, and the reference batch.
struct QloraRun : test::ReferenceFile, test::ReferenceBatch {  // ref, and its batch: B, L, lengths, batch, weights
  std::unique_ptr<kernels::Ops> ops = kernels::make_cpu_ops();
  std::unique_ptr<Transformer> model;
  std::vector<float> lp, grads, dembed;

  QloraRun(const std::string& dir, ModelOptions opts = {})
      : test::ReferenceFile(kNf4 + "/reference.safetensors"), test::ReferenceBatch(ref) {
    model = std::make_unique<Transformer>(io::parse_hf_config(dir + "/config.json"), *ops, opts);
    model->load_weights(dir);
    model->add_lora(read_peft_config(kNf4 + "/adapter_config.json"), 0).load_peft(kNf4);
  }
  // forward + backward; fills lp, grads, dembed
  void step() {
    lp.assign(batch.tokens.size(), 0.0f);
    model->forward(batch, lp.data(), /*use_lora=*/true, /*train=*/true);
    model->lora()->zero_grads();
    model->backward(weights.data());
    grads.assign(model->lora()->numel(), 0.0f);
    ops->download(grads.data(), model->lora()->grads(), grads.size() * sizeof(float));
    dembed = model->input_embedding_grad();
  }
};

TEST(Qlora, BitsandbytesDirectoryMatchesTransformersPeftBitsandbytes) {
  QloraRun r(kNf4);
  r.step();
  const auto want_lp = r.valid_rows(r.reference("logprobs"), 1);
  const double lp_rel = rel_error(r.lp, want_lp), lp_abs = max_abs_diff(r.lp, want_lp);
  EXPECT_LE(lp_rel, 1e-5) << "log-probs";
  EXPECT_LE(lp_abs, 1e-4) << "log-probs";
  const double want_loss = io::to_f32(r.ref.get("loss"))[0];
  EXPECT_NEAR(r.loss(r.lp), want_loss, 1e-5 * std::abs(want_loss));
  double worst = 0;
  int checked = 0;
  for (const auto& s : r.model->lora()->slots()) {
    for (const bool a : {true, false}) {
      const auto want = io::to_f32(r.ref.get("grad." + LoraParams::peft_name(s, a)));
      const std::size_t off = a ? s.a_offset : s.b_offset;
      const std::vector<float> got(r.grads.begin() + static_cast<std::ptrdiff_t>(off),
                                   r.grads.begin() + static_cast<std::ptrdiff_t>(off + want.size()));
      const double e = rel_error(got, want);
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-4) << LoraParams::peft_name(s, a);
      // and against bitsandbytes' own float32 run
      EXPECT_LE(rel_error(got, io::to_f32(r.ref.get("bnb_f32.grad." + LoraParams::peft_name(s, a)))), 1e-4);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 28);
  const double emb = rel_error(r.dembed, r.valid_rows(r.reference("grad.inputs_embeds"), 64));
  EXPECT_LE(emb, 1e-4) << "d inputs_embeds";
  EXPECT_LE(max_abs_diff(r.lp, r.valid_rows(r.reference("bnb_f32.logprobs"), 1)), 1e-4) << "against bitsandbytes' float32 run";
  std::printf("QLoRA vs float64 reference: log-probs rel %.2e (max abs %.2e), loss %.2e, LoRA grads max rel %.2e, "
              "d embeds rel %.2e\n",
              lp_rel, lp_abs, std::fabs(r.loss(r.lp) - want_loss), worst, emb);
}

// Quantizing the bf16 source at load (model.quantize = "nf4", double quantization as the saved model has it) gives
// the bitsandbytes directory's codes and absmax, hence the same numbers bit for bit; without double quantization,
// those of the directory bitsandbytes saved so.
TEST(Qlora, QuantizeAtLoadEqualsTheBitsandbytesDirectory) {
  ModelOptions o;
  o.quantize = Quantize::Nf4;
  o.quantize_double = true;
  QloraRun a(kNf4), b(kDense, o);
  a.step();
  b.step();
  EXPECT_EQ(a.lp, b.lp);
  EXPECT_EQ(a.grads, b.grads);
  // plain absmax: a different model (the absmax are not rounded to 8 bits), close to the double-quantized one
  o.quantize_double = false;
  QloraRun c(kDense, o);
  c.step();
  EXPECT_NE(c.lp, a.lp);
  EXPECT_LE(rel_error(c.lp, a.lp), 1e-2);
  // ... and it is the bitsandbytes directory saved without double quantization (llama_nf4_plain), bit for bit
  QloraRun d(kPlain);
  d.step();
  EXPECT_EQ(d.lp, c.lp);
  EXPECT_EQ(d.grads, c.grads);
}

TEST(Qlora, WeightsStayNf4AndRecomputeGivesTheSameGradients) {
  QloraRun plain(kNf4);
  ModelOptions o;
  o.recompute = true;
  QloraRun rec(kNf4, o);
  plain.step();
  rec.step();
  EXPECT_EQ(plain.lp, rec.lp);
  EXPECT_EQ(plain.grads, rec.grads);
  // the dense arena holds the embeddings, norms and lm_head only; the projections are NF4 (about half a byte each)
  const ModelDef& d = plain.model->definition();
  const io::ModelConfig& c = d.config();
  const std::size_t dense = static_cast<std::size_t>(2 * c.vocab_size * c.hidden_size +
                                                     (2 * c.num_hidden_layers + 1) * c.hidden_size);
  EXPECT_EQ(d.dense_numel(), dense);
  EXPECT_GT(d.nf4_bytes(), 0u);
  EXPECT_LT(d.nf4_bytes(), (d.base_numel() - dense) * 6 / 10);
  // the host copy of an NF4 tensor is its dequantized value: bitsandbytes' codes and absmax from the file,
  // dequantized on the host
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  const auto q = plain.model->base_tensor_host(name);
  ASSERT_EQ(q.size(), static_cast<std::size_t>(c.hidden_size * c.intermediate_size));
  const io::SafetensorsModel file(kNf4);
  const io::Nf4Tensor t = io::read_bnb_nf4(file, name);
  ASSERT_TRUE(t.double_quant);
  std::vector<float> absmax(static_cast<std::size_t>(t.blocks())), want(q.size());
  kernels::cpu::nf4_absmax_dequantize(t.qabsmax.data(), t.nested_absmax.data(), t.offset, t.nested_code.data(),
                                      t.blocks(), absmax.data());
  kernels::cpu::nf4_dequantize(t.codes.data(), absmax.data(), t.code.data(), t.numel(), want.data());
  EXPECT_EQ(q, want);
}

// model.shard_base on one rank (one part: the layer's stored bytes copied into the gather workspace): the layers'
// NF4 bytes are stored and gathered as NF4 and dequantized from the gathered copy, giving the unsharded model's
// log-probs and gradients bit for bit, with and without double quantization (the bitsandbytes directories, and the
// bf16 source quantized at load); the base this process holds is the unsharded one's NF4 and dense bytes (up to the
// 16-byte alignment of each tensor in a layer's range), never dense projections. The multi-rank forms are
// cli.*.qlora_shard_base_equals_unsharded.
TEST(Qlora, ShardedBaseOnOneRankGivesTheSameModel) {
  for (const std::string kind : {"bnb", "bnb_plain", "at_load"}) {
    ModelOptions o;
    if (kind == "at_load") o.quantize = Quantize::Nf4;  // plain absmax: llama_nf4 is double-quantized
    const std::string dir = kind == "at_load" ? kDense : kind == "bnb" ? kNf4 : kPlain;
    QloraRun plain(dir, o);
    o.shard_base = true;
    QloraRun shard(dir, o);
    o.recompute = o.shard_keep = true;
    QloraRun kept(dir, o);
    plain.step();
    shard.step();
    kept.step();
    EXPECT_EQ(plain.lp, shard.lp) << kind;
    EXPECT_EQ(plain.grads, shard.grads) << kind;
    EXPECT_EQ(plain.dembed, shard.dembed) << kind;
    EXPECT_EQ(plain.lp, kept.lp) << kind;
    EXPECT_EQ(plain.grads, kept.grads) << kind;
    const ModelDef& p = plain.model->definition();
    const ModelDef& d = shard.model->definition();
    ASSERT_TRUE(d.sharded() && d.quantized());
    EXPECT_EQ(d.nf4_bytes(), p.nf4_bytes());
    EXPECT_GE(d.base_bytes_held(), p.base_bytes_held());
    EXPECT_LE(d.base_bytes_held(), p.base_bytes_held() + 16 * (kNumModules + 1) *
                                                          static_cast<std::size_t>(p.config().num_hidden_layers));
    // the gather workspace: two layers' stored bytes (NF4 + norms), not two layers of dense projections
    const std::size_t layer_nf4 = p.nf4_bytes() / static_cast<std::size_t>(p.config().num_hidden_layers);
    EXPECT_GE(d.gather_workspace_bytes(), 2 * layer_nf4);
    EXPECT_LT(d.gather_workspace_bytes(), 2 * layer_nf4 + 2 * 1024);
    EXPECT_GT(d.gathers(), 0u);
    EXPECT_EQ(d.nf4_workspace_bytes(), p.nf4_workspace_bytes());
  }
}

// The inference engine (KV cache, one token per sequence per call after a 2-token prefill) gives the training
// forward's logits: every call dequantizes the layers again (the workspace holds one layer at a time).
TEST(Qlora, InferenceEngineMatchesTheTrainingForward) {
  QloraRun r(kNf4);
  std::vector<float> lp(r.batch.tokens.size());
  r.model->forward(r.batch, lp.data());
  const std::vector<float> full = r.model->logits();
  const int V = static_cast<int>(r.model->config().vocab_size);
  KvCache cache(r.model->config(), *r.ops, r.B, r.L);
  std::vector<float> got(full.size(), 0.0f);
  for (int step = 0;; ++step) {
    std::vector<std::int32_t> tok, slot, pos, rows, where;
    for (int s = 0; s < r.B; ++s) {
      const int from = step == 0 ? 0 : step + 1, to = step == 0 ? 2 : step + 2;
      for (int t = from; t < std::min(to, r.batch.length(s)); ++t) {
        tok.push_back(r.batch.tokens[static_cast<std::size_t>(r.batch.offsets[s] + t)]);
        slot.push_back(s);
        pos.push_back(t);
        rows.push_back(static_cast<std::int32_t>(tok.size() - 1));
        where.push_back(r.batch.offsets[s] + t);
      }
    }
    if (tok.empty()) break;
    const float* logits = r.model->infer(tok, slot, pos, rows, cache);
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::copy(logits + i * V, logits + (i + 1) * V, got.begin() + static_cast<std::ptrdiff_t>(where[i]) * V);
  }
  EXPECT_LE(rel_error(got, full), 1e-5);
}

TEST(Qlora, FullFinetuneOverNf4IsRefused) {
  auto ops = kernels::make_cpu_ops();
  ModelOptions o;
  o.full_finetune = true;
  const std::string bnb = test::error_of([&] { Transformer t(io::parse_hf_config(kNf4 + "/config.json"), *ops, o); });
  EXPECT_NE(bnb.find("train.full_finetune"), std::string::npos) << bnb;
  EXPECT_NE(bnb.find("quantization_config"), std::string::npos) << bnb;
  o.quantize = Quantize::Nf4;
  const std::string q = test::error_of([&] { Transformer t(io::parse_hf_config(kDense + "/config.json"), *ops, o); });
  EXPECT_NE(q.find("model.quantize"), std::string::npos) << q;
  EXPECT_NE(q.find("train.full_finetune"), std::string::npos) << q;
}

}  // namespace
}  // namespace mgrl::model
