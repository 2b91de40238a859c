// test_grpo_loss.cpp: the GRPO objective: advantages and pass@k on hand-made cases, the per-token gradient of
// every loss variant against finite differences, and the whole computation (advantages, masks, policy and
// reference log-probs, loss, every LoRA gradient) against fixtures written by the real trl library
// (tests/data/grpo, tools/make_grpo_fixtures.py) on the tiny model fixtures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "rl/grpo_loss.h"
#include "tests/unit/lora_grads.h"
#include "tests/unit/test_util.h"

namespace mgrl::rl {
namespace {

const std::string kData = MGRL_TEST_DATA_DIR;

TEST(GrpoAdvantages, GroupBatchNone) {
  const std::vector<double> r{1, 0, 0, 1, 2, 2, 2, 2};  // two groups of 4; the second has zero std
  std::vector<double> gstd;
  const auto g = group_advantages(r, 4, "group", &gstd);
  const double s = std::sqrt(1.0 / 3.0);  // unbiased std of {1, 0, 0, 1}
  EXPECT_NEAR(gstd[0], s, 1e-12);
  EXPECT_EQ(gstd[1], 0.0);
  EXPECT_NEAR(g[0], 0.5 / (s + 1e-4), 1e-12);
  EXPECT_NEAR(g[1], -0.5 / (s + 1e-4), 1e-12);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(g[i], 0.0);
  const auto n = group_advantages(r, 4, "none");
  EXPECT_DOUBLE_EQ(n[0], 0.5);
  EXPECT_DOUBLE_EQ(n[5], 0.0);
  const auto b = group_advantages(r, 4, "batch");
  double mean = 0, ss = 0;
  for (double x : r) mean += x / 8;
  for (double x : r) ss += (x - mean) * (x - mean);
  EXPECT_NEAR(b[0], 0.5 / (std::sqrt(ss / 7) + 1e-4), 1e-12);
}

TEST(GrpoPassAtK, UnbiasedEstimator) {
  EXPECT_DOUBLE_EQ(pass_at_k(10, 0, 1), 0.0);
  EXPECT_DOUBLE_EQ(pass_at_k(10, 10, 5), 1.0);
  EXPECT_NEAR(pass_at_k(10, 3, 1), 0.3, 1e-12);
  // 1 - C(7, 2) / C(10, 2) = 1 - 21/45
  EXPECT_NEAR(pass_at_k(10, 3, 2), 1.0 - 21.0 / 45.0, 1e-12);
  EXPECT_DOUBLE_EQ(pass_at_k(4, 2, 3), 1.0);  // fewer than k wrong samples: always passes
}

// The per-token gradient of S = sum_t mask_t loss_t against central differences, for every option and the
// differentiable objectives: clipped, clipped two-sided (delta), sapo. (cispo's ratio weight is detached: its gradient
// is not the loss's derivative; the trl fixtures check it.)
TEST(GrpoSequenceLoss, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(7);
  std::normal_distribution<double> nd(0.0, 1.0);
  int checked = 0;
  for (const char* variant : {"clip", "delta", "sapo", "rloo"})
  for (int seq = 0; seq < 2; ++seq)
    for (int beta = 0; beta < 2; ++beta)
      for (int corr = 0; corr < 2; ++corr)
        for (int with_old = 0; with_old < 2; ++with_old)
          for (double adv : {0.8, -1.3}) {
            GrpoLossOptions o;
            o.sequence_level = seq;
            o.beta = beta ? 0.07 : 0.0;
            o.kl_bias_correction = corr;
            o.epsilon = 0.2;
            o.epsilon_high = 0.28;
            if (std::string(variant) == "delta") o.delta = 1.15;  // below 1 + epsilon_high: both caps act
            if (std::string(variant) == "sapo") o.loss_type = "sapo", o.sapo_temperature_neg = 1.7;
            if (std::string(variant) == "rloo") o.loss_type = "rloo";  // the summed log-ratio; its KL not in the loss
            const int n = 7;
            std::vector<double> lp(n), old(n), ref(n);
            std::vector<float> mask(n, 1.0f);
            mask[3] = 0.0f;
            for (int t = 0; t < n; ++t) {
              lp[t] = -1.0 + 0.5 * nd(rng);
              old[t] = lp[t] + 0.35 * nd(rng);  // ratios in and out of the clip range
              ref[t] = lp[t] + 0.3 * nd(rng);
            }
            auto eval = [&](const std::vector<double>& x, std::vector<double>* g) {
              std::vector<float> xf(x.begin(), x.end()), of(old.begin(), old.end()), rf(ref.begin(), ref.end());
              SequenceIn s;
              s.n = n;
              s.logp = xf.data();
              s.old = with_old ? of.data() : nullptr;
              s.ref = rf.data();
              s.mask = mask.data();
              s.advantage = adv;
              std::vector<double> tmp(n);
              const double v = sequence_loss(o, s, g ? g->data() : tmp.data()).sum;
              return v;
            };
            // Evaluate in float inputs: pick logp values exactly representable so the differences are clean.
            for (auto& x : lp) x = static_cast<float>(x);
            std::vector<double> g(n);
            eval(lp, &g);
            for (int t = 0; t < n; ++t) {
              if (!with_old) continue;  // without old, the ratio is exp(lp - stopgrad(lp)): not a plain function
              const double h = 1.0 / 1024;  // exact in float
              auto xp = lp, xm = lp;
              xp[t] += h;
              xm[t] -= h;
              const double fd = (eval(xp, nullptr) - eval(xm, nullptr)) / (2 * h);
              EXPECT_NEAR(g[t], fd, 2e-3 * std::max(1.0, std::fabs(fd))) << variant << " seq " << seq << " beta "
                                                                           << beta << " corr " << corr << " adv " << adv
                                                                           << " t " << t;
              ++checked;
            }
            if (!with_old) {
              // ratio 1: token level d/dlogp of -A * ratio is -A on every unmasked token (+ KL terms).
              for (int t = 0; t < n; ++t)
                if (mask[t] == 0.0f) {
                  EXPECT_EQ(g[t], 0.0);
                }
            }
          }
  EXPECT_GT(checked, 300);
}

// The premise of leaving completions out of the training pass (GrpoTrainer::trained_in): with advantage 0 and
// beta 0, or with every token masked, the loss and every per-token gradient are exactly 0, whatever the ratios
// (in and out of the clip range), for both importance-sampling levels.
TEST(GrpoSequenceLoss, ZeroAdvantageOrMaskedContributesNothing) {
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const char* loss_type : {"dapo", "cispo", "sapo"})
  for (int seq = 0; seq < 2; ++seq)
    for (int masked = 0; masked < 2; ++masked) {
      GrpoLossOptions o;
      o.loss_type = loss_type;
      o.delta = 1.25;
      o.sequence_level = seq;
      o.epsilon = 0.2;
      o.epsilon_high = 0.28;
      o.beta = masked ? 0.04 : 0.0;  // a masked completion contributes nothing even with a KL term
      const int n = 6;
      std::vector<float> lp(n), old(n), ref(n), mask(n, masked ? 0.0f : 1.0f);
      for (int t = 0; t < n; ++t) {
        lp[t] = static_cast<float>(-1.0 + 0.5 * nd(rng));
        old[t] = static_cast<float>(lp[t] + 0.4 * nd(rng));
        ref[t] = static_cast<float>(lp[t] + 0.3 * nd(rng));
      }
      SequenceIn s;
      s.n = n;
      s.logp = lp.data();
      s.old = old.data();
      s.ref = ref.data();
      s.mask = mask.data();
      s.advantage = masked ? 1.7 : 0.0;
      std::vector<double> g(n, 1.0);
      const SequenceTerms st = sequence_loss(o, s, g.data());
      EXPECT_EQ(st.sum, 0.0) << "seq " << seq << " masked " << masked;
      for (int t = 0; t < n; ++t) EXPECT_EQ(g[t], 0.0) << "seq " << seq << " masked " << masked << " t " << t;
      EXPECT_EQ(st.clipped_low + st.clipped_high, 0.0);
    }
}

TEST(GrpoSequenceWeight, Normalisers) {
  GrpoLossOptions o;
  o.max_completion_length = 16;
  o.loss_type = "grpo";
  EXPECT_DOUBLE_EQ(sequence_weight(o, 4, 8, 30, 60, 2), 1.0 / 32);
  o.loss_type = "bnpo";
  EXPECT_DOUBLE_EQ(sequence_weight(o, 4, 8, 30, 60, 2), 1.0 / 60);
  o.loss_type = "dr_grpo";
  EXPECT_DOUBLE_EQ(sequence_weight(o, 4, 8, 30, 60, 2), 1.0 / 128);
  o.loss_type = "dapo";
  EXPECT_DOUBLE_EQ(sequence_weight(o, 4, 8, 30, 60, 2), 1.0 / 60);
  o.loss_type = "grpo";
  EXPECT_DOUBLE_EQ(sequence_weight(o, 0, 8, 30, 60, 2), 1.0 / 8);  // a fully masked completion: clamp(min 1)
  o.loss_type = "cispo";  // as dapo
  EXPECT_DOUBLE_EQ(sequence_weight(o, 4, 8, 30, 60, 2), 1.0 / 60);
  o.loss_type = "sapo";  // as grpo
  EXPECT_DOUBLE_EQ(sequence_weight(o, 4, 8, 30, 60, 2), 1.0 / 32);
  o.loss_type = "luspo";  // token sums, mean over completions
  EXPECT_DOUBLE_EQ(sequence_weight(o, 4, 8, 30, 60, 2), 1.0 / 8);
  // A round of 3 steps (grpo.steps_per_generation): the round-token normalisers divide its tokens among the steps,
  // the others are the step's own.
  for (const char* t : {"dapo", "cispo", "vespo"}) {
    o.loss_type = t;
    EXPECT_DOUBLE_EQ(sequence_weight(o, 4, 8, 30, 180, 2, 3), 3.0 / 180) << t;
  }
  o.loss_type = "grpo";
  EXPECT_DOUBLE_EQ(sequence_weight(o, 4, 8, 30, 180, 2, 3), 1.0 / 32);
  o.loss_type = "bnpo";
  EXPECT_DOUBLE_EQ(sequence_weight(o, 4, 8, 30, 180, 2, 3), 1.0 / 60);
}

// ---- against trl ----

std::vector<std::string> trl_cases() { return test::fixture_cases(kData + "/grpo"); }

TEST(GrpoTrl, FixturesPresent) { EXPECT_GE(trl_cases().size(), 31u) << "tests/data/grpo holds too few cases"; }

class GrpoTrlCase : public ::testing::TestWithParam<std::string> {};

double max_rel(const std::vector<double>& got, const std::vector<double>& want, double floor) {
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::fabs(got[i] - want[i]) / std::max(floor, std::fabs(want[i])));
  return worst;
}

TEST_P(GrpoTrlCase, LossGradientsAndAdvantagesMatchTrl) {
  const std::string dir = kData + "/grpo/" + GetParam();
  nlohmann::json c;
  std::ifstream(dir + "/case.json") >> c;
  const auto& k = c["config"];
  const std::string model_dir = kData + "/models/" + c["model"].get<std::string>();
  auto ops = kernels::make_cpu_ops();
  const auto policy = test::lora_model(*ops, model_dir, dir + "/adapter");
  model::Transformer& net = *policy;

  const int G = k["num_generations"].get<int>();
  const auto prompts = c["prompts"].get<std::vector<std::vector<std::int32_t>>>();
  const auto completions = c["completions"].get<std::vector<std::vector<std::int32_t>>>();
  const auto truncated = c["truncated"].get<std::vector<bool>>();
  const std::size_t N = completions.size();
  ASSERT_EQ(N, prompts.size() * static_cast<std::size_t>(G));
  // grpo.steps_per_generation: the loss is the step's on one slice (in_loss, trl's shuffled split) of the generation
  // round (all N completions: advantages, dapo's token count); with one slice, every completion.
  const int spg = k.value("steps_per_generation", 1);
  std::vector<std::size_t> in_loss;
  for (const auto& x : c.value("in_loss", nlohmann::json::array())) in_loss.push_back(x.get<std::size_t>());
  if (in_loss.empty())
    for (std::size_t i = 0; i < N; ++i) in_loss.push_back(i);
  ASSERT_EQ(in_loss.size() * static_cast<std::size_t>(spg), N);

  // Advantages from the weighted rewards (null: a reward function's None, NaN; the sum is trl's nansum, NaN where
  // every function gave None: rl::Rewards::total).
  const auto nullable = [](const nlohmann::json& x) { return x.is_null() ? std::nan("") : x.get<double>(); };
  std::vector<std::vector<double>> rpf;
  for (const auto& row : c["rewards_per_func"]) {
    rpf.emplace_back();
    for (const auto& x : row) rpf.back().push_back(nullable(x));
  }
  const auto weights = k["reward_weights"].get<std::vector<double>>();
  std::vector<double> rewards(N), want_rewards;
  for (std::size_t i = 0; i < N; ++i) {
    bool any = false;
    for (std::size_t f = 0; f < weights.size(); ++f) {
      if (std::isnan(rpf[i][f])) continue;
      rewards[i] += weights[f] * rpf[i][f];
      any = true;
    }
    if (!any) rewards[i] = std::nan("");
  }
  for (const auto& x : c["rewards"]) want_rewards.push_back(nullable(x));
  for (std::size_t i = 0; i < N; ++i) {
    EXPECT_EQ(std::isnan(rewards[i]), std::isnan(want_rewards[i])) << "reward " << i;
    if (!std::isnan(rewards[i])) {
      EXPECT_NEAR(rewards[i], want_rewards[i], 1e-9) << "reward " << i;
    }
  }
  const bool gdpo = k.value("multi_objective_aggregation", std::string("sum_then_normalize")) == "normalize_then_sum";
  // trl's RLOOTrainer: the advantages need the KL penalty of each completion (old policy vs reference), below.
  const bool rloo = k["loss_type"].get<std::string>() == "rloo";
  std::vector<double> adv;
  if (!rloo) {
    adv = gdpo ? normalize_then_sum_advantages(rpf, weights, G)
               : group_advantages(rewards, G, k["scale_rewards"].get<std::string>());
    EXPECT_LT(max_rel(adv, c["advantages"].get<std::vector<double>>(), 1e-3), 1e-6) << "advantages";
  }

  // The batch: prompt + completion, the policy's log-probs at the temperature.
  std::vector<std::vector<std::int32_t>> seqs;
  for (std::size_t i = 0; i < N; ++i) {
    auto s = prompts[i / static_cast<std::size_t>(G)];
    s.insert(s.end(), completions[i].begin(), completions[i].end());
    seqs.push_back(s);
  }
  const model::Batch b = model::Batch::from_sequences(seqs);
  const float scale = static_cast<float>(1.0 / k["temperature"].get<double>());
  std::vector<float> lp(b.tokens.size()), ref(b.tokens.size());
  net.set_token_stats(true);
  net.forward(b, lp.data(), true, true, 0, scale);
  const std::vector<float> ent = net.token_stats().entropy;
  // trl's top_entropy_quantile: the policy loss on the tokens whose entropy reaches the quantile of the batch's
  // completion tokens only.
  const double teq = k.value("top_entropy_quantile", 1.0);
  std::vector<float> emask;
  if (teq < 1.0) {
    const auto cmask = c["completion_mask"].get<std::vector<std::vector<double>>>();
    std::vector<double> valid;
    for (std::size_t i : in_loss) {
      const std::size_t row = static_cast<std::size_t>(b.offsets[i]) + prompts[i / static_cast<std::size_t>(G)].size();
      for (std::size_t t = 0; t < completions[i].size(); ++t)
        if (cmask[i][t] > 0) valid.push_back(ent[row + t]);
    }
    const auto threshold = static_cast<float>(quantile_linear(valid, 1.0 - teq));
    emask.assign(ent.size(), 0.0f);
    for (std::size_t i = 0; i < ent.size(); ++i) emask[i] = ent[i] >= threshold ? 1.0f : 0.0f;
    std::size_t kept = 0;
    for (const double e : valid) kept += static_cast<float>(e) >= threshold ? 1 : 0;
    EXPECT_GT(kept, 0u);
    EXPECT_LT(kept, valid.size()) << "the entropy mask keeps every token: it checks nothing";
  }
  // trl's "entropy" metric: the masked mean over the completion tokens of the tempered distributions' entropies.
  if (c.contains("entropy")) {
    const auto cmask = c["completion_mask"].get<std::vector<std::vector<double>>>();
    double sum = 0, n = 0;
    for (std::size_t i : in_loss) {
      const std::size_t row = static_cast<std::size_t>(b.offsets[i]) + prompts[i / static_cast<std::size_t>(G)].size();
      for (std::size_t t = 0; t < completions[i].size(); ++t) {
        sum += cmask[i][t] * ent[row + t];
        n += cmask[i][t];
      }
    }
    EXPECT_NEAR(sum / n, c["entropy"].get<double>(), 1e-5 * std::max(1.0, c["entropy"].get<double>())) << "entropy";
  }
  const bool beta = k["beta"].get<double>() != 0.0;
  if (beta) {
    // trl's reference with PEFT and beta > 0: a frozen copy of the starting adapter (mgrl: grpo.reference =
    // initial), here the fixture's own adapter, in the scoring pass.
    test::lora_model(*ops, model_dir, model_dir)->score(b, ref.data(), true, scale);
  }

  GrpoLossOptions o;
  o.loss_type = k["loss_type"].get<std::string>();
  o.beta = k["beta"].get<double>();
  o.epsilon = k["epsilon"].get<double>();
  o.epsilon_high = k["epsilon_high"].is_null() ? o.epsilon : k["epsilon_high"].get<double>();
  o.sequence_level = k["importance_sampling_level"].get<std::string>() == "sequence";
  o.kl_bias_correction = k["use_bias_correction_kl"].get<bool>();
  o.delta = k.contains("delta") && !k["delta"].is_null() ? k["delta"].get<double>() : 0.0;
  o.sapo_temperature_pos = k.value("sapo_temperature_pos", 1.0);
  o.sapo_temperature_neg = k.value("sapo_temperature_neg", 1.05);
  o.vespo_k_pos = k.value("vespo_k_pos", 2.0);
  o.vespo_lambda_pos = k.value("vespo_lambda_pos", 3.0);
  o.vespo_k_neg = k.value("vespo_k_neg", 3.0);
  o.vespo_lambda_neg = k.value("vespo_lambda_neg", 2.0);
  o.off_policy_threshold =
      k.contains("off_policy_mask_threshold") && !k["off_policy_mask_threshold"].is_null() ? k["off_policy_mask_threshold"].get<double>() : 0.0;
  o.max_completion_length = k["max_completion_length"].get<int>();
  const bool mask_trunc = k["mask_truncated_completions"].get<bool>();
  const bool has_old = !c["old_logps"].is_null();

  const auto want_mask = c["completion_mask"].get<std::vector<std::vector<double>>>();
  const auto want_lp = c["policy_logps"].get<std::vector<std::vector<double>>>();
  std::vector<std::vector<float>> masks(N), old(N), refs(N);
  double round_tokens = 0, step_tokens = 0;
  std::vector<double> got_lp, exp_lp, got_ref, exp_ref;
  for (std::size_t i = 0; i < N; ++i) {
    const std::size_t n = completions[i].size(), row = static_cast<std::size_t>(b.offsets[i]) + prompts[i / G].size();
    masks[i].assign(n, mask_trunc && truncated[i] ? 0.0f : 1.0f);
    for (std::size_t t = 0; t < n; ++t) {
      EXPECT_EQ(masks[i][t], static_cast<float>(want_mask[i][t])) << "mask of completion " << i;
      // trl also drops masked (truncated) completions from the attention mask: their log-probs differ and do not
      // enter the loss, so only tokens in the loss are compared.
      if (masks[i][t] == 0.0f) continue;
      got_lp.push_back(lp[row + t]);
      exp_lp.push_back(want_lp[i][t]);
      round_tokens += masks[i][t];
      if (std::find(in_loss.begin(), in_loss.end(), i) != in_loss.end()) step_tokens += masks[i][t];
    }
    if (has_old) {
      const auto v = c["old_logps"][i].get<std::vector<double>>();
      old[i].assign(v.begin(), v.end());
    }
    if (beta) {
      refs[i].assign(ref.begin() + static_cast<std::ptrdiff_t>(row), ref.begin() + static_cast<std::ptrdiff_t>(row + n));
      const auto v = c["ref_logps"][i].get<std::vector<double>>();
      for (std::size_t t = 0; t < n; ++t) {
        if (masks[i][t] == 0.0f) continue;
        got_ref.push_back(refs[i][t]);
        exp_ref.push_back(v[t]);
      }
    }
  }
  EXPECT_LT(max_rel(got_lp, exp_lp, 1.0), 2e-5) << "policy log-probs";
  if (beta) {
    EXPECT_LT(max_rel(got_ref, exp_ref, 1.0), 2e-5) << "reference log-probs";
  }
  if (rloo) {
    // The reward penalty: beta x the summed k1 KL of the sampling (old) policy against the reference over the loss
    // tokens (trl's old log-probs, mgrl's reference ones: both checked against trl's).
    ASSERT_TRUE(has_old);
    std::vector<double> kl(N, 0.0);
    bool kl_nonzero = false;
    for (std::size_t i = 0; i < N && beta; ++i) {
      for (std::size_t t = 0; t < completions[i].size(); ++t) kl[i] += masks[i][t] * (old[i][t] - refs[i][t]);
      kl_nonzero = kl_nonzero || std::fabs(kl[i]) > 1e-3;
    }
    EXPECT_EQ(kl_nonzero, beta) << "the fixture's KL penalty is 0: it checks nothing";
    const auto& clip = k["reward_clip_range"];
    adv = rloo_advantages(rewards, kl, G, k["beta"].get<double>(), k["normalize_advantages"].get<bool>(),
                          clip.is_null() ? -INFINITY : clip[0].get<double>(), clip.is_null() ? INFINITY : clip[1].get<double>());
    EXPECT_LT(max_rel(adv, c["advantages"].get<std::vector<double>>(), 1e-3), 1e-5) << "advantages";
  }

  double loss = 0, magnitude = 0;
  std::vector<float> w(b.tokens.size(), 0.0f);
  for (std::size_t i : in_loss) {
    const std::size_t n = completions[i].size(), row = static_cast<std::size_t>(b.offsets[i]) + prompts[i / G].size();
    SequenceIn s;
    s.n = static_cast<int>(n);
    s.logp = lp.data() + row;
    s.old = has_old ? old[i].data() : nullptr;
    s.ref = beta ? refs[i].data() : nullptr;
    s.mask = masks[i].data();
    s.entropy_mask = emask.empty() ? nullptr : emask.data() + row;
    s.advantage = adv[i];
    std::vector<double> g(n);
    const SequenceTerms st = sequence_loss(o, s, g.data());
    const double cw =
        sequence_weight(o, st.tokens, static_cast<std::int64_t>(in_loss.size()), step_tokens, round_tokens, 1, spg);
    loss += cw * st.sum;
    for (std::size_t t = 0; t < n; ++t) {
      w[row + t] = static_cast<float>(-cw * g[t]);
      magnitude += cw * masks[i][t] * std::fabs(adv[i] * lp[row + t]);
    }
  }
  // trl's entropy bonus: minus entropy_coef x the mean entropy over the step's loss tokens (the entropy quantile's
  // when set), as weights on each token's entropy in the backward.
  const double ecoef = k.value("entropy_coef", 0.0);
  std::vector<float> ew;
  if (ecoef != 0.0) {
    double esum = 0, ecount = 0;
    for (std::size_t i : in_loss) {
      const std::size_t row = static_cast<std::size_t>(b.offsets[i]) + prompts[i / G].size();
      for (std::size_t t = 0; t < completions[i].size(); ++t) {
        const double e = masks[i][t] * (emask.empty() ? 1.0 : emask[row + t]);
        esum += e * ent[row + t];
        ecount += e;
      }
    }
    const double u = ecoef / std::max(1.0, ecount);
    loss -= u * esum;
    ew.assign(b.tokens.size(), 0.0f);
    for (std::size_t i : in_loss) {
      const std::size_t row = static_cast<std::size_t>(b.offsets[i]) + prompts[i / G].size();
      for (std::size_t t = 0; t < completions[i].size(); ++t)
        ew[row + t] = static_cast<float>(u * masks[i][t] * (emask.empty() ? 1.0 : emask[row + t]));
    }
  }
  const double want_loss = c["loss"].get<double>();
  // cispo's and vespo's losses sum -w A logp over tokens whose advantages cancel within each group, so the float32
  // log-probs' error (checked above to 2e-5) enters them in proportion to the summands' magnitude, not the sum's.
  // So do rloo's terms -c A / N (c = 1 + the float32 error of the summed log-ratio) on the first step.
  const bool reinforce = o.loss_type == "cispo" || o.loss_type == "vespo" || o.loss_type == "rloo";
  const double size = reinforce ? std::max(std::fabs(want_loss), magnitude) : std::fabs(want_loss);
  EXPECT_LE(std::fabs(loss - want_loss), 1e-5 * std::max(1e-3, size)) << "loss " << loss << " vs " << want_loss;

  net.backward(w.data(), {}, nullptr, ew.empty() ? nullptr : ew.data());
  test::expect_lora_grads_match(net, *ops, dir + "/grads.safetensors");
}

INSTANTIATE_TEST_SUITE_P(Trl, GrpoTrlCase, ::testing::ValuesIn(trl_cases()));
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GrpoTrlCase);

}  // namespace
}  // namespace mgrl::rl

// ---- token-balanced splits (rl/balance.h) ----

#include "rl/balance.h"

TEST(Balance, EqualCountsEveryItemOnceAndDeterministic) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(1.0, 100.0);
  for (int ranks : {1, 2, 3, 4, 8}) {
    std::vector<double> cost(static_cast<std::size_t>(ranks) * 7);
    for (auto& c : cost) c = u(rng);
    const auto split = mgrl::rl::balanced_split(cost, ranks);
    ASSERT_EQ(split.size(), static_cast<std::size_t>(ranks));
    std::vector<int> seen(cost.size(), 0);
    for (const auto& v : split) {
      EXPECT_EQ(v.size(), 7u);
      EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
      for (std::size_t i : v) ++seen[i];
    }
    for (int s : seen) EXPECT_EQ(s, 1);
    EXPECT_EQ(split, mgrl::rl::balanced_split(cost, ranks));
  }
}

// A skewed batch: every fourth item is ten times as long, and the contiguous blocks put them unevenly. The
// balanced split's largest share is within one item of the mean (the bound of greedy assignment), the contiguous
// one is not.
TEST(Balance, SkewedCostsAreBalanced) {
  std::vector<double> cost;
  for (int i = 0; i < 32; ++i) cost.push_back(i < 8 ? 100.0 : 10.0 + (i % 3));
  const int ranks = 4;
  const auto bal = mgrl::rl::split_load(cost, mgrl::rl::balanced_split(cost, ranks));
  const auto con = mgrl::rl::split_load(cost, mgrl::rl::contiguous_split(cost.size(), ranks));
  EXPECT_DOUBLE_EQ(bal.mean, con.mean);
  EXPECT_GT(con.max / con.mean, 1.8);
  EXPECT_LE(bal.max - bal.mean, 12.0);  // one short item at most
  EXPECT_LT(bal.max / bal.mean, 1.05);
}

TEST(Balance, RoundOrderShufflesSeveralSlicesOnly) {
  const std::size_t n = 32, G = 4;  // 8 groups of 4 completions, 2 slices of 16
  const auto one = mgrl::rl::round_order(n, 1, 5, 6);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(one[i], i);
  const auto two = mgrl::rl::round_order(n, 2, 5, 6);
  EXPECT_EQ(two, mgrl::rl::round_order(n, 2, 5, 6));  // the same on every rank and on resume
  EXPECT_NE(two, mgrl::rl::round_order(n, 2, 5, 8));  // another round
  EXPECT_NE(two, mgrl::rl::round_order(n, 2, 6, 6));  // another seed
  auto sorted = two;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, one) << "not a permutation";
  for (std::size_t k = 0; k < 2; ++k) {  // each slice holds completions of most groups, not whole groups in order
    std::vector<bool> group(n / G, false);
    for (std::size_t i = k * n / 2; i < (k + 1) * n / 2; ++i) group[two[i] / G] = true;
    EXPECT_GE(std::count(group.begin(), group.end(), true), 6) << "slice " << k;
  }
}

TEST(Balance, ContiguousSplitIsBlocks) {
  const auto split = mgrl::rl::contiguous_split(6, 3);
  EXPECT_EQ(split, (std::vector<std::vector<std::size_t>>{{0, 1}, {2, 3}, {4, 5}}));
}
