// test_dpo.cpp: DPO: every loss type's derivative against finite differences; the whole micro-batch computation
// (packed pairs, sequence log-probs with LD-DPO weights, the sft term, reference with the adapter off or the starting adapter,
// loss, trl's metrics, every LoRA gradient) against fixtures written by the real trl DPOTrainer (tests/data/dpo,
// tools/make_dpo_fixtures.py) on the tiny model fixtures; preference pairs read from JSONL (strings and chat
// messages) and their errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "tests/unit/lora_grads.h"
#include "tests/unit/test_util.h"
#include "train/dpo.h"
#include "train/dpo_data.h"
#include "train/dpo_loss.h"

namespace mgrl::train {
namespace {

const std::string kData = MGRL_TEST_DATA_DIR;
const std::string kSource = MGRL_SOURCE_DIR;

// d loss / d chosen and d loss / d rejected against central differences, for every loss type, on pairs where the
// reward margin is negative, small and large (the hinge's flat side included).
TEST(DpoPairLoss, DerivativesMatchFiniteDifferences) {
  int checked = 0;
  for (auto type : {DpoLossType::Sigmoid, DpoLossType::Hinge, DpoLossType::Ipo, DpoLossType::Robust,
                    DpoLossType::SigmoidNorm, DpoLossType::ExoPair, DpoLossType::NcaPair, DpoLossType::BcoPair,
                    DpoLossType::SppoHard, DpoLossType::ApoZero, DpoLossType::ApoDown, DpoLossType::DiscoPop})
    for (const char* f : {"reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"})
    for (double margin : {-3.0, 0.4, 25.0}) {
      if (std::string(f) != "reverse_kl" && !dpo_loss_of_difference(type)) continue;  // refused at start-up
      DpoLossOptions o;
      o.type = type;
      o.f_divergence = f;
      o.f_alpha = 0.3;
      o.beta = 0.2;
      o.label_smoothing = 0.15;
      DpoPairIn p{-10.0 + margin, -10.0, -11.0, -10.5, 4, 7};
      const DpoPairOut out = dpo_pair_loss(o, p);
      const double h = 1e-5;
      auto at = [&](double dc, double dr) {
        DpoPairIn q = p;
        q.chosen += dc;
        q.rejected += dr;
        return dpo_pair_loss(o, q).loss;
      };
      const double fc = (at(h, 0) - at(-h, 0)) / (2 * h), fr = (at(0, h) - at(0, -h)) / (2 * h);
      EXPECT_NEAR(out.d_chosen, fc, 1e-6 * std::max(1.0, std::fabs(fc))) << dpo_loss_name(type) << " " << f << " " << margin;
      EXPECT_NEAR(out.d_rejected, fr, 1e-6 * std::max(1.0, std::fabs(fr))) << dpo_loss_name(type) << " " << f << " " << margin;
      EXPECT_NEAR(out.reward_chosen, 0.2 * (p.chosen - p.ref_chosen), 1e-12);
      EXPECT_TRUE(std::isfinite(out.loss));
      ++checked;
    }
  EXPECT_EQ(checked, 99);
  // The sigmoid loss at equal log-ratios is log 2; with a huge margin it stays finite (no exp overflow).
  EXPECT_NEAR(dpo_pair_loss({}, {-5, -7, -5, -7, 1, 1}).loss, std::log(2.0), 1e-15);
  DpoLossOptions beta1;  // sigmoid, beta 1
  beta1.beta = 1.0;
  const auto far = dpo_pair_loss(beta1, {0, -5000, 0, 0, 1, 1});
  EXPECT_EQ(far.loss, 0.0);
  const auto wrong = dpo_pair_loss(beta1, {-5000, 0, 0, 0, 1, 1});
  EXPECT_NEAR(wrong.loss, 5000.0, 1e-9);
  EXPECT_NEAR(wrong.d_chosen, -1.0, 1e-12);
}

// ---- against trl ----

std::vector<std::string> trl_cases() { return test::fixture_cases(kData + "/dpo"); }

// rewards/accuracies and logps/accuracies: a difference within the f32 rounding of the sequence log-probs is a tie
// (trl's equal values: a reference that is the policy, identical sequences), a real one a win.
TEST(DpoSums, RoundingNoiseIsATieNotAWin) {
  DpoLossOptions o;
  DpoSums s;
  DpoPairIn noise;  // the policy = the reference, chosen = rejected, up to the last bits of separate passes
  noise.chosen = -20.000001;
  noise.rejected = -20.000002;
  noise.ref_chosen = -20.000002;
  noise.ref_rejected = -20.000001;
  s.add(noise, dpo_pair_loss(o, noise));
  EXPECT_EQ(s.accuracy, 0.0);
  EXPECT_EQ(s.logp_accuracy, 0.0);
  DpoPairIn real = noise;
  real.chosen = -19.9;  // a preference of 0.1 nats
  s.add(real, dpo_pair_loss(o, real));
  EXPECT_EQ(s.accuracy, 1.0);
  EXPECT_EQ(s.logp_accuracy, 1.0);
}

TEST(DpoTrl, FixturesPresent) { EXPECT_GE(trl_cases().size(), 23u) << "tests/data/dpo holds too few cases"; }

class DpoTrlCase : public ::testing::TestWithParam<std::string> {};

TEST_P(DpoTrlCase, LossMetricsAndGradientsMatchTrl) {
  const std::string dir = kData + "/dpo/" + GetParam();
  nlohmann::json c;
  std::ifstream(dir + "/case.json") >> c;
  const auto& k = c["config"];
  const std::string model_dir = kData + "/models/" + c["model"].get<std::string>();
  auto ops = kernels::make_cpu_ops();
  const auto policy = test::lora_model(*ops, model_dir, dir + "/adapter");
  model::Transformer& net = *policy;

  // The pairs as load_pairs leaves them: prompt + completion, cut to max_length (trl's collator, keep_start).
  const auto max_length = static_cast<std::size_t>(k["max_length"].get<int>());
  std::vector<PreferencePair> pairs;
  for (const auto& p : c["pairs"]) {
    PreferencePair pr;
    const auto prompt = p["prompt_ids"].get<std::vector<std::int32_t>>();
    pr.prompt_len = static_cast<std::int32_t>(prompt.size());
    for (const char* key : {"chosen_ids", "rejected_ids"}) {
      auto s = prompt;
      const auto comp = p[key].get<std::vector<std::int32_t>>();
      s.insert(s.end(), comp.begin(), comp.end());
      s.resize(std::min(s.size(), max_length));
      (std::string(key) == "chosen_ids" ? pr.chosen : pr.rejected) = s;
    }
    pairs.push_back(pr);
  }
  std::vector<const PreferencePair*> mb;
  for (const auto& p : pairs) mb.push_back(&p);
  const double ld_alpha = k["ld_alpha"].is_null() ? 1.0 : k["ld_alpha"].get<double>();
  std::vector<float> tw, lp, w;
  const model::Batch b = dpo_batch(mb, ld_alpha, &tw);
  lp.assign(b.tokens.size(), 0.0f);
  std::vector<double> ref;
  if (k["reference"] == "base") {
    net.score(b, lp.data(), false);  // the adapter switched off
  } else {  // trl's frozen copy of the starting adapter: the fixture model's own
    test::lora_model(*ops, model_dir, model_dir)->score(b, lp.data(), true);
  }
  ref = dpo_sequence_logps(b, tw, lp.data());
  lp.assign(b.tokens.size(), 0.0f);
  net.set_token_stats(true);
  net.forward(b, lp.data(), true, true, 0);
  const auto pol = dpo_sequence_logps(b, tw, lp.data());

  DpoLossOptions o;
  o.type = dpo_loss_type(k["loss_type"].get<std::string>());
  o.beta = k["beta"].get<double>();
  o.label_smoothing = k["label_smoothing"].get<double>();
  o.sft_weight = k.value("sft_weight", 0.0);
  o.discopop_tau = k.value("discopop_tau", 0.05);
  o.f_divergence = k.value("f_divergence_type", std::string("reverse_kl"));
  if (k.contains("loss_mix"))  // trl's loss_type list with loss_weights (dpo.loss_mix); "sft" is the sft weight
    for (const auto& item : k["loss_mix"]) {
      const std::string t = item[0].get<std::string>();
      if (t == "sft") o.sft_weight += item[1].get<double>();
      else o.mix.emplace_back(dpo_loss_type(t), item[1].get<double>());
    }
  const double N = static_cast<double>(pairs.size());
  DpoSums sums;
  dpo_token_metrics(mb, b, net.token_stats(), &sums);
  // WPO (trl's use_weighting, in fixtures written since 2026-11-29): the pair weights from the same forward.
  o.use_weighting = k.value("use_weighting", false);
  const std::vector<double> pw = o.use_weighting ? wpo_weights(mb, b, lp.data(), net.token_stats()) : std::vector<double>();
  if (o.use_weighting) {
    double lo = 1, hi = 0;
    for (const double x : pw) lo = std::min(lo, x), hi = std::max(hi, x);
    EXPECT_LT(hi, 1.0);
    EXPECT_GT(hi - lo, 1e-3 * hi) << "the WPO weights are all alike: they check little";
  }
  dpo_loss_weights(o, mb, b, tw, lp.data(), pol, ref, 1.0 / N, o.sft_weight / chosen_tokens(mb), &w, &sums,
                   pw.empty() ? nullptr : &pw);
  const double loss = sums.total_loss(o.sft_weight), want = c["loss"].get<double>();
  EXPECT_LE(std::fabs(loss - want), 1e-5 * std::max(1e-3, std::fabs(want))) << "loss " << loss << " vs " << want;
  const auto& m = c["metrics"];
  const std::vector<std::pair<const char*, double>> got{
      {"rewards/chosen", sums.reward_chosen / N}, {"rewards/rejected", sums.reward_rejected / N},
      {"rewards/accuracies", sums.accuracy / N},  {"rewards/margins", sums.margin / N},
      {"logps/chosen", sums.logp_chosen / N},     {"logps/rejected", sums.logp_rejected / N}};
  // A reward is beta x a difference of two sequence log-probs of ~20 nats each: mgrl's f32 forward knows those to
  // ~1e-7 relative, so a reward near 0 is compared against beta x |logps| (the scale its error has).
  const double scale = o.beta * std::fabs(m["logps/chosen"].get<double>());
  for (const auto& [name, v] : got) {
    ASSERT_TRUE(m.contains(name)) << name;
    const double x = m[name].get<double>();
    const double floor = std::string(name).rfind("rewards/", 0) == 0 ? scale : 0.0;
    EXPECT_LE(std::fabs(v - x), 1e-5 * std::max(std::fabs(x), floor)) << name << ": " << v << " vs " << x;
  }
  // trl's token metrics (in fixtures written since 2026-11-29): entropy over both completions, the chosen tokens'
  // top-1 accuracy, the mean logits of each side.
  if (m.contains("entropy")) {
    const std::vector<std::pair<const char*, double>> tok{
        {"entropy", sums.entropy / sums.completion_tokens},
        {"mean_token_accuracy", sums.top1_chosen / sums.chosen_count},
        {"logits/chosen", sums.logits_chosen / sums.chosen_count},
        {"logits/rejected", sums.logits_rejected / sums.rejected_count}};
    for (const auto& [name, v] : tok) {
      ASSERT_TRUE(m.contains(name)) << name;
      const double x = m[name].get<double>();
      EXPECT_LE(std::fabs(v - x), 1e-5 * std::max(1.0, std::fabs(x))) << name << ": " << v << " vs " << x;
    }
  }

  net.backward(w.data());
  test::expect_lora_grads_match(net, *ops, dir + "/grads.safetensors");
}

INSTANTIATE_TEST_SUITE_P(Trl, DpoTrlCase, ::testing::ValuesIn(trl_cases()));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DpoTrlCase);

// ---- preference pairs from JSONL ----

TEST(DpoPairs, StringsAreTokenizedAsTrlDoes) {
  const auto tok = io::Tokenizer::from_dir(kSource + "/inputs/quickstart");
  const std::string f = test::write_temp("dpo_pairs.jsonl",
                                         "{\"prompt\": \"12+3=\", \"chosen\": \"15\", \"rejected\": \"105\"}\n"
                                         "\n"
                                         "{\"prompt\": \"1+1=\", \"chosen\": \"2\", \"rejected\": \"3\"}\n");
  const PairData d = load_pairs(f, tok, PairOptions{});
  ASSERT_EQ(d.pairs.size(), 2u);
  const auto& p = d.pairs[0];
  const auto prompt = tok.encode("12+3=", true);
  EXPECT_EQ(p.prompt_len, static_cast<int>(prompt.size()));
  auto want = tok.encode("12+3=15", true);
  want.push_back(*tok.eos_id());  // trl appends EOS to string completions
  EXPECT_EQ(p.chosen, want);
  EXPECT_EQ(p.rejected_tokens(), 4);  // "105" + EOS
  EXPECT_EQ(p.chosen_text, "15");
  // max_length keeps the start; a prompt of max_length tokens or more leaves the pair out (as trl).
  PairOptions cut;
  cut.max_length = 7;  // <bos> 1 2 + 3 = then 1 completion token of the first pair
  const PairData c = load_pairs(f, tok, cut);
  ASSERT_EQ(c.pairs.size(), 2u);
  EXPECT_EQ(c.pairs[0].chosen.size(), 7u);
  EXPECT_EQ(c.pairs[0].chosen_tokens(), 1);
  cut.max_length = 6;
  const PairData e = load_pairs(f, tok, cut);
  EXPECT_EQ(e.pairs.size(), 1u);
  EXPECT_EQ(e.dropped, 1);
  EXPECT_EQ(e.first_dropped_line, 1);
  cut.max_length = 2;
  EXPECT_NE(test::error_of([&] { load_pairs(f, tok, cut); }).find("no pairs left"), std::string::npos);
}

TEST(DpoPairs, ChatMessagesGoThroughTheTemplate) {
  const auto tok = io::Tokenizer::from_dir(kData + "/tokenizers/qwen2_bytelevel");
  const std::string f = test::write_temp(
      "dpo_chat.jsonl",
      "{\"prompt\": [{\"role\": \"user\", \"content\": \"Say hi\"}], \"chosen\": [{\"role\": \"assistant\", "
      "\"content\": \"Hi!\"}], \"rejected\": \"No.\"}\n");
  io::ChatOptions co;
  co.format = "chatml";
  const io::ChatTemplate chat(tok, co);
  PairOptions o;
  o.chat = &chat;
  const PairData d = load_pairs(f, tok, o);
  ASSERT_EQ(d.pairs.size(), 1u);
  const std::vector<io::Message> prompt{{"user", "Say hi"}};
  const auto pids = tok.encode_chat(prompt, io::ChatFormat::ChatML, true);
  EXPECT_EQ(d.pairs[0].prompt_len, static_cast<int>(pids.size()));
  EXPECT_EQ(d.pairs[0].chosen, tok.encode_chat({{"user", "Say hi"}, {"assistant", "Hi!"}}, io::ChatFormat::ChatML, false));
  EXPECT_EQ(d.pairs[0].rejected, tok.encode_chat({{"user", "Say hi"}, {"assistant", "No."}}, io::ChatFormat::ChatML, false));
  EXPECT_EQ(d.pairs[0].chosen_text, "Hi!");
}

// trl's DPOTrainer on the same lines (tests/data/sft_trl/dpo_*.jsonl, tools/make_sft_trl_fixtures.py, trl 1.16): a
// tool-call chosen with a tools column (every message field reaches the template), an implicit prompt of messages,
// a line's chat_template_kwargs, an implicit prompt of texts. Until 2026-11-28 the tool call trained as an empty
// answer, the tools and kwargs were ignored and the implicit forms refused (found by a TRL parity hunt).
TEST(DpoPairs, TrlFormsAsTrl) {
  const auto tok = io::Tokenizer::from_dir(kData + "/tokenizers/qwen2_bytelevel");
  io::ChatOptions co;
  co.template_path = kData + "/sft_trl/tools.jinja";
  const io::ChatTemplate chat(tok, co);
  PairOptions o;
  o.chat = &chat;
  const PairData d = load_pairs(kData + "/sft_trl/dpo_input.jsonl", tok, o);
  std::ifstream f(kData + "/sft_trl/dpo_expected.jsonl");
  std::string line;
  std::size_t i = 0;
  for (; std::getline(f, line); ++i) {
    ASSERT_LT(i, d.pairs.size());
    const auto e = nlohmann::json::parse(line);
    auto whole = [&](const char* side) {
      auto ids = e["prompt_ids"].get<std::vector<std::int32_t>>();
      for (const auto t : e[side].get<std::vector<std::int32_t>>()) ids.push_back(t);
      return ids;
    };
    EXPECT_EQ(d.pairs[i].chosen, whole("chosen_ids")) << "line " << i + 1;
    EXPECT_EQ(d.pairs[i].rejected, whole("rejected_ids")) << "line " << i + 1;
    EXPECT_EQ(d.pairs[i].prompt_len, static_cast<std::int32_t>(e["prompt_ids"].size())) << "line " << i + 1;
  }
  EXPECT_EQ(i, d.pairs.size());
  EXPECT_EQ(i, 4u);
}

TEST(DpoPairs, BrokenLinesNameFileAndLine) {
  const auto tok = io::Tokenizer::from_dir(kSource + "/inputs/quickstart");
  const std::vector<std::pair<std::string, std::string>> cases{
      {"{\"prompt\": \"1+1=\", \"chosen\": \"2\"}", ":2: expected {\"prompt\", \"chosen\", \"rejected\"}: no \"rejected\""},
      {"{\"prompt\": \"1+1=\", \"chosen\": 2, \"rejected\": \"3\"}", ":2: with a string \"prompt\", \"chosen\" and \"rejected\" must be strings"},
      {"{\"prompt\": 5, \"chosen\": \"2\", \"rejected\": \"3\"}", ":2: \"prompt\" must be a string or a list of chat messages"},
      {"{\"prompt\": [{\"role\": \"user\"}], \"chosen\": \"2\", \"rejected\": \"3\"}", ":2: each message of \"prompt\" needs string"},
      {"{\"prompt\": [{\"role\": \"user\", \"content\": \"1\"}], \"chosen\": [], \"rejected\": \"3\"}", ":2: \"chosen\" must be a non-empty list"},
      {"[1, 2]", ":2:"},
  };
  for (const auto& [line, want] : cases) {
    const std::string f = test::write_temp("dpo_bad.jsonl", "{\"prompt\": \"1+1=\", \"chosen\": \"2\", \"rejected\": \"3\"}\n" + line + "\n");
    const std::string e = test::error_of([&] { load_pairs(f, tok, PairOptions{}); });
    EXPECT_NE(e.find("dpo_bad.jsonl" + want), std::string::npos) << e;
  }
  EXPECT_NE(test::error_of([&] { load_pairs(test::write_temp("dpo_empty.jsonl", "\n"), tok, PairOptions{}); })
                .find("dpo_empty.jsonl: no pairs"),
            std::string::npos);
}

}  // namespace
}  // namespace mgrl::train

// ---- KTO (`mgrl kto`): trl's KTOTrainer ----

namespace mgrl::train {
namespace {

std::vector<std::string> kto_cases() { return test::fixture_cases(kData + "/kto"); }

TEST(KtoTrl, FixturesPresent) { EXPECT_GE(kto_cases().size(), 6u) << "tests/data/kto holds too few cases"; }

class KtoTrlCase : public ::testing::TestWithParam<std::string> {};

// One micro-batch of KTO examples (each its completion and its KL sequence, packed as DPO's pairs) against trl's
// _compute_loss: the KL estimate (unclamped and clamped), the loss, trl's metrics and every LoRA gradient.
TEST_P(KtoTrlCase, LossMetricsAndGradientsMatchTrl) {
  const std::string dir = kData + "/kto/" + GetParam();
  nlohmann::json c;
  std::ifstream(dir + "/case.json") >> c;
  const auto& k = c["config"];
  const std::string model_dir = kData + "/models/" + c["model"].get<std::string>();
  auto ops = kernels::make_cpu_ops();
  const auto policy = test::lora_model(*ops, model_dir, dir + "/adapter");
  model::Transformer& net = *policy;

  // The examples as load_kto leaves them: prompt + completion and prompt + KL completion, cut to max_length;
  // apo_zero_unpaired (no KL estimate): the KL slot holds the trainer's placeholder (kto_no_kl_sequence).
  const bool kl = k.value("loss_type", std::string("kto")) == "kto";
  ASSERT_EQ(kl, !c["kl_unclamped"].is_null()) << "trl estimates a KL exactly for loss_type kto";
  const auto max_length = static_cast<std::size_t>(k["max_length"].get<int>());
  std::vector<PreferencePair> ex;
  for (const auto& e : c["examples"]) {
    PreferencePair p;
    const auto prompt = e["prompt_ids"].get<std::vector<std::int32_t>>();
    p.prompt_len = static_cast<std::int32_t>(prompt.size());
    p.label = e["label"].get<bool>() ? 1 : 0;
    for (const char* key : {"completion_ids", "KL_completion_ids"}) {
      auto s = prompt;
      const auto comp = e[key].get<std::vector<std::int32_t>>();
      s.insert(s.end(), comp.begin(), comp.end());
      s.resize(std::min(s.size(), max_length));
      (std::string(key) == "completion_ids" ? p.chosen : p.rejected) = s;
    }
    if (!kl) kto_no_kl_sequence(p);
    ex.push_back(p);
  }
  std::vector<const PreferencePair*> mb;
  for (const auto& p : ex) mb.push_back(&p);
  std::vector<float> tw, lp, w;
  const model::Batch b = dpo_batch(mb, 1.0, &tw);
  lp.assign(b.tokens.size(), 0.0f);
  if (k["reference"] == "base") {
    net.score(b, lp.data(), false);
  } else {
    test::lora_model(*ops, model_dir, model_dir)->score(b, lp.data(), true);
  }
  const auto ref = dpo_sequence_logps(b, tw, lp.data());
  lp.assign(b.tokens.size(), 0.0f);
  net.set_token_stats(true);
  net.forward(b, lp.data(), true, true, 0);
  const auto pol = dpo_sequence_logps(b, tw, lp.data());

  const double N = static_cast<double>(ex.size());
  const double raw = kto_kl_sum(pol, ref) / N;
  if (kl) {
    EXPECT_NEAR(raw, c["kl_unclamped"].get<double>(), 1e-5 * std::max(1.0, std::fabs(raw))) << "KL before the clamp";
  } else {  // the placeholders score nothing: 0 under the policy and the reference alike
    for (std::size_t i = 1; i < pol.size(); i += 2) EXPECT_EQ(pol[i], 0.0) << "placeholder " << i / 2;
    EXPECT_EQ(raw, 0.0);
  }
  DpoLossOptions o;
  o.type = DpoLossType::Kto;
  o.beta = k["beta"].get<double>();
  o.desirable_weight = k["desirable_weight"].get<double>();
  o.undesirable_weight = k["undesirable_weight"].get<double>();
  o.kto_kl = std::max(0.0, raw);
  DpoSums sums;
  dpo_token_metrics(mb, b, net.token_stats(), &sums);
  dpo_loss_weights(o, mb, b, tw, lp.data(), pol, ref, 1.0 / N, 0.0, &w, &sums);
  sums.kto_kl = o.kto_kl;
  sums.kto_kl_count = 1;
  const double loss = sums.total_loss(0.0), want = c["loss"].get<double>();
  EXPECT_LE(std::fabs(loss - want), 1e-5 * std::max(1e-3, std::fabs(want))) << "loss " << loss << " vs " << want;
  const auto& m = c["metrics"];
  ASSERT_TRUE(m.contains("kl"));
  const double logps_scale = std::max(std::fabs(m.value("logps/chosen", 0.0)), std::fabs(m.value("logps/rejected", 0.0)));
  int compared = 0;
  const nlohmann::json got = [&] {
    // the names trl logs, as the trainer's run log has them
    nlohmann::json j;
    j["kl"] = sums.kto_kl;
    if (sums.kto_desirable > 0) j["rewards/chosen"] = sums.reward_chosen / sums.kto_desirable, j["logps/chosen"] = sums.logp_chosen / sums.kto_desirable;
    if (sums.kto_undesirable > 0)
      j["rewards/rejected"] = sums.reward_rejected / sums.kto_undesirable, j["logps/rejected"] = sums.logp_rejected / sums.kto_undesirable;
    if (sums.kto_desirable > 0 && sums.kto_undesirable > 0)
      j["rewards/margins"] = sums.reward_chosen / sums.kto_desirable - sums.reward_rejected / sums.kto_undesirable;
    j["entropy"] = sums.entropy / sums.completion_tokens;
    if (sums.chosen_count > 0) j["logits/chosen"] = sums.logits_chosen / sums.chosen_count;
    if (sums.rejected_count > 0) j["logits/rejected"] = sums.logits_rejected / sums.rejected_count;
    return j;
  }();
  for (const auto& [name, x] : m.items()) {
    ASSERT_TRUE(got.contains(name)) << name << " logged by trl, not by mgrl";
    const double v = got[name].get<double>(), want_v = x.get<double>();
    // rewards and the KL are differences of ~20-nat sequence log-probs (f32 forward: ~1e-7 relative each)
    const bool diff = name.rfind("rewards/", 0) == 0 || name == "kl";
    const double floor = diff ? std::max(1.0, o.beta) * logps_scale : 1.0;
    EXPECT_LE(std::fabs(v - want_v), 1e-5 * std::max(std::fabs(want_v), floor)) << name << ": " << v << " vs " << want_v;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(got.size())) << "mgrl logs a metric trl does not";

  net.backward(w.data());
  test::expect_lora_grads_match(net, *ops, dir + "/grads.safetensors");
}

INSTANTIATE_TEST_SUITE_P(Trl, KtoTrlCase, ::testing::ValuesIn(kto_cases()));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KtoTrlCase);

// The loss's derivative in the completion's log-prob against central differences, both labels, the KL on either side.
TEST(KtoLoss, DerivativeMatchesFiniteDifferences) {
  int checked = 0;
  for (int label : {0, 1})
    for (double kl : {0.0, 0.7})
      for (double lr : {-3.0, -0.2, 0.4, 5.0}) {
        DpoLossOptions o;
        o.type = DpoLossType::Kto;
        o.beta = 0.3;
        o.desirable_weight = 1.3;
        o.undesirable_weight = 0.7;
        o.kto_kl = kl;
        DpoPairIn p;
        p.label = label;
        p.ref_chosen = -10;
        p.chosen = -10 + lr;
        p.rejected = -4;  // the KL sequence: no derivative
        const DpoPairOut out = dpo_pair_loss(o, p);
        const double h = 1e-6;
        DpoPairIn up = p, dn = p;
        up.chosen += h, dn.chosen -= h;
        const double fd = (dpo_pair_loss(o, up).loss - dpo_pair_loss(o, dn).loss) / (2 * h);
        EXPECT_NEAR(out.d_chosen, fd, 1e-7) << label << " " << kl << " " << lr;
        EXPECT_EQ(out.d_rejected, 0.0);
        EXPECT_NEAR(label ? out.reward_chosen : out.reward_rejected, 0.3 * lr, 1e-12);
        ++checked;
      }
  EXPECT_EQ(checked, 16);
}

// load_kto: labelled completions; preference pairs unpaired as trl (chosen rows of the block, then rejected); prompts of
// max_length left out; the KL completions as kto_example pairs them within blocks of the file (the held-out pairing:
// trl's add_kl_completion_ids on the kept examples); errors name the line.
// KTO's KL sequences are scored in a pass of their own (kto_kl_batch; the policy's by a training-mode forward with no
// backward): the same log-probs as in DPO's packing beside the completions (which the trainer used until 2026-11-29),
// with LoRA dropout too (each KL sequence keeps its mask: key 2 g + 1 of global slot g), which acts.
TEST(KtoKl, OwnPassEqualsThePackedOneDropoutToo) {
  const std::string dir = kData + "/kto/kto_base";
  nlohmann::json c;
  std::ifstream(dir + "/case.json") >> c;
  const std::string model_dir = kData + "/models/" + c["model"].get<std::string>();
  auto ops = kernels::make_cpu_ops();
  const std::size_t first = 3;  // this rank's share starts at global slot 3
  std::vector<double> kl_no_dropout;
  for (double dropout : {0.0, 0.3}) {
    model::Transformer net(io::parse_hf_config(model_dir + "/config.json"), *ops);
    net.load_weights(model_dir);
    model::LoraConfig lc = model::read_peft_config(dir + "/adapter/adapter_config.json");
    lc.dropout = dropout;
    net.add_lora(lc, 0).load_peft(dir + "/adapter");
    std::vector<PreferencePair> ex;
    for (const auto& e : c["examples"]) {
      PreferencePair p;
      const auto prompt = e["prompt_ids"].get<std::vector<std::int32_t>>();
      p.prompt_len = static_cast<std::int32_t>(prompt.size());
      p.label = e["label"].get<bool>() ? 1 : 0;
      p.chosen = p.rejected = prompt;
      for (int x : e["completion_ids"]) p.chosen.push_back(x);
      for (int x : e["KL_completion_ids"]) p.rejected.push_back(x);
      ex.push_back(p);
    }
    const std::uint64_t seed = model::dropout_seed(11, 2);
    std::vector<const PreferencePair*> mb;
    for (const auto& p : ex) mb.push_back(&p);
    std::vector<float> tw;
    model::Batch b = dpo_batch(mb, 1.0, &tw);
    for (std::size_t k = 0; k < 2 * ex.size(); ++k) b.seq_keys.push_back(2 * first + k);
    std::vector<float> lp(b.tokens.size(), 0.0f);
    net.forward(b, lp.data(), true, true, seed);
    const auto packed = dpo_sequence_logps(b, tw, lp.data());
    const model::Batch kb = kto_kl_batch(ex, first);
    ASSERT_EQ(kb.B(), static_cast<int>(ex.size()));
    std::vector<float> klp(kb.tokens.size(), 0.0f);
    net.forward(kb, klp.data(), true, true, seed);
    for (std::size_t k = 0; k < ex.size(); ++k) {
      double own = 0;
      for (int t = ex[k].prompt_len; t < kb.length(static_cast<int>(k)); ++t)
        own += klp[static_cast<std::size_t>(kb.offsets[k] + t)];
      EXPECT_NEAR(own, packed[2 * k + 1], 1e-5 * std::fabs(packed[2 * k + 1])) << "example " << k << ", dropout " << dropout;
      if (dropout == 0.0) kl_no_dropout.push_back(own);
      else EXPECT_GT(std::fabs(own - kl_no_dropout[k]), 1e-3) << "example " << k << ": dropout did not act";
    }
  }
}

TEST(KtoData, UnpairedRotatedAndLabelled) {
  const auto tok = io::Tokenizer::from_dir(kSource + "/inputs/quickstart");
  const std::string f = test::write_temp("kto.jsonl",
                                         "{\"prompt\": \"1+1=\", \"completion\": \"2\", \"label\": true}\n"
                                         "{\"prompt\": \"2+2=\", \"completion\": \"5\", \"label\": false}\n"
                                         "{\"prompt\": \"3+3=\", \"completion\": \"6\", \"label\": true}\n"
                                         "{\"prompt\": \"12345+1=\", \"completion\": \"12346\", \"label\": true}\n"
                                         "{\"prompt\": \"4+4=\", \"completion\": \"88\", \"label\": false}\n");
  PairOptions o;
  o.max_length = 8;  // the fourth prompt (<bos> and 8 characters) fills it: left out
  const PairData d = load_kto(f, tok, o);
  ASSERT_EQ(d.pairs.size(), 4u);
  EXPECT_TRUE(d.kto);
  EXPECT_EQ(d.dropped, 1);
  EXPECT_EQ(d.first_dropped_line, 4);
  const auto completion = [&](const std::string& p, const std::string& c) {
    auto ids = tok.encode(p + c, true);
    ids.push_back(*tok.eos_id());
    return ids;
  };
  EXPECT_EQ(d.pairs[0].label, 1);
  EXPECT_EQ(d.pairs[1].label, 0);
  EXPECT_EQ(d.pairs[3].label, 0);
  EXPECT_EQ(d.pairs[0].chosen, completion("1+1=", "2"));
  EXPECT_TRUE(d.pairs[0].rejected.empty());
  // blocks of 2 examples in file order: (0, 1) swap their completions, (2, 3) = lines 3 and 5 likewise
  const std::vector<std::size_t> order{0, 1, 2, 3};
  const auto kl = [&](std::size_t s) { return kto_example(d.pairs, order, s / 2 * 2, s / 2 * 2 + 2, s, o.max_length).rejected; };
  auto cut = [&](std::vector<std::int32_t> v) {
    v.resize(std::min<std::size_t>(v.size(), 8));
    return v;
  };
  EXPECT_EQ(kl(0), cut(completion("1+1=", "5")));
  EXPECT_EQ(kl(1), cut(completion("2+2=", "2")));
  EXPECT_EQ(kl(2), cut(completion("3+3=", "88")));
  EXPECT_EQ(kl(3), cut(completion("4+4=", "6")));
  // a block of one example: its own completion
  EXPECT_EQ(kto_example(d.pairs, order, 0, 1, 0, o.max_length).rejected, d.pairs[0].chosen);

  // Pairs: unpaired in blocks of 1000 lines (one block here): both chosen, then both rejected.
  const std::string pf = test::write_temp("kto_pairs.jsonl",
                                          "{\"prompt\": \"1+1=\", \"chosen\": \"2\", \"rejected\": \"3\"}\n"
                                          "{\"prompt\": \"2+2=\", \"chosen\": \"4\", \"rejected\": \"5\"}\n");
  const PairData pd = load_kto(pf, tok, PairOptions{});
  ASSERT_EQ(pd.pairs.size(), 4u);
  EXPECT_EQ(pd.pairs[0].chosen, completion("1+1=", "2"));
  EXPECT_EQ(pd.pairs[1].chosen, completion("2+2=", "4"));
  EXPECT_EQ(pd.pairs[2].chosen, completion("1+1=", "3"));
  EXPECT_EQ(pd.pairs[3].chosen, completion("2+2=", "5"));
  EXPECT_EQ(pd.pairs[0].label + pd.pairs[1].label + pd.pairs[2].label + pd.pairs[3].label, 2);
  EXPECT_EQ(pd.pairs[0].label, 1);
  EXPECT_EQ(pd.pairs[2].label, 0);
  EXPECT_EQ(kto_example(pd.pairs, order, 0, 4, 0, 1024).rejected, completion("1+1=", "5"));  // the block's last

  const auto err = [&](const std::string& text) {
    const std::string bad = test::write_temp("kto_bad.jsonl", text);
    return test::error_of([&] { load_kto(bad, tok, PairOptions{}); });
  };
  EXPECT_NE(err("{\"prompt\": \"1\", \"completion\": \"2\", \"label\": 1}\n").find("kto_bad.jsonl:1: \"label\" must be true"),
            std::string::npos);
  EXPECT_NE(err("{\"prompt\": \"1\", \"completion\": \"2\", \"label\": true}\n{\"prompt\": \"1\", \"chosen\": \"2\", "
                "\"rejected\": \"3\"}\n").find("kto_bad.jsonl:2: "),
            std::string::npos);
  EXPECT_NE(err("{\"prompt\": \"1\", \"label\": true}\n").find("kto_bad.jsonl:1: expected {\"prompt\", \"completion\", "
                                                               "\"label\"}: no \"completion\""),
            std::string::npos);
}

// Training pairs the KL completions within each global micro-batch of the step (the examples trained together), in
// slot order, each rank building its share alone: the first slot takes the last's completion, then one slot back.
TEST(KtoData, MicroBatchKlPairsRotateWithinIt) {
  std::vector<PreferencePair> data(6);
  for (int i = 0; i < 6; ++i) {
    data[static_cast<std::size_t>(i)].prompt_len = 2;
    data[static_cast<std::size_t>(i)].label = i % 2;
    data[static_cast<std::size_t>(i)].chosen = {100 + i, 200 + i, 300 + i, 400 + i};
    data[static_cast<std::size_t>(i)].completion = {300 + i, 400 + i};
  }
  const std::vector<std::size_t> global{5, 3, 0, 2, 4, 1};  // a step's slots: micro-batches {5,3,0} and {2,4,1}
  const auto all = kto_micro_batch(data, global, 3, 6, 3, 6, 1024);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].rejected, (std::vector<std::int32_t>{102, 202, 301, 401}));  // slot 3 takes slot 5's (example 1)
  EXPECT_EQ(all[1].rejected, (std::vector<std::int32_t>{104, 204, 302, 402}));  // slot 4 takes slot 3's (example 2)
  EXPECT_EQ(all[2].rejected, (std::vector<std::int32_t>{101, 201, 304, 404}));  // slot 5 takes slot 4's (example 4)
  EXPECT_EQ(all[2].chosen, data[1].chosen);
  EXPECT_EQ(all[2].label, 1);
  // A rank's share alone (slots 4-5) pairs the same, and max_length cuts the KL sequence.
  const auto part = kto_micro_batch(data, global, 3, 6, 4, 6, 3);
  ASSERT_EQ(part.size(), 2u);
  EXPECT_EQ(part[0].rejected, (std::vector<std::int32_t>{104, 204, 302}));
  EXPECT_EQ(part[1].rejected, (std::vector<std::int32_t>{101, 201, 304}));
  // An example repeated in adjacent slots (an epoch's end; fewer examples than the micro-batch) takes the nearest
  // other example's completion, never its own.
  const std::vector<std::size_t> wrap{0, 1, 2, 0};
  const auto w = kto_micro_batch(data, wrap, 0, 4, 0, 4, 1024);
  EXPECT_EQ(w[0].rejected, (std::vector<std::int32_t>{100, 200, 302, 402}));  // slot 0: slot 3 is itself, so slot 2
  EXPECT_EQ(w[3].rejected, (std::vector<std::int32_t>{100, 200, 302, 402}));  // slot 3: slot 2
  EXPECT_EQ(w[1].rejected, (std::vector<std::int32_t>{101, 201, 300, 400}));
}

}  // namespace
}  // namespace mgrl::train
