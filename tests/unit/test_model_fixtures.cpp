// test_model_fixtures.cpp: the transformer with LoRA on the CPU backend against Hugging Face
// transformers + PEFT (tests/data/models, written by tools/make_fixtures.py): log-probs, logits
// with and without the adapter, loss, LoRA gradients and input-embedding gradients; recompute
// gives the same; full fine-tuning and LoRA dropout gradients against finite differences; the rotary inverse
// frequencies; the final hidden state and a gradient handed back for it (PPO's value head); SFT's fused LM head
// (forward_with_loss) bitwise against forward + add_loss + backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/lora.h"
#include "model/rope_freq.h"
#include "model/transformer.h"
#include "tests/unit/reference_batch.h"
#include "tests/unit/test_util.h"

namespace mgrl::model {
namespace {

const std::string kData = MGRL_TEST_DATA_DIR "/models/";

using test::rel_error;

struct Fixture : test::ReferenceFile, test::ReferenceBatch {  // ref, and its batch: B, L, lengths, batch, weights
  io::ModelConfig cfg;
  std::unique_ptr<kernels::Ops> ops = kernels::make_cpu_ops();
  std::unique_ptr<Transformer> model;

  // `reference`: the fixture whose reference.safetensors holds the ground truth (default: name's own).
  Fixture(const std::string& name, ModelOptions opts = {}, const std::string& reference = "")
      : test::ReferenceFile(kData + (reference.empty() ? name : reference) + "/reference.safetensors"),
        test::ReferenceBatch(ref),
        cfg(io::parse_hf_config(kData + name + "/config.json")) {
    model = std::make_unique<Transformer>(cfg, *ops, opts);
    model->load_weights(kData + name);
    model->add_lora(read_peft_config(kData + name + "/adapter_config.json"), 0).load_peft(kData + name);
  }
};

class ModelFixture : public ::testing::TestWithParam<std::string> {};

void matches_hugging_face(Fixture& f) {
  const std::size_t BL = f.batch.tokens.size();
  const std::size_t V = f.cfg.vocab_size, H = f.cfg.hidden_size;

  std::vector<float> lp(BL);
  f.model->forward(f.batch, lp.data(), /*use_lora=*/true, /*train=*/true);
  const auto want_lp = f.valid_rows(f.reference("logprobs"), 1);
  EXPECT_LE(rel_error(lp, want_lp), 1e-5) << "log-probs";
  for (std::size_t i = 0; i < BL; ++i) EXPECT_NEAR(lp[i], want_lp[i], 1e-4) << "log-prob " << i;
  EXPECT_LE(rel_error(f.model->logits(), f.valid_rows(f.reference("logits"), V)), 1e-5) << "logits";
  const double want_loss = f.reference("loss")[0];
  EXPECT_NEAR(f.loss(lp), want_loss, 1e-5 * std::abs(want_loss)) << "loss";

  f.model->lora()->zero_grads();
  f.model->backward(f.weights.data());
  LoraParams& lora = *f.model->lora();
  std::vector<float> grads(lora.numel());
  f.ops->download(grads.data(), lora.grads(), grads.size() * sizeof(float));
  int checked = 0;
  for (const auto& s : lora.slots()) {
    for (const bool a : {true, false}) {
      const auto want = f.reference("grad." + LoraParams::peft_name(s, a));
      const std::size_t off = a ? s.a_offset : s.b_offset;
      const std::vector<float> got(grads.begin() + static_cast<std::ptrdiff_t>(off),
                                   grads.begin() + static_cast<std::ptrdiff_t>(off + want.size()));
      EXPECT_LE(rel_error(got, want), 1e-4) << LoraParams::peft_name(s, a);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 14 * f.cfg.num_hidden_layers);  // A and B of 7 modules per layer
  EXPECT_LE(rel_error(f.model->input_embedding_grad(), f.valid_rows(f.reference("grad.inputs_embeds"), H)), 1e-4)
      << "d inputs_embeds";

  // The base model: the adapter switched off for one call.
  std::vector<float> lp_base(BL);
  f.model->forward(f.batch, lp_base.data(), /*use_lora=*/false);
  EXPECT_LE(rel_error(f.model->logits(), f.valid_rows(f.reference("logits_base"), V)), 1e-5)
      << "logits without the adapter";
}

TEST_P(ModelFixture, MatchesHuggingFace) {
  Fixture f(GetParam());
  matches_hugging_face(f);
}

// Gemma 3's vision-language checkpoint (Gemma3ForConditionalGeneration, tools/make_vlm_fixtures.py) read as its
// language model: gemma3_text's weights and adapter inside, in transformers 5.24's layout (gemma3_vlm) and in the
// Hub's (gemma3_vlm_hub: transformers 4.50's tensor and module names, a text_config holding only what differs from
// Gemma3TextConfig's defaults), so gemma3_text's transformers + PEFT reference is theirs (the script checks that
// transformers' Gemma3ForConditionalGeneration gives those logits on text).
TEST(VisionLanguage, Gemma3LanguageModelMatchesHuggingFace) {
  const io::ModelConfig text = io::parse_hf_config(kData + "gemma3_text/config.json");
  for (const std::string name : {"gemma3_vlm", "gemma3_vlm_hub"}) {
    SCOPED_TRACE(name);
    Fixture f(name, {}, "gemma3_text");
    EXPECT_EQ(f.cfg.vlm_architecture, "Gemma3ForConditionalGeneration");
    EXPECT_EQ(f.cfg.arch, io::Architecture::Gemma3);
    EXPECT_EQ(f.cfg.num_key_value_heads, text.num_key_value_heads);
    EXPECT_EQ(f.cfg.rms_norm_eps, text.rms_norm_eps);
    EXPECT_EQ(f.cfg.layer_sliding, text.layer_sliding);
    EXPECT_EQ(f.cfg.rope_local_theta, text.rope_local_theta);
    EXPECT_EQ(f.cfg.query_pre_attn_scalar, text.query_pre_attn_scalar);
    EXPECT_TRUE(f.cfg.tie_word_embeddings);
    matches_hugging_face(f);
  }
  // The Hub's checkpoints list <eos> and <end_of_turn> at the top level: both end a completion.
  EXPECT_EQ(io::parse_hf_config(kData + "gemma3_vlm_hub/config.json").eos_token_ids, (std::vector<std::int64_t>{1, 106}));
}

TEST_P(ModelFixture, RecomputeGivesTheSameGradients) {
  Fixture plain(GetParam()), recompute(GetParam(), ModelOptions{false, true});
  std::vector<float> lp1(plain.batch.tokens.size()), lp2(lp1.size());
  plain.model->forward(plain.batch, lp1.data(), true, true);
  recompute.model->forward(recompute.batch, lp2.data(), true, true);
  EXPECT_EQ(lp1, lp2);
  plain.model->lora()->zero_grads();
  recompute.model->lora()->zero_grads();
  plain.model->backward(plain.weights.data());
  recompute.model->backward(recompute.weights.data());
  std::vector<float> g1(plain.model->lora()->numel()), g2(g1.size());
  plain.ops->download(g1.data(), plain.model->lora()->grads(), g1.size() * 4);
  recompute.ops->download(g2.data(), recompute.model->lora()->grads(), g2.size() * 4);
  EXPECT_EQ(g1, g2);
}

// A packed batch gives each sequence what it gets alone: log-probs, and LoRA gradients that sum over sequences
// (the loss is a sum over tokens). Nothing leaks across sequence boundaries, nothing is spent on padding.
TEST_P(ModelFixture, PackedBatchEqualsSequencesAlone) {
  Fixture f(GetParam());
  std::vector<float> lp(f.batch.tokens.size());
  f.model->forward(f.batch, lp.data(), true, true);
  f.model->lora()->zero_grads();
  f.model->backward(f.weights.data());
  const std::size_t n = f.model->lora()->numel();
  std::vector<float> packed(n), alone(n);
  f.ops->download(packed.data(), f.model->lora()->grads(), n * 4);
  f.model->lora()->zero_grads();  // the per-sequence backwards accumulate
  std::vector<float> lp_alone;
  for (int b = 0; b < f.batch.B(); ++b) {
    const auto first = f.batch.tokens.begin() + f.batch.offsets[b];
    const Batch one = Batch::from_sequences({std::vector<std::int32_t>(first, first + f.batch.length(b))});
    std::vector<float> l(one.tokens.size());
    f.model->forward(one, l.data(), true, true);
    const std::vector<float> w(f.weights.begin() + f.batch.offsets[b], f.weights.begin() + f.batch.offsets[b + 1]);
    f.model->backward(w.data());
    lp_alone.insert(lp_alone.end(), l.begin(), l.end());
  }
  f.ops->download(alone.data(), f.model->lora()->grads(), n * 4);
  ASSERT_EQ(lp_alone.size(), lp.size());
  for (std::size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(lp[i], lp_alone[i], 1e-5) << "log-prob " << i;
  EXPECT_LE(rel_error(packed, alone), 1e-5) << "LoRA gradients";
  EXPECT_GT(f.batch.B(), 1);
}

// SFT's fused pass (forward_with_loss: the LM head's backward inside the forward, each chunk's logits computed once)
// gives bitwise what forward + add_loss + backward(weights * scale) give: the loss, the trainable gradients (LoRA, or
// every base tensor in full fine-tuning, the tied embedding's two contributions included) and the input-embedding
// gradient, over two accumulated micro-batches. And its backward no longer runs the LM head: the head's weights
// zeroed between forward_with_loss and backward change nothing, whereas the same between forward and backward
// changes the unfused path's gradients (so this test fails if the fused path is not taken).
void fused_head_equals_unfused(const std::string& name, ModelOptions opts, double scale) {
  const bool full = opts.full_finetune;
  auto grads = [full](Fixture& f) {
    const std::size_t n = full ? f.model->base_numel() : f.model->lora()->numel();
    std::vector<float> g(n);
    f.ops->download(g.data(), full ? f.model->base_grads() : f.model->lora()->grads(), n * sizeof(float));
    return g;
  };
  auto zero_grads = [full](Fixture& f) {
    if (full) f.ops->zero(f.model->base_grads(), f.model->base_numel() * sizeof(float));
    else f.model->lora()->zero_grads();
  };
  auto zero_head = [](Fixture& f) {  // CPU storage is f32 host memory; the tied models' head is the embedding
    auto* head = static_cast<float*>(const_cast<void*>(f.model->definition().head()));
    std::fill(head, head + f.cfg.vocab_size * f.cfg.hidden_size, 0.0f);
  };
  auto loss_of = [](Fixture& f, const double* acc) {
    double v = 0;
    f.ops->download(&v, acc, sizeof(double));
    return v;
  };
  std::vector<float> scaled = {};
  Fixture a(name, opts), b(name, opts), c(name, opts);
  for (float w : a.weights) scaled.push_back(static_cast<float>(w * scale));  // as sft.cpp scales them
  auto* acc_a = static_cast<double*>(a.ops->alloc(sizeof(double)));
  auto* acc_b = static_cast<double*>(b.ops->alloc(sizeof(double)));
  auto* acc_c = static_cast<double*>(c.ops->alloc(sizeof(double)));
  for (Fixture* f : {&a, &b, &c}) zero_grads(*f);
  for (int micro = 0; micro < 2; ++micro) {
    const std::uint64_t seed = 11 + static_cast<std::uint64_t>(micro);
    a.model->forward(a.batch, nullptr, true, true, seed);
    a.model->add_loss(a.weights.data(), acc_a);
    a.model->backward(scale != 1.0 ? scaled.data() : nullptr);
    b.model->forward_with_loss(b.batch, b.weights.data(), scale, acc_b, seed);
    if (micro == 1) zero_head(b);
    b.model->backward(nullptr);
    c.model->forward(c.batch, nullptr, true, true, seed);
    c.model->add_loss(c.weights.data(), acc_c);
    if (micro == 1) zero_head(c);
    c.model->backward(scale != 1.0 ? scaled.data() : nullptr);
  }
  EXPECT_EQ(loss_of(a, acc_a), loss_of(b, acc_b)) << "loss";
  EXPECT_GT(loss_of(a, acc_a), 0.0);
  const std::vector<float> ga = grads(a), gb = grads(b);
  EXPECT_EQ(ga, gb) << "trainable gradients";
  EXPECT_EQ(a.model->input_embedding_grad(), b.model->input_embedding_grad()) << "input-embedding gradients";
  EXPECT_NE(ga, grads(c)) << "zeroing the head before the unfused backward changed nothing: the check is vacuous";
  // A fused forward takes its weights itself: a backward with weights, or a second backward, is refused.
  b.model->forward_with_loss(b.batch, b.weights.data(), scale, acc_b);
  EXPECT_THROW(b.model->backward(b.weights.data()), FatalError);
  b.model->backward(nullptr);
  EXPECT_THROW(b.model->backward(nullptr), FatalError);
  for (Fixture* f : {&a, &b, &c}) f->ops->release(f == &a ? acc_a : f == &b ? acc_b : acc_c);
}

TEST_P(ModelFixture, FusedLmHeadEqualsForwardThenBackward) { fused_head_equals_unfused(GetParam(), {}, 1.0); }

TEST(FusedLmHead, ScaledRecomputedAndFullFineTuningTied) {
  fused_head_equals_unfused("llama_gqa", ModelOptions{false, true}, 3.0);   // recompute, a loss scale
  fused_head_equals_unfused("qwen2_bias_tied", ModelOptions{true, false}, 1024.0);  // full FT, tied embeddings
  fused_head_equals_unfused("gemma2_softcap", ModelOptions{false, false}, 0.75);
}

// Batch::scored_from: the LM head on the rows that predict a scored position alone (GRPO's completions, SFT's
// weighted tokens) gives those positions' log-probs, the loss and every gradient of the pass on all rows (up to the
// last bits of a GEMM over other rows: within 1e-6), through forward + add_loss + backward, forward_with_loss and
// score(); the positions not scored come back 0 (so the head did not run there), and a loss weight on one of them
// is refused.
TEST_P(ModelFixture, ScoredRowsAloneEqualEveryRow) {
  Fixture a(GetParam()), b(GetParam()), c(GetParam());
  model::Batch scored = a.batch;
  for (int s = 0; s < scored.B(); ++s)  // half of the first sequence, all of the second, none of a third
    scored.scored_from.push_back(s == 0 ? scored.length(s) / 2 : s == 1 ? 0 : scored.length(s));
  std::vector<float> w(a.weights.size(), 0.0f);
  std::vector<bool> in(a.weights.size(), false);
  for (int s = 0; s < scored.B(); ++s)
    for (int t = std::max(1, scored.scored_from[static_cast<std::size_t>(s)]); t < scored.length(s); ++t) {
      const std::size_t i = static_cast<std::size_t>(scored.offsets[s] + t);
      in[i] = true;
      w[i] = 0.01f * static_cast<float>(1 + i % 7);
    }
  ASSERT_LT(std::count(in.begin(), in.end(), true), static_cast<long>(scored.T() - scored.B())) << "nothing left out";
  auto* acc = static_cast<double*>(a.ops->alloc(3 * sizeof(double)));
  double loss[3];
  const std::size_t T = a.weights.size();
  std::vector<float> lp_a(T), lp_b(T), lp_c(T);
  for (Fixture* f : {&a, &b, &c}) f->model->lora()->zero_grads();
  a.model->forward(a.batch, lp_a.data(), true, true, 5);
  a.model->add_loss(w.data(), acc);
  a.model->backward(nullptr);
  b.model->forward(scored, lp_b.data(), true, true, 5);
  b.model->add_loss(w.data(), acc + 1);
  b.model->backward(nullptr);
  c.model->forward_with_loss(scored, w.data(), 1.0, acc + 2, 5);
  c.model->backward(nullptr);
  a.ops->download(loss, acc, 3 * sizeof(double));
  a.ops->release(acc);
  EXPECT_NEAR(loss[1], loss[0], 1e-6 * std::abs(loss[0])) << "loss, forward + add_loss";
  EXPECT_NEAR(loss[2], loss[0], 1e-6 * std::abs(loss[0])) << "loss, forward_with_loss";
  for (std::size_t i = 0; i < T; ++i) {
    if (in[i]) {
      EXPECT_NEAR(lp_b[i], lp_a[i], 1e-6 * std::max(1.0f, std::abs(lp_a[i]))) << "log-prob at " << i;
    } else {
      EXPECT_EQ(lp_b[i], 0.0f) << "a log-prob at " << i << ", which is not scored";
    }
  }
  EXPECT_NE(lp_a[1], 0.0f) << "the full pass scores position 1";
  EXPECT_FALSE(in[1]) << "position 1 (first sequence) is not scored";
  auto grads = [](Fixture& f) {
    std::vector<float> g(f.model->lora()->numel());
    f.ops->download(g.data(), f.model->lora()->grads(), g.size() * sizeof(float));
    return g;
  };
  const std::vector<float> ga = grads(a);
  EXPECT_LT(rel_error(grads(b), ga), 1e-6) << "LoRA gradients, forward + add_loss + backward";
  EXPECT_LT(rel_error(grads(c), ga), 1e-6) << "LoRA gradients, forward_with_loss + backward";
  EXPECT_LT(rel_error(b.model->input_embedding_grad(), a.model->input_embedding_grad()), 1e-6);
  // score(): the same log-probs as the training forward of the same batch.
  std::vector<float> lp_s(T);
  b.model->score(scored, lp_s.data(), true);
  EXPECT_EQ(lp_s, lp_b);
  // A weight on a position that was not scored would be lost: refused.
  std::vector<float> bad = w;
  bad[1] = 0.5f;
  b.model->forward(scored, nullptr, true, true, 5);
  auto* acc1 = static_cast<double*>(b.ops->alloc(sizeof(double)));
  EXPECT_THROW(b.model->add_loss(bad.data(), acc1), FatalError);
  b.ops->release(acc1);
}

INSTANTIATE_TEST_SUITE_P(Hf, ModelFixture,
                         ::testing::Values("llama_gqa", "qwen2_bias_tied", "qwen3_qknorm", "gemma2_softcap",
                                           "gemma3_text", "mistral_window", "qwen3_yarn"));

// d loss / d x by central differences with Richardson extrapolation (steps h and h/2, error O(h^4)),
// the loss summed in double; set(v) writes the coordinate.
template <typename Set>
double numeric_grad(Fixture& f, bool train, std::uint64_t seed, Set&& set, float x0) {
  std::vector<float> lp(f.batch.tokens.size());
  auto central = [&](float h) {
    set(x0 + h);
    f.model->forward(f.batch, lp.data(), true, train, seed);
    const double up = f.loss(lp);
    set(x0 - h);
    f.model->forward(f.batch, lp.data(), true, train, seed);
    const double down = f.loss(lp);
    set(x0);
    return (up - down) / (2.0 * h);
  };
  const float h = 2e-2f * std::max(1.0f, std::abs(x0));
  return (4.0 * central(h / 2) - central(h)) / 3.0;
}

TEST(ModelGradients, FullFineTuningMatchesFiniteDifferences) {
  Fixture f("qwen2_bias_tied", ModelOptions{true, false});
  std::vector<float> lp(f.batch.tokens.size());
  f.model->forward(f.batch, lp.data(), true, true);
  f.model->backward(f.weights.data());
  std::vector<float> grads(f.model->base_numel());
  f.ops->download(grads.data(), f.model->base_grads(), grads.size() * 4);
  float* base = static_cast<float*>(f.model->base_weights());  // CPU storage is f32 host memory
  int checked = 0;
  for (const auto& t : f.model->base_tensors()) {
    // Two coordinates of every tensor (embeddings, tied head, norms, q/k/v biases, projections).
    const std::size_t n = static_cast<std::size_t>(io::shape_numel(t.shape));
    for (const std::size_t i : {std::size_t{0}, (n * 7) / 11}) {
      float* p = base + t.offset + i;
      const double num = numeric_grad(f, true, 0, [&](float v) { *p = v; }, *p);
      const double ana = grads[t.offset + i];
      EXPECT_NEAR(ana, num, 2e-3 * std::max(1e-2, std::abs(num))) << t.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

// PEFT adapter configs mgrl cannot apply as PEFT does are refused naming the key, not applied otherwise: activated LoRA
// (alora_invocation_tokens; applied to every token until 2026-11-29), DoRA; a null or empty list is plain LoRA.
TEST(PeftConfig, RefusesWhatItCannotApplyAsPeft) {
  std::ifstream in(kData + "llama_gqa/adapter_config.json");
  const nlohmann::json base = nlohmann::json::parse(in);
  const auto error = [&](const nlohmann::json& j) {
    try {
      peft_config_from_json(j, "a.json");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  nlohmann::json j = base;
  j["alora_invocation_tokens"] = {5, 6};
  EXPECT_NE(error(j).find("activated LoRA adapters (alora_invocation_tokens) are not supported"), std::string::npos)
      << error(j);
  j["alora_invocation_tokens"] = nlohmann::json::array();
  EXPECT_EQ(error(j), "");
  j["alora_invocation_tokens"] = nullptr;
  EXPECT_EQ(error(j), "");
  j["use_dora"] = true;
  EXPECT_NE(error(j).find("DoRA"), std::string::npos);
}

TEST(ModelGradients, LoraDropoutGradientsMatchFiniteDifferences) {
  Fixture f("llama_gqa");
  LoraConfig c = read_peft_config(kData + "llama_gqa/adapter_config.json");
  c.dropout = 0.3;
  const auto saved = f.model->lora()->to_host();
  f.model->add_lora(c, 0).from_host(saved);
  const std::uint64_t seed = 1234;
  std::vector<float> lp(f.batch.tokens.size()), lp_eval(lp.size());
  f.model->forward(f.batch, lp.data(), true, true, seed);
  f.model->forward(f.batch, lp_eval.data(), true, false, seed);
  EXPECT_NE(lp, lp_eval) << "dropout changes the training forward";
  f.model->forward(f.batch, lp.data(), true, true, seed);
  f.model->lora()->zero_grads();
  f.model->backward(f.weights.data());
  LoraParams& lora = *f.model->lora();
  std::vector<float> grads(lora.numel());
  f.ops->download(grads.data(), lora.grads(), grads.size() * 4);
  float* params = lora.params();  // host memory on the CPU backend
  for (const auto& s : lora.slots()) {
    for (const std::size_t off : {s.a_offset + 1, s.b_offset + 2}) {
      const double num = numeric_grad(f, true, seed, [&](float v) { params[off] = v; }, params[off]);
      EXPECT_NEAR(grads[off], num, 2e-3 * std::max(1e-2, std::abs(num)))
          << "layer " << s.layer << " " << module_name(s.module) << " offset " << off;
    }
  }
}

// PPO's value head reads the final hidden state and hands back its gradient: final_hidden() is Hugging Face's last
// hidden state (after the final norm), and backward(weights, {}, dhidden) gives the LoRA gradients of
// loss = -sum w logp + sum c . hidden (central differences on two coordinates of every LoRA slot).
TEST(ModelGradients, FinalHiddenStateAndItsGradient) {
  Fixture f("llama_gqa");
  const std::size_t H = static_cast<std::size_t>(f.cfg.hidden_size);
  std::vector<float> lp(f.batch.tokens.size());
  f.model->forward(f.batch, lp.data(), true, true);
  const std::vector<float> hidden = f.model->final_hidden();
  ASSERT_EQ(hidden.size(), f.batch.tokens.size() * H);
  EXPECT_LE(rel_error(hidden, f.valid_rows(f.reference("hidden_final"), H)), 1e-5) << "final hidden state";
  std::vector<float> c(hidden.size());
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(0.3 * std::sin(0.37 * static_cast<double>(i)));
  auto total = [&](const std::vector<float>& l) {
    double s = f.loss(l);
    const std::vector<float> h = f.model->final_hidden();
    for (std::size_t i = 0; i < h.size(); ++i) s += static_cast<double>(c[i]) * h[i];
    return s;
  };
  LoraParams& lora = *f.model->lora();
  lora.zero_grads();
  f.model->backward(f.weights.data(), {}, c.data());
  std::vector<float> grads(lora.numel()), without(lora.numel());
  f.ops->download(grads.data(), lora.grads(), grads.size() * 4);
  lora.zero_grads();
  f.model->forward(f.batch, lp.data(), true, true);
  f.model->backward(f.weights.data());
  f.ops->download(without.data(), lora.grads(), without.size() * 4);
  EXPECT_GT(rel_error(grads, without), 1e-2) << "dhidden changed nothing";
  float* params = lora.params();  // host memory on the CPU backend
  int checked = 0;
  for (const auto& s : lora.slots()) {
    for (const std::size_t off : {s.a_offset + 1, s.b_offset + 2}) {
      const float x0 = params[off];
      auto central = [&](float h) {
        params[off] = x0 + h;
        f.model->forward(f.batch, lp.data(), true, true);
        const double up = total(lp);
        params[off] = x0 - h;
        f.model->forward(f.batch, lp.data(), true, true);
        const double down = total(lp);
        params[off] = x0;
        return (up - down) / (2.0 * h);
      };
      const float h = 4e-2f * std::max(1.0f, std::abs(x0));
      const double num = (4.0 * central(h / 2) - central(h)) / 3.0;
      // f32 rounding of the thousands of hidden values in the sum: 1% (a missing or mis-signed dhidden is off by
      // far more; see the check against the gradients without it above)
      EXPECT_NEAR(grads[off], num, 1e-2 * std::max(1e-2, std::abs(num)))
          << "layer " << s.layer << " " << module_name(s.module) << " offset " << off;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
}

TEST(ModelErrors, BadTokensAndLengthsAreUserErrors) {
  Fixture f("llama_gqa");
  std::vector<float> lp(f.batch.tokens.size());
  Batch bad = f.batch;
  bad.tokens[1] = static_cast<std::int32_t>(f.cfg.vocab_size);
  EXPECT_THROW(f.model->forward(bad, lp.data()), UserError);
  bad = f.batch;
  bad.offsets[1] = bad.offsets[0];  // an empty first sequence
  EXPECT_THROW(f.model->forward(bad, lp.data()), UserError);
}

}  // namespace
}  // namespace mgrl::model

namespace mgrl::model {
namespace {

// The PEFT adapter mgrl writes has PEFT's layout: the same tensor names, shapes and values as the fixture
// adapter written by PEFT itself, an adapter_config.json that reads back to the same LoRA settings, and the
// same log-probs when loaded again.
TEST(PeftExport, RoundTripMatchesThePeftFixture) {
  for (const std::string name : {"llama_gqa", "qwen2_bias_tied"}) {
    Fixture f(name);
    const std::string dir = ::testing::TempDir() + "mgrl_peft_" + name;
    f.model->lora()->save_peft(dir, kData + name);
    io::SafetensorsFile ours(dir + "/adapter_model.safetensors"), peft(kData + name + "/adapter_model.safetensors");
    ASSERT_EQ(ours.tensors().size(), peft.tensors().size()) << name;
    for (const auto& t : peft.tensors()) {
      const io::TensorInfo& o = ours.get(t.name);
      EXPECT_EQ(o.shape, t.shape) << t.name;
      EXPECT_EQ(io::to_f32(o), io::to_f32(t)) << t.name;
    }
    const LoraConfig a = read_peft_config(dir + "/adapter_config.json"),
                     b = read_peft_config(kData + name + "/adapter_config.json");
    EXPECT_EQ(a.r, b.r);
    EXPECT_EQ(a.alpha, b.alpha);
    EXPECT_EQ(a.use_rslora, b.use_rslora);
    EXPECT_EQ(std::set<std::string>(a.targets.begin(), a.targets.end()),
              std::set<std::string>(b.targets.begin(), b.targets.end()));
    std::vector<float> lp1(f.batch.tokens.size()), lp2(lp1.size());
    f.model->forward(f.batch, lp1.data());
    f.model->add_lora(a, 99).load_peft(dir);
    f.model->forward(f.batch, lp2.data());
    EXPECT_EQ(lp1, lp2) << name;
  }
}

// An adapter trained on a vision-language checkpoint's language model is written as PEFT wrote the fixture's: the
// module names of the language model (base_model.model.model.language_model.layers...) and target_modules as the
// regular expression that keeps PEFT's LoRA off the vision tower (tools/make_vlm_fixtures.py loads that adapter
// with PEFT); it reads back to the same settings and log-probs. The Hub fixture's adapter (transformers 4.50 names,
// another expression) reads to the same adapter.
TEST(PeftExport, VisionLanguageAdapterAsPeftWritesIt) {
  Fixture f("gemma3_vlm", {}, "gemma3_text");
  const std::string dir = ::testing::TempDir() + "mgrl_peft_gemma3_vlm";
  f.model->lora()->save_peft(dir, kData + "gemma3_vlm");
  io::SafetensorsFile ours(dir + "/adapter_model.safetensors"), peft(kData + "gemma3_vlm/adapter_model.safetensors");
  ASSERT_EQ(ours.tensors().size(), peft.tensors().size());
  for (const auto& t : peft.tensors()) {
    ASSERT_NE(t.name.find("model.language_model.layers."), std::string::npos) << t.name;
    EXPECT_EQ(io::to_f32(ours.get(t.name)), io::to_f32(t)) << t.name;
  }
  nlohmann::json a, b;
  std::ifstream(dir + "/adapter_config.json") >> a;
  std::ifstream(kData + "gemma3_vlm/adapter_config.json") >> b;
  EXPECT_EQ(a["target_modules"], b["target_modules"]);
  const LoraConfig back = read_peft_config(dir + "/adapter_config.json"),
                   hub = read_peft_config(kData + "gemma3_vlm_hub/adapter_config.json");
  const std::set<std::string> all{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  EXPECT_EQ(std::set<std::string>(back.targets.begin(), back.targets.end()), all);
  EXPECT_EQ(std::set<std::string>(hub.targets.begin(), hub.targets.end()), all);
  std::vector<float> lp1(f.batch.tokens.size()), lp2(lp1.size()), lp3(lp1.size());
  f.model->forward(f.batch, lp1.data());
  f.model->add_lora(back, 99).load_peft(dir);
  f.model->forward(f.batch, lp2.data());
  EXPECT_EQ(lp1, lp2);
  Fixture h("gemma3_vlm_hub", {}, "gemma3_text");
  h.model->forward(h.batch, lp3.data());
  EXPECT_EQ(lp1, lp3);
}

// target_modules as a regular expression (PEFT's re.fullmatch of whole module names): read as the projections it
// selects in some module tree, then taken by a model for what it selects in every one of its own layers (a causal
// LM's model.layers.N; one selected in some layers only is refused); "all-linear" is the seven projections; an
// expression that selects none, or does not compile: one line naming the file.
TEST(PeftConfig, TargetModulesRegularExpression) {
  const auto config = [](const nlohmann::json& targets, nlohmann::json extra = nlohmann::json::object()) {
    extra["r"] = 4;
    extra["lora_alpha"] = 8;
    extra["target_modules"] = targets;
    return peft_config_from_json(extra, "a.json");
  };
  EXPECT_EQ(config(".*\\.(q_proj|v_proj)").targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(config("model\\.layers\\.\\d+\\.mlp\\..*").targets,
            (std::vector<std::string>{"gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(config("all-linear").targets.size(), 7u);
  const auto error = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error([&] { config("vision_tower.*"); }),
            "a.json: key 'target_modules' = \"vision_tower.*\" selects none of q_proj, k_proj, v_proj, o_proj, gate_proj, "
            "up_proj, down_proj of the decoder layers");
  EXPECT_NE(error([&] { config("(q_proj"); }).find("a.json: key 'target_modules' = \"(q_proj\" is not a regular expression"),
            std::string::npos);
  EXPECT_EQ(error([&] { config(".*q_proj", {{"exclude_modules", {"model.layers.0.self_attn.q_proj"}}}); }),
            "a.json: exclude_modules is not supported");
  // With the model (gemma3_text: 7 layers): layers 0-99 are all of its layers; 0-3 are some of them only; a vision-
  // language checkpoint's names select nothing of a causal LM.
  const io::ModelConfig cfg = io::parse_hf_config(kData + "gemma3_text/config.json");
  auto ops = kernels::make_cpu_ops();
  EXPECT_EQ(LoraParams(cfg, config(".*\\.layers\\.([0-9]|[1-9][0-9])\\.self_attn\\.(q|v)_proj"), *ops).slots().size(), 14u);
  EXPECT_EQ(error([&] { LoraParams(cfg, config(".*layers\\.[0-3]\\..*q_proj"), *ops); }),
            "a.json: key 'target_modules' = \".*layers\\.[0-3]\\..*q_proj\" selects q_proj in 4 of this model's 7 layers "
            "only; adapters on some layers are not supported");
  EXPECT_EQ(error([&] { LoraParams(cfg, config("model\\.language_model\\.layers\\.\\d+\\.self_attn\\.q_proj"), *ops); }),
            "a.json: key 'target_modules' = \"model\\.language_model\\.layers\\.\\d+\\.self_attn\\.q_proj\" selects none "
            "of this model's projections (model.layers.N.self_attn.q_proj, ...)");
}

// llm_int8_skip_modules as transformers 5.24's should_convert_module reads it (each expectation printed by that
// function): a regular expression from the module name's start to a boundary, or a suffix; no longer any substring.
TEST(Bnb, SkipModulesAsTransformersMatchesThem) {
  struct Case {
    const char* module;
    const char* key;
    bool skipped;
  };
  const Case cases[] = {
      {"model.layers.1.self_attn.q_proj", "model.layers.1", true},
      {"model.layers.11.self_attn.q_proj", "model.layers.1", false},
      {"model.layers.11.self_attn.q_proj", "model.layers.*", true},
      {"model.layers.0.mlp.gate_proj", "mlp.gate", false},
      {"model.layers.0.mlp.gate_proj", "gate_proj", true},
      {"model.layers.0.mlp.gate_proj", "mlp", false},
      {"model.language_model.layers.3.self_attn.q_proj", "model.language_model", true},
      {"model.language_model.layers.3.self_attn.q_proj", "lm_head", false},
      {"model.layers.2.mlp.down_proj", "model.layers.2.mlp", true},
      {"model.layers.2.mlp.down_proj", "model.layers.2.ml", false},
      {"model.layers.12.self_attn.o_proj", "model\\.layers\\.1[0-9]\\.self_attn", true},
      {"model.layers.3.self_attn.o_proj", "layers.3", false},
      {"model.layers.3.self_attn.o_proj", "self_attn.o_proj", true},
  };
  for (const Case& c : cases) EXPECT_EQ(bnb_skipped(c.module, {c.key}), c.skipped) << c.module << " / " << c.key;
}

// NEFTune (train.neftune_noise_alpha): the CPU op adds uniform noise within each row's magnitude, mean 0 and
// variance magnitude^2 / 3, the same for one key wherever its row sits; in the model it changes training forwards
// only (deterministically for a seed, otherwise for another), a sequence gets the same noise alone as in its batch
// (so any rank count adds the same), and the magnitude is alpha / sqrt(length x hidden) of each sequence.
TEST(Neftune, EmbeddingNoiseIsPerSequenceAndTrainingOnly) {
  auto ops = kernels::make_cpu_ops();
  const int rows = 3, cols = 4000;
  std::vector<float> x(static_cast<std::size_t>(rows) * cols, 1.0f), scale{0.5f, 0.25f, 0.5f};
  const std::vector<std::uint64_t> keys{11, 12, 11};
  ops->add_uniform_noise(x.data(), rows, cols, scale.data(), 99, keys.data());
  for (int t = 0; t < rows; ++t) {
    double sum = 0, sq = 0, most = 0;
    for (int j = 0; j < cols; ++j) {
      const double d = x[static_cast<std::size_t>(t * cols + j)] - 1.0;
      sum += d;
      sq += d * d;
      most = std::max(most, std::fabs(d));
    }
    EXPECT_LE(most, scale[t]) << t;
    EXPECT_GT(most, 0.95 * scale[t]) << t;
    EXPECT_NEAR(sum / cols, 0.0, 0.03 * scale[t]) << t;
    EXPECT_NEAR(sq / cols, scale[t] * scale[t] / 3.0, 0.1 * scale[t] * scale[t] / 3.0) << t;
  }
  for (int j = 0; j < cols; ++j) EXPECT_EQ(x[static_cast<std::size_t>(j)], x[static_cast<std::size_t>(2 * cols + j)]);

  Fixture f("llama_gqa");
  const std::size_t BL = f.batch.tokens.size();
  std::vector<float> plain(BL), noisy(BL), again(BL), other(BL), eval_plain(BL), eval_noisy(BL);
  f.model->forward(f.batch, plain.data(), true, true, 5);
  f.model->forward(f.batch, eval_plain.data(), true, false);
  f.model->set_embedding_noise(5.0f);
  f.model->forward(f.batch, noisy.data(), true, true, 5);
  f.model->forward(f.batch, again.data(), true, true, 5);
  f.model->forward(f.batch, other.data(), true, true, 6);
  f.model->forward(f.batch, eval_noisy.data(), true, false);
  EXPECT_EQ(noisy, again);
  EXPECT_NE(noisy, plain);
  EXPECT_NE(noisy, other);
  EXPECT_EQ(eval_noisy, eval_plain) << "an evaluation forward got noise";
  double moved = 0;
  for (std::size_t i = 0; i < BL; ++i) moved = std::max(moved, static_cast<double>(std::fabs(noisy[i] - plain[i])));
  EXPECT_GT(moved, 1e-3);
  // Sequence 1 alone, with its key in the batch (Batch::seq_keys; none: its index): the same log-probs.
  Batch one;
  std::vector<std::int32_t> seq(f.batch.tokens.begin() + f.batch.offsets[1], f.batch.tokens.begin() + f.batch.offsets[2]);
  one.add(seq);
  one.seq_keys.push_back(1);
  std::vector<float> alone(seq.size());
  f.model->forward(one, alone.data(), true, true, 5);
  for (std::size_t t = 0; t < seq.size(); ++t)
    EXPECT_FLOAT_EQ(alone[t], noisy[static_cast<std::size_t>(f.batch.offsets[1]) + t]) << t;
  // The magnitude: alpha 0.05 moves the log-probs about 100 times less than alpha 5 (first order in the noise).
  f.model->set_embedding_noise(0.05f);
  std::vector<float> small(BL);
  f.model->forward(f.batch, small.data(), true, true, 5);
  double moved_small = 0;
  for (std::size_t i = 0; i < BL; ++i) moved_small = std::max(moved_small, static_cast<double>(std::fabs(small[i] - plain[i])));
  EXPECT_GT(moved_small, moved / 300);
  EXPECT_LT(moved_small, moved / 30);
}

// The rotary inverse frequencies (model/rope_freq.h).
TEST(RopeFreq, DefaultInverseFrequencies) {
  for (double theta : {10000.0, 1000000.0}) {
    const int hd = 10;
    std::vector<float> f(hd / 2);
    rope_inv_freq(f.data(), hd, theta, nullptr);
    for (int j = 0; j < hd / 2; ++j) {
      // transformers takes the exponent 2j/dim in fp32 (0.6f = 0.60000002), which moves theta^-0.6 by ~2e-7:
      // tight against that, looser against the exact value.
      const double e32 = static_cast<double>(static_cast<float>(2 * j) / static_cast<float>(hd));
      const double want32 = 1.0 / std::pow(theta, e32), exact = 1.0 / std::pow(theta, 2.0 * j / hd);
      EXPECT_NEAR(f[j], want32, 1.2e-7 * want32) << theta << " j=" << j;
      EXPECT_NEAR(f[j], exact, 1e-6 * exact) << theta << " j=" << j;
    }
  }
  EXPECT_THROW(rope_inv_freq(nullptr, 7, 10000.0, nullptr), FatalError);
}

// Llama 3.2 1B: rope_theta 500000, head_dim 64, rope_scaling {factor 32, low 1, high 4, original 8192}.
// By hand: wavelen_j = 2*pi * 500000^(j/32) is below high_wl = 8192/4 = 2048 for j <= 14 (kept), above
// low_wl = 8192 for j >= 18 (divided by the factor), and in between for j = 15, 16, 17 (smoothed).
TEST(RopeFreq, Llama3InverseFrequencies) {
  const int hd = 64, half = hd / 2;
  const double theta = 500000.0, factor = 32.0, low = 1.0, high = 4.0, orig = 8192.0;
  Llama3RopeScaling sc;
  sc.factor = factor;
  sc.low_freq_factor = low;
  sc.high_freq_factor = high;
  sc.original_max_position_embeddings = orig;
  std::vector<float> plain(half), scaled(half);
  rope_inv_freq(plain.data(), hd, theta, nullptr);
  rope_inv_freq(scaled.data(), hd, theta, &sc);
  for (int j = 0; j <= 14; ++j) EXPECT_EQ(scaled[j], plain[j]) << j;
  for (int j = 18; j < half; ++j) EXPECT_EQ(scaled[j], plain[j] / 32.0f) << j;
  for (int j = 15; j <= 17; ++j) {
    const double f = 1.0 / std::pow(theta, 2.0 * j / hd);
    const double wavelen = 2.0 * M_PI / f;
    ASSERT_GE(wavelen, orig / high);
    ASSERT_LE(wavelen, orig / low);
    const double s = (orig / wavelen - low) / (high - low);
    const double want = (1.0 - s) * f / factor + s * f;
    EXPECT_NEAR(scaled[j], want, 1e-6 * want) << j;
    EXPECT_LT(scaled[j], plain[j]);
    EXPECT_GT(scaled[j], plain[j] / 32.0f);
  }
  // Two values worked out by hand from the formula (j = 16: f = 500000^-0.5).
  EXPECT_NEAR(scaled[0], 1.0f, 0.0f);
  const double f16 = 1.0 / std::sqrt(500000.0);
  const double s16 = (8192.0 * f16 / (2.0 * M_PI) - 1.0) / 3.0;
  EXPECT_NEAR(scaled[16], (1.0 - s16) * f16 / 32.0 + s16 * f16, 1e-6 * f16);
}

// YaRN (rope_type "yarn"): the config parsed as mgrl reads it, its frequencies and attention factor against
// transformers' _compute_yarn_parameters on four configurations (tests/data/rope/yarn.json,
// tools/make_rope_fixtures.py): Qwen's 128k setting, explicit betas without truncation and mscale/mscale_all_dim, a
// given attention factor with low == high, and a null factor (max_position_embeddings / original).
TEST(RopeFreq, YarnMatchesTransformers) {
  const auto fixture = nlohmann::json::parse(std::ifstream(MGRL_TEST_DATA_DIR "/rope/yarn.json"));
  ASSERT_EQ(fixture["cases"].size(), 4u);
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["name"];
    const int hd = c["head_dim"];
    const nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 16}, {"hidden_size", hd * 4},
                                {"intermediate_size", 8}, {"num_hidden_layers", 1}, {"num_attention_heads", 4},
                                {"head_dim", hd}, {"rms_norm_eps", 1e-6},
                                {"max_position_embeddings", c["max_position_embeddings"]},
                                {"rope_parameters", c["rope_parameters"]}};
    const io::ModelConfig mc = io::parse_hf_config(test::write_temp("yarn_" + name + ".json", cfg.dump()));
    ASSERT_TRUE(mc.rope_scaling.has_value()) << name;
    const io::RopeScaling& rs = *mc.rope_scaling;
    EXPECT_EQ(rs.rope_type, "yarn");
    EXPECT_NEAR(rs.attention_factor, c["attention_factor"].get<double>(), 1e-12) << name;
    EXPECT_NEAR(mc.layer_rope_attention_factor(0), c["attention_factor"].get<double>(), 1e-12) << name;
    YarnRopeScaling y;
    y.factor = rs.factor;
    y.beta_fast = rs.beta_fast;
    y.beta_slow = rs.beta_slow;
    y.original_max_position_embeddings = static_cast<double>(rs.original_max_position_embeddings);
    y.truncate = rs.truncate;
    std::vector<float> f(static_cast<std::size_t>(hd / 2)), plain(f.size());
    rope_yarn_inv_freq(f.data(), hd, mc.rope_theta, y);
    rope_inv_freq(plain.data(), hd, mc.rope_theta, nullptr);
    const auto& want = c["inv_freq"];
    ASSERT_EQ(want.size(), f.size());
    int ramp = 0;  // frequencies strictly between the plain and the divided one
    for (std::size_t j = 0; j < f.size(); ++j) {
      const float w = want[j].get<float>();
      EXPECT_NEAR(f[j], w, 2.5e-7 * w) << name << " j=" << j;  // transformers' fp32 steps, a rounding apart at most
      if (f[j] < plain[j] * 0.999f && f[j] > plain[j] / static_cast<float>(y.factor) * 1.001f) ++ramp;
    }
    if (name != "attention_factor") {
      EXPECT_GT(ramp, 0) << name << ": the ramp is not exercised";
    }
  }
}

}  // namespace
}  // namespace mgrl::model
