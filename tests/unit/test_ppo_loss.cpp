// test_ppo_loss.cpp: the PPO objective (src/rl/ppo_loss.h) against trl 1.12.0's PPOTrainer.train() on fixed rollout
// tensors (tests/data/ppo, tools/make_ppo_fixtures.py): rewards, GAE returns, whitened advantages, every mini-batch's
// loss and its gradients with respect to the new log-probs and values, and the logged metrics; the gradients against
// finite differences; the value positions and the KL estimators; the value head (gradients, AdamW, exact state); the
// adaptive KL coefficient against trl 0.11.4's AdaptiveKLController (tests/data/ppo/adaptive_kl.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "rl/ppo_loss.h"
#include "rl/value_head.h"
#include "tests/unit/test_util.h"

namespace mgrl::rl {
namespace {

const std::string kData = MGRL_TEST_DATA_DIR;

std::vector<std::string> trl_cases() { return test::fixture_cases(kData + "/ppo"); }

nlohmann::json load(const std::string& name) {
  std::ifstream f(kData + "/ppo/" + name + "/case.json");
  return nlohmann::json::parse(f);
}

PpoOptions options(const nlohmann::json& c) {
  const auto& k = c["config"];
  PpoOptions o;
  o.gamma = k["gamma"];
  o.lam = k["lam"];
  o.cliprange = k["cliprange"];
  o.cliprange_value = k["cliprange_value"];
  o.vf_coef = k["vf_coef"];
  o.kl_coef = k["kl_coef"];
  o.kl_estimator = kl_estimator_from(k["kl_estimator"].get<std::string>());
  o.whiten_rewards = k["whiten_rewards"];
  o.missing_eos_penalty = k["missing_eos_penalty"].is_null() ? 0.0 : k["missing_eos_penalty"].get<double>();
  o.response_length = c["response_length"];
  return o;
}

std::vector<PpoSequence> batch(const nlohmann::json& c) {
  std::vector<PpoSequence> b(c["scores"].size());
  for (std::size_t i = 0; i < b.size(); ++i) {
    b[i].logp = c["old_logps"][i].get<std::vector<double>>();
    b[i].ref = c["ref_logps"][i].get<std::vector<double>>();
    b[i].values = c["values"][i].get<std::vector<double>>();
    b[i].score = c["scores"][i];
    b[i].has_eos = c["has_eos"][i];
  }
  return b;
}

// |a - b| <= rel * max(|b|, floor)
void expect_close(double a, double b, double rel, double floor, const std::string& what) {
  EXPECT_LE(std::fabs(a - b), rel * std::max(std::fabs(b), floor)) << what << ": " << a << " vs trl " << b;
}

void expect_rows(const std::vector<double>& got, const nlohmann::json& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t t = 0; t < got.size(); ++t)
    expect_close(got[t], want[t].get<double>(), rel, 1e-3, what + "[" + std::to_string(t) + "]");
}

TEST(PpoLoss, FixturesExist) { EXPECT_GE(trl_cases().size(), 3u) << "tests/data/ppo has no cases"; }

// Everything one trl update computes, case by case. trl ran in float64; the per-token figures agree to 1e-9
// relative (the bound asked is 1e-5); the metrics trl keeps in float32 stat tensors to 1e-5.
TEST(PpoLoss, MatchesTrlPpoTrainer) {
  for (const auto& name : trl_cases()) {
    SCOPED_TRACE(name);
    const auto c = load(name);
    const PpoOptions o = options(c);
    auto b = batch(c);
    ppo_advantages(o, b);
    int clipped_pg = 0, clipped_vf = 0, eos_missing = 0, stopped = 0;
    for (std::size_t i = 0; i < b.size(); ++i) {
      const std::string at = "sequence " + std::to_string(i);
      expect_rows(b[i].advantages, c["advantages"][i], 1e-9, at + " advantage");
      expect_rows(b[i].returns, c["returns"][i], 1e-9, at + " return");
      std::vector<double> raw(b[i].returns.size());
      for (std::size_t t = 0; t < raw.size(); ++t) raw[t] = b[i].returns[t] - b[i].values[t];
      expect_rows(raw, c["advantages_raw"][i], 1e-9, at + " GAE advantage");
      if (c.contains("rewards_whitened")) expect_rows(b[i].rewards, c["rewards_whitened"][i], 1e-9, at + " reward");
      eos_missing += !b[i].has_eos;
      stopped += b[i].n() < o.response_length;
    }
    EXPECT_GT(eos_missing, 0);
    EXPECT_GT(stopped, 0);
    std::vector<PpoLoss> losses;
    for (const auto& mb : c["minibatches"]) {
      PpoTerms total;
      std::vector<std::vector<double>> dl, dv;
      const auto idx = mb["indices"].get<std::vector<int>>();
      for (std::size_t j = 0; j < idx.size(); ++j) {
        const auto& s = b[static_cast<std::size_t>(idx[j])];
        const auto lp = mb["new_logps"][j].get<std::vector<double>>();
        const auto nv = mb["new_values"][j].get<std::vector<double>>();
        dl.emplace_back(lp.size());
        dv.emplace_back(nv.size());
        total.add(ppo_sequence_terms(o, s, lp.data(), nv.data(), dl.back().data(), dv.back().data()));
      }
      const PpoLoss l = ppo_loss(o, total);
      losses.push_back(l);
      clipped_pg += total.pg_clipped > 0;
      clipped_vf += total.vf_clipped > 0;
      expect_close(l.loss, mb["loss"].get<double>(), 1e-9, 1e-3, "loss");
      for (std::size_t j = 0; j < idx.size(); ++j) {
        for (double& x : dl[j]) x *= l.logp_scale;
        for (double& x : dv[j]) x *= l.value_scale;
        expect_rows(dl[j], mb["grad_logps"][j], 1e-9, "d loss / d logp, sequence " + std::to_string(idx[j]));
        expect_rows(dv[j], mb["grad_values"][j], 1e-9, "d loss / d value, sequence " + std::to_string(idx[j]));
      }
    }
    EXPECT_GT(clipped_pg, 0) << "no mini-batch clipped a ratio: the case tests less than it should";
    EXPECT_GT(clipped_vf, 0) << "no mini-batch clipped a value";
    const auto m = ppo_metrics(ppo_rollout_sums(o, b), losses);
    EXPECT_EQ(m.size(), 13u);
    for (const auto& [key, value] : m) {
      ASSERT_TRUE(c["metrics"].contains(key)) << key;
      expect_close(value, c["metrics"][key].get<double>(), 1e-5, 1e-3, key);
    }
  }
}

// d pg_sum / d logp and d vf_sum / d value against central differences, on ratios and values inside and outside
// their clip ranges, positive and negative advantages.
TEST(PpoLoss, GradientsMatchFiniteDifferences) {
  PpoOptions o;
  o.response_length = 5;
  o.cliprange = 0.2;
  o.cliprange_value = 0.1;
  o.kl_estimator = KlEstimator::K3;
  std::vector<PpoSequence> b(2);
  b[0].logp = {-1.0, -2.0, -0.5};
  b[0].ref = {-1.2, -1.9, -0.4};
  b[0].values = {0.3, -0.2, 0.1, 0.6};
  b[0].score = 1.0;
  b[1].logp = {-0.7, -1.5, -2.5, -0.1, -1.1};
  b[1].ref = {-0.6, -1.6, -2.0, -0.3, -1.0};
  b[1].values = {0.0, 0.4, -0.3, 0.2, 0.5};
  b[1].score = -1.0;
  b[1].has_eos = false;
  ppo_advantages(o, b);
  const double moves[] = {0.05, -0.4, 0.35, -0.03, 0.6};
  int checked = 0;
  for (const auto& s : b) {
    std::vector<double> lp(s.logp), v(s.values);
    for (std::size_t t = 0; t < lp.size(); ++t) lp[t] += moves[t % 5];
    for (std::size_t t = 0; t < v.size(); ++t) v[t] += moves[(t + 2) % 5] * 0.5;
    std::vector<double> dl(lp.size()), dv(v.size());
    ppo_sequence_terms(o, s, lp.data(), v.data(), dl.data(), dv.data());
    const double h = 1e-6;
    for (std::size_t t = 0; t < lp.size(); ++t) {
      auto at = [&](double e) {
        auto q = lp;
        q[t] += e;
        return ppo_sequence_terms(o, s, q.data(), v.data(), nullptr, nullptr).pg_sum;
      };
      EXPECT_NEAR(dl[t], (at(h) - at(-h)) / (2 * h), 1e-6) << "logp " << t;
      ++checked;
    }
    for (std::size_t t = 0; t < v.size(); ++t) {
      auto at = [&](double e) {
        auto q = v;
        q[t] += e;
        return ppo_sequence_terms(o, s, lp.data(), q.data(), nullptr, nullptr).vf_sum;
      };
      EXPECT_NEAR(dv[t], (at(h) - at(-h)) / (2 * h), 1e-6) << "value " << t;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 + 4 + 5 + 5);
}

TEST(PpoLoss, ValuePositionsKlAndWhitening) {
  EXPECT_EQ(ppo_value_positions(3, 6), 4);
  EXPECT_EQ(ppo_value_positions(6, 6), 6);
  EXPECT_DOUBLE_EQ(ppo_kl(KlEstimator::K1, -1.0, -1.5), 0.5);
  EXPECT_NEAR(ppo_kl(KlEstimator::K3, -1.0, -1.5), std::exp(-0.5) - 1 + 0.5, 1e-15);
  EXPECT_EQ(ppo_kl(KlEstimator::K3, -2.0, -2.0), 0.0);
  EXPECT_THROW(kl_estimator_from("k2"), UserError);
  // Whitened advantages have mean 0 and unbiased variance ~1 over the batch's response tokens; the score sits at
  // the last value position.
  PpoOptions o;
  o.response_length = 4;
  std::vector<PpoSequence> b(3);
  b[0] = {{-1, -2}, {-1, -2}, {0.1, 0.2, 0.3}, 2.0, true, 0, {}, {}, {}, {}};
  b[1] = {{-1, -2, -3, -1}, {-1.1, -2, -3, -1}, {0.1, 0.2, 0.3, 0.4}, -1.0, false, 0, {}, {}, {}, {}};
  b[2] = {{-0.5}, {-0.5}, {0.0, 0.5}, 0.5, true, 0, {}, {}, {}, {}};
  o.missing_eos_penalty = 0.25;
  ppo_advantages(o, b);
  EXPECT_DOUBLE_EQ(b[0].rewards[2], 2.0);
  EXPECT_DOUBLE_EQ(b[1].penalised_score, -1.25);
  EXPECT_NEAR(b[1].rewards[3], -1.25, 1e-12);
  EXPECT_NEAR(b[1].rewards[0], -0.05 * 0.1, 1e-12);
  double sum = 0, sq = 0, n = 0;
  for (const auto& s : b)
    for (double a : s.advantages) sum += a, sq += a * a, n += 1;
  EXPECT_NEAR(sum / n, 0.0, 1e-12);
  EXPECT_NEAR(sq / (n - 1), 1.0, 1e-6);
}


// The value head: d loss / d (w, b, h) against central differences for loss = sum_r c_r v_r^2 / 2; an AdamW step
// as torch's rule moves every parameter against its gradient; the JSON state restores bit for bit and refuses a head
// of another width.
TEST(ValueHead, GradientsStepAndState) {
  const int H = 5, R = 3;
  ValueHead vh(H);
  std::vector<float> h(static_cast<std::size_t>(H * R));
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(std::sin(1.7 * static_cast<double>(i) + 0.3));
  const double c[R] = {0.5, -1.25, 2.0};
  double v[R];
  vh.forward(h.data(), R, v);
  for (double x : v) EXPECT_EQ(x, 0.0);  // zero start
  // Move it off zero with one step on a fixed gradient, then check derivatives there.
  for (std::size_t i = 0; i < vh.grads().size(); ++i) vh.grads()[i] = std::cos(static_cast<double>(i));
  kernels::Ops::AdamW hp;
  hp.lr = 0.1f;
  hp.step = 1;
  vh.step(hp);
  for (std::size_t i = 0; i < vh.params().size(); ++i)
    EXPECT_NEAR(vh.params()[i], -0.1 * (std::cos(static_cast<double>(i)) > 0 ? 1 : -1), 1e-5) << i;  // Adam's first step: -lr sign(g)
  vh.zero_grad();
  auto loss = [&](const ValueHead& head, const std::vector<float>& x) {
    double out[R], l = 0;
    head.forward(x.data(), R, out);
    for (int r = 0; r < R; ++r) l += 0.5 * c[r] * out[r] * out[r];
    return l;
  };
  vh.forward(h.data(), R, v);
  double dv[R];
  for (int r = 0; r < R; ++r) dv[r] = c[r] * v[r];
  std::vector<float> dh(h.size());
  vh.backward(h.data(), R, dv, dh.data());
  const double eps = 1e-3;
  for (std::size_t i = 0; i < h.size(); ++i) {
    auto hp_ = h, hm = h;
    hp_[i] += static_cast<float>(eps);
    hm[i] -= static_cast<float>(eps);
    EXPECT_NEAR(dh[i], (loss(vh, hp_) - loss(vh, hm)) / (2 * eps), 2e-4) << "h " << i;
  }
  const nlohmann::json st = vh.state();
  for (std::size_t k = 0; k < vh.params().size(); ++k) {
    auto moved = st;
    ValueHead p(H), m(H);
    auto pp = st["params"].get<std::vector<float>>(), pm = pp;
    pp[k] += static_cast<float>(eps);
    pm[k] -= static_cast<float>(eps);
    moved["params"] = pp;
    p.restore(moved);
    moved["params"] = pm;
    m.restore(moved);
    EXPECT_NEAR(vh.grads()[k], (loss(p, h) - loss(m, h)) / (2 * eps), 2e-4) << "param " << k;
  }
  ValueHead back(H);
  back.restore(nlohmann::json::parse(st.dump()));
  EXPECT_EQ(back.params(), vh.params());
  EXPECT_EQ(back.state().dump(), st.dump());
  ValueHead other(H + 1);
  EXPECT_THROW(other.restore(st), UserError);
  EXPECT_TRUE(vh.finite());

  // Weight decay on the weights, not on the bias (transformers' grouping; the bias decayed until 2026-11-28): with
  // zero gradients and moments AdamW's update is 0 and only the decay moves a value.
  nlohmann::json fresh = st;
  fresh["exp_avg"] = std::vector<float>(static_cast<std::size_t>(H + 1), 0.0f);
  fresh["exp_avg_sq"] = fresh["exp_avg"];
  ValueHead d(H);
  d.restore(fresh);
  const std::vector<float> before = d.params();
  hp.weight_decay = 0.5f;
  d.step(hp);
  for (std::size_t i = 0; i < static_cast<std::size_t>(H); ++i) EXPECT_FLOAT_EQ(d.params()[i], before[i] * 0.95f) << i;
  EXPECT_EQ(d.params()[static_cast<std::size_t>(H)], before[static_cast<std::size_t>(H)]) << "the bias";
}

// The adaptive KL coefficient against trl 0.11.4's AdaptiveKLController itself (tests/data/ppo/adaptive_kl.json,
// tools/make_ppo_kl_fixtures.py): each case runs its updates in sequence from the starting coefficient.
TEST(PpoLoss, AdaptiveKlMatchesTrlController) {
  std::ifstream f(kData + "/ppo/adaptive_kl.json");
  ASSERT_TRUE(f.good()) << "tests/data/ppo/adaptive_kl.json is missing";
  const auto js = nlohmann::json::parse(f);
  ASSERT_EQ(js.at("cases").size(), 3u);
  int clipped = 0, unclipped = 0;
  for (const auto& c : js.at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const auto kls = c.at("kl").get<std::vector<double>>();
    const auto want = c.at("values").get<std::vector<double>>();
    ASSERT_EQ(kls.size(), want.size());
    double coef = c.at("init").get<double>();
    const double target = c.at("target").get<double>(), horizon = c.at("horizon").get<double>();
    for (std::size_t k = 0; k < kls.size(); ++k) {
      coef = ppo_adaptive_kl_coef(coef, kls[k], target, horizon, c.at("n").get<double>());
      EXPECT_NEAR(coef, want[k], 1e-15 * std::abs(want[k])) << "update " << k;
      (std::abs(kls[k] / target - 1) > 0.2 ? clipped : unclipped) += 1;
    }
  }
  EXPECT_GT(clipped, 5);  // the cases reach both sides of the clip
  EXPECT_GT(unclipped, 5);
  // By hand: KL 0.15 against target 0.1 clips to +0.2; 8 responses over a horizon of 16 move it by half of that.
  EXPECT_DOUBLE_EQ(ppo_adaptive_kl_coef(0.05, 0.15, 0.1, 16, 8), 0.05 * 1.1);
  EXPECT_DOUBLE_EQ(ppo_adaptive_kl_coef(0.05, 0.09, 0.1, 16, 8), 0.05 * (1 - 0.1 * 0.5));
  EXPECT_DOUBLE_EQ(ppo_adaptive_kl_coef(0.05, std::nan(""), 0.1, 16, 8), 0.05);  // a NaN KL leaves it
}

}  // namespace
}  // namespace mgrl::rl
