// test_distill.cpp: knowledge distillation (`mgrl distill`, trl's DistillationTrainer): the divergence fused with the
// LM head (Ops::lm_head_divergence) against trl's own ChunkedDivergenceFunction (tests/data/distill/ops, written by
// tools/make_distill_fixtures.py): forward KL, reverse KL and the generalized JSD, temperatures, soft-capping, rows of
// weight 0; the per-token divergence, the student's entropy and the gradients of its hidden states and LM head. And a
// whole step (tests/data/distill/<case>): the teacher's pass to its LM head's input (Transformer::as_teacher) and the
// student's fused forward (forward_with_divergence) and backward against trl's DistillationTrainer._compute_loss:
// the loss, the entropy and every LoRA gradient, for teachers wider, narrower and soft-capped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/batch.h"
#include "model/transformer.h"
#include "tests/unit/lora_grads.h"

namespace mgrl {
namespace {

const std::string kData = MGRL_TEST_DATA_DIR;

std::vector<std::string> op_cases() {
  std::vector<std::string> out;
  std::ifstream in(kData + "/distill/ops/cases.json");
  if (!in) return out;
  nlohmann::json j;
  in >> j;
  for (const auto& c : j["cases"]) out.push_back(c["name"].get<std::string>());
  return out;
}

// |got - want| within rtol of the largest |want| (the values of one tensor share a scale), element by element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-6;
  for (float x : want) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::fabs(static_cast<double>(got[i]) - want[i]) > rtol * scale && ++bad <= 3)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs trl's " << want[i] << " (scale " << scale << ")";
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " values off";
}

TEST(DistillOps, FixturesPresent) { EXPECT_GE(op_cases().size(), 4u) << "tests/data/distill/ops holds too few cases"; }

class DistillOpCase : public ::testing::TestWithParam<std::string> {};

TEST_P(DistillOpCase, DivergenceEntropyAndGradientsMatchTrl) {
  nlohmann::json spec;
  {
    std::ifstream in(kData + "/distill/ops/cases.json");
    nlohmann::json j;
    in >> j;
    for (const auto& c : j["cases"])
      if (c["name"] == GetParam()) spec = c;
  }
  io::SafetensorsFile f(kData + "/distill/ops/" + GetParam() + ".safetensors");
  const auto get = [&f](const char* name) { return io::to_f32(f.get(name)); };
  const int T = spec["T"], V = spec["V"], D = spec["D"], Dt = spec["Dt"];
  const float beta = spec["beta"].get<float>(), inv_t = 1.0f / spec["temperature"].get<float>();
  const float s_cap = spec.value("s_softcap", 0.0f), t_cap = spec.value("t_softcap", 0.0f);
  const auto h = get("h"), W = get("W"), th = get("th"), tW = get("tW"), weights = get("weights");
  auto ops = kernels::make_cpu_ops();
  std::vector<float> div(T), ent(T), dh(static_cast<std::size_t>(T) * D, 7.0f), dW(static_cast<std::size_t>(V) * D, 0.0f);
  ops->lm_head_divergence(div.data(), ent.data(), dh.data(), dW.data(), weights.data(), h.data(), W.data(), T, D, V,
                          inv_t, s_cap, th.data(), tW.data(), Dt, inv_t, t_cap, beta);
  expect_close(div, get("div"), 2e-5, "divergence");
  expect_close(ent, get("entropy"), 2e-5, "entropy");
  expect_close(dh, get("grad_h"), 2e-5, "dh");
  expect_close(dW, get("grad_W"), 2e-5, "dW");
  // The forward alone (no backward) gives the same divergence and entropy
  std::vector<float> div2(T), ent2(T);
  ops->lm_head_divergence(div2.data(), ent2.data(), nullptr, nullptr, nullptr, h.data(), W.data(), T, D, V, inv_t,
                          s_cap, th.data(), tW.data(), Dt, inv_t, t_cap, beta);
  EXPECT_EQ(div2, div);
  EXPECT_EQ(ent2, ent);
}

INSTANTIATE_TEST_SUITE_P(Trl, DistillOpCase, ::testing::ValuesIn(op_cases()));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DistillOpCase);

// The divergence of a student equal to its teacher is 0 for every beta, and its gradient 0.
TEST(DistillOps, EqualDistributionsGiveZero) {
  const int T = 5, V = 11, D = 6;
  std::vector<float> h(T * D), W(V * D);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = std::sin(0.7 * i);
  for (std::size_t i = 0; i < W.size(); ++i) W[i] = std::cos(1.3 * i);
  auto ops = kernels::make_cpu_ops();
  const std::vector<float> weights(T, 1.0f);
  for (float beta : {0.0f, 0.3f, 1.0f}) {
    std::vector<float> div(T, -1.0f), dh(T * D, 1.0f);
    ops->lm_head_divergence(div.data(), nullptr, dh.data(), nullptr, weights.data(), h.data(), W.data(), T, D, V, 1.0f,
                            0.0f, h.data(), W.data(), D, 1.0f, 0.0f, beta);
    for (float d : div) EXPECT_NEAR(d, 0.0f, 1e-6) << "beta " << beta;
    for (float g : dh) EXPECT_NEAR(g, 0.0f, 1e-6) << "beta " << beta;
  }
}

std::vector<std::string> step_cases() {
  std::vector<std::string> out;
  for (const char* name : {"jsd_qwen2", "forward_kl_llama", "reverse_kl_gemma2_softcap", "full_jsd_qwen2"})
    if (std::ifstream(kData + "/distill/" + name + "/case.json")) out.push_back(name);
  return out;
}

TEST(DistillStep, FixturesPresent) { EXPECT_EQ(step_cases().size(), 4u); }

class DistillStepCase : public ::testing::TestWithParam<std::string> {};

TEST_P(DistillStepCase, LossEntropyAndLoraGradientsMatchTrl) {
  const std::string dir = kData + "/distill/" + GetParam();
  nlohmann::json c;
  std::ifstream(dir + "/case.json") >> c;
  const std::string student_dir = kData + "/models/" + c["student"].get<std::string>();
  const std::string teacher_dir = kData + "/distill/teachers/" + c["teacher"].get<std::string>();
  auto ops = kernels::make_cpu_ops();
  const bool full = c.value("full", false);  // full fine-tuning: every weight's gradient
  std::unique_ptr<model::Transformer> student;
  if (full) {
    model::ModelOptions mo;
    mo.full_finetune = true;
    student = std::make_unique<model::Transformer>(io::parse_hf_config(student_dir + "/config.json"), *ops, mo);
    student->load_weights(student_dir);
  } else {
    student = test::lora_model(*ops, student_dir, student_dir);
  }
  model::Transformer teacher(io::parse_hf_config(teacher_dir + "/config.json"), *ops);
  teacher.load_weights(teacher_dir);

  model::Batch b;
  std::vector<float> w;
  double tokens = 0;
  for (const auto& s : c["sequences"]) tokens += static_cast<double>(s["completion_ids"].size());
  for (const auto& s : c["sequences"]) {
    auto seq = s["prompt_ids"].get<std::vector<std::int32_t>>();
    const int prompt = static_cast<int>(seq.size());
    for (int x : s["completion_ids"]) seq.push_back(x);
    b.add(seq);
    b.scored_from.push_back(prompt);
    for (int t = 0; t < static_cast<int>(seq.size()); ++t) w.push_back(t >= prompt ? static_cast<float>(1.0 / tokens) : 0.0f);
  }
  const model::Transformer::Teacher t = teacher.as_teacher(b);
  double* acc = static_cast<double*>(ops->alloc(2 * sizeof(double)));
  ops->zero(acc, 2 * sizeof(double));
  student->forward_with_divergence(b, w.data(), 1.0, acc, t, c["beta"].get<float>(),
                                   1.0f / c["temperature"].get<float>(), 0, acc + 1);
  student->backward(nullptr);
  double got[2];
  ops->download(got, acc, sizeof got);
  // The held-out pass (no gradient, the scoring arena): the same loss and entropy
  ops->zero(acc, 2 * sizeof(double));
  student->score_divergence(b, w.data(), acc, teacher.as_teacher(b), c["beta"].get<float>(),
                            1.0f / c["temperature"].get<float>(), acc + 1);
  double scored[2];
  ops->download(scored, acc, sizeof scored);
  ops->release(acc);
  EXPECT_NEAR(scored[0], got[0], 1e-6 * std::fabs(got[0])) << "score_divergence's loss";
  EXPECT_NEAR(scored[1], got[1], 1e-6 * std::fabs(got[1])) << "score_divergence's entropy";
  const double want = c["loss"].get<double>(), want_ent = c["entropy"].get<double>();
  EXPECT_NEAR(got[0], want, 1e-5 * std::fabs(want)) << "loss";
  EXPECT_NEAR(got[1], want_ent, 1e-5 * std::fabs(want_ent)) << "entropy";
  if (!full) {
    test::expect_lora_grads_match(*student, *ops, dir + "/grads.safetensors");
    return;
  }
  io::SafetensorsFile grads(dir + "/grads.safetensors");
  std::vector<float> host(student->base_numel());
  ops->download(host.data(), student->base_grads(), host.size() * sizeof(float));
  int compared = 0;
  for (const auto& t : student->base_tensors()) {
    const auto want_g = io::to_f32(grads.get(t.name));
    const std::vector<float> got_g(host.begin() + static_cast<std::ptrdiff_t>(t.offset),
                                   host.begin() + static_cast<std::ptrdiff_t>(t.offset + want_g.size()));
    expect_close(got_g, want_g, 1e-4, t.name);
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(grads.tensors().size())) << "trl's student has other weights";
}

INSTANTIATE_TEST_SUITE_P(Trl, DistillStepCase, ::testing::ValuesIn(step_cases()));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DistillStepCase);

}  // namespace
}  // namespace mgrl
