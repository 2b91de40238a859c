// test_ppo_step.cpp: PPO's model side on the tiny Llama fixture with its LoRA adapter (tests/data/models/llama_gqa):
// the scoring pass puts the policy's and the reference's log-probs and the value head's values at the right rows;
// a mini-batch's LoRA and value-head gradients (through the log-probs and through the shared final hidden state)
// match central differences of the PPO loss; splitting a mini-batch in two halves (two ranks) and summing their
// gradients gives the whole mini-batch's.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "kernels/ops.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "rl/ppo_step.h"

namespace mgrl::rl {
namespace {

const std::string kModel = MGRL_TEST_DATA_DIR "/models/llama_gqa";

struct Rig {
  io::ModelConfig cfg = io::parse_hf_config(kModel + "/config.json");
  std::unique_ptr<kernels::Ops> ops = kernels::make_cpu_ops();
  std::unique_ptr<model::Transformer> m;
  std::unique_ptr<ValueHead> vh;
  PpoOptions o;
  std::vector<PpoSample> s;
  float temperature = 0.7f;

  Rig() {
    m = std::make_unique<model::Transformer>(cfg, *ops);
    m->load_weights(kModel);
    m->add_lora(model::read_peft_config(kModel + "/adapter_config.json"), 0).load_peft(kModel);
    vh = std::make_unique<ValueHead>(static_cast<int>(cfg.hidden_size));
    nlohmann::json st = vh->state();
    std::vector<float> p(vh->params().size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(0.2 * std::cos(1.3 * static_cast<double>(i)));
    st["params"] = p;
    vh->restore(st);
    o.response_length = 5;
    o.kl_coef = 0.1;
    o.vf_coef = 0.5;
    o.cliprange = 0.1;
    o.cliprange_value = 0.05;
    // Prompts of 2..4 tokens; responses of 5 (reached response_length) and 2..4 tokens (stopped: EOS = 2).
    const std::vector<std::vector<std::int32_t>> prompts{{5, 9}, {7, 11, 13}, {21, 4, 8, 30}, {3, 44}};
    const std::vector<std::vector<std::int32_t>> responses{{17, 23, 2}, {31, 6, 19, 40, 12}, {8, 2}, {50, 61, 9, 2}};
    const double scores[] = {1.0, -0.5, 0.25, 2.0};
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      PpoSample x;
      x.prompt = prompts[i];
      x.response = responses[i];
      x.seq.score = scores[i];
      x.seq.has_eos = responses[i].back() == 2;
      s.push_back(std::move(x));
    }
  }
};

TEST(PpoStep, ScoringPassPutsLogProbsAndValuesAtTheirRows) {
  Rig u;
  ppo_score(*u.m, *u.vh, u.temperature, u.o.response_length, 3, u.s);
  for (std::size_t i = 0; i < u.s.size(); ++i) {
    const PpoSample& x = u.s[i];
    // Alone, packed as [prompt + response]: the response's log-probs, with and without the adapter.
    std::vector<std::int32_t> q = x.prompt;
    q.insert(q.end(), x.response.begin(), x.response.end());
    const model::Batch one = model::Batch::from_sequences({q});
    std::vector<float> lp(q.size()), ref(q.size());
    u.m->score(one, lp.data(), true, 1.0f / u.temperature);
    u.m->score(one, ref.data(), false, 1.0f / u.temperature);
    ASSERT_EQ(x.seq.logp.size(), x.response.size());
    for (std::size_t t = 0; t < x.response.size(); ++t) {
      EXPECT_NEAR(x.seq.logp[t], lp[x.prompt.size() + t], 1e-5) << i << " " << t;
      EXPECT_NEAR(x.seq.ref[t], ref[x.prompt.size() + t], 1e-5) << i << " " << t;
    }
    EXPECT_NE(x.seq.logp, x.seq.ref) << "the reference is the adapter switched off";
    // Values: the head on the hidden rows from the last prompt token on (n + 1 positions when stopped early).
    const std::size_t nv = static_cast<std::size_t>(ppo_value_positions(static_cast<int>(x.response.size()), 5));
    ASSERT_EQ(x.seq.values.size(), nv);
    EXPECT_EQ(nv, x.response.size() + (x.response.size() < 5 ? 1 : 0));
    u.m->forward(one, lp.data(), true, false);
    const auto h = u.m->final_hidden();
    std::vector<double> v(nv);
    u.vh->forward(h.data() + (x.prompt.size() - 1) * u.cfg.hidden_size, static_cast<int>(nv), v.data());
    for (std::size_t t = 0; t < nv; ++t) EXPECT_NEAR(x.seq.values[t], v[t], 1e-5) << i << " " << t;
  }
  // A mini-batch at the rollout's weights reads the same rows: ratio 1, new values = old values (nothing clipped,
  // the value terms are the squared GAE advantages).
  std::vector<PpoSequence> seqs;
  for (auto& x : u.s) seqs.push_back(x.seq);
  ppo_advantages(u.o, seqs);
  double want_vf = 0, pg = 0, vf = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    u.s[i].seq = seqs[i];
    for (std::size_t t = 0; t < seqs[i].values.size(); ++t)
      want_vf += (seqs[i].values[t] - seqs[i].returns[t]) * (seqs[i].values[t] - seqs[i].returns[t]);
    pg += seqs[i].n();
    vf += static_cast<double>(seqs[i].values.size());
  }
  const PpoTerms t = ppo_minibatch(*u.m, *u.vh, u.o, u.temperature, u.s, {0, 1, 2, 3}, pg, vf, 1.0, false);
  EXPECT_LT(t.logdiff_sq, 1e-9);
  EXPECT_EQ(t.vf_clipped, 0);
  EXPECT_NEAR(t.vf_sum, want_vf, 1e-5 * want_vf);
  EXPECT_EQ(t.pg_tokens, pg);
  EXPECT_EQ(t.vf_tokens, vf);
}

// The PPO loss of a mini-batch as a function of the weights (forward only).
double minibatch_loss(Rig& u, const std::vector<std::size_t>& idx, double pg_tokens, double vf_tokens) {
  const PpoTerms t = ppo_minibatch(*u.m, *u.vh, u.o, u.temperature, u.s, idx, pg_tokens, vf_tokens, 1.0, false);
  PpoTerms c = t;
  c.pg_tokens = pg_tokens;
  c.vf_tokens = vf_tokens;
  return ppo_loss(u.o, c).loss;
}

TEST(PpoStep, MinibatchGradientsMatchFiniteDifferencesAndSplitOverRanks) {
  Rig u;
  ppo_score(*u.m, *u.vh, u.temperature, u.o.response_length, 4, u.s);
  std::vector<PpoSequence> seqs;
  for (auto& x : u.s) seqs.push_back(x.seq);
  ppo_advantages(u.o, seqs);
  for (std::size_t i = 0; i < seqs.size(); ++i) u.s[i].seq = seqs[i];
  // Move the policy and the value head away from the rollout's so that ratios and values clip.
  model::LoraParams& lora = *u.m->lora();
  float* params = lora.params();  // host memory on the CPU backend
  for (std::size_t i = 0; i < lora.numel(); ++i) params[i] += static_cast<float>(0.05 * std::sin(0.7 * static_cast<double>(i)));
  {
    nlohmann::json st = u.vh->state();
    auto p = st["params"].get<std::vector<float>>();
    for (std::size_t i = 0; i < p.size(); ++i) p[i] += static_cast<float>(0.01 * std::sin(2.1 * static_cast<double>(i)));
    st["params"] = p;
    u.vh->restore(st);
  }
  const std::vector<std::size_t> idx{0, 1, 3};
  double pg = 0, vf = 0;
  for (std::size_t i : idx) {
    pg += static_cast<double>(u.s[i].seq.n());
    vf += static_cast<double>(u.s[i].seq.values.size());
  }
  lora.zero_grads();
  u.vh->zero_grad();
  const PpoTerms t = ppo_minibatch(*u.m, *u.vh, u.o, u.temperature, u.s, idx, pg, vf, 1.0, true);
  EXPECT_GT(t.pg_clipped, 0) << "no ratio clipped";
  EXPECT_GT(t.vf_clipped, 0) << "no value clipped";
  std::vector<float> grads(lora.numel());
  u.ops->download(grads.data(), lora.grads(), grads.size() * 4);
  const std::vector<double> vgrads = u.vh->grads();

  // Two "ranks": {0, 3} and {1}, each normalised by the whole mini-batch's counts; their gradients add up.
  lora.zero_grads();
  u.vh->zero_grad();
  ppo_minibatch(*u.m, *u.vh, u.o, u.temperature, u.s, {0, 3}, pg, vf, 1.0, true);
  ppo_minibatch(*u.m, *u.vh, u.o, u.temperature, u.s, {1}, pg, vf, 1.0, true);
  std::vector<float> split(lora.numel());
  u.ops->download(split.data(), lora.grads(), split.size() * 4);
  for (std::size_t i = 0; i < grads.size(); ++i) EXPECT_NEAR(split[i], grads[i], 1e-6 + 1e-4 * std::fabs(grads[i])) << i;
  for (std::size_t i = 0; i < vgrads.size(); ++i)
    EXPECT_NEAR(u.vh->grads()[i], vgrads[i], 1e-6 + 1e-5 * std::fabs(vgrads[i])) << i;  // f32 hidden states of other packings
  // An empty share (a rank with no sample in this mini-batch) adds nothing.
  ppo_minibatch(*u.m, *u.vh, u.o, u.temperature, u.s, {}, pg, vf, 1.0, true);
  std::vector<float> after(lora.numel());
  u.ops->download(after.data(), lora.grads(), after.size() * 4);
  EXPECT_EQ(after, split);

  // Central differences (Richardson) on two coordinates of every LoRA slot and on value-head parameters.
  int checked = 0;
  for (const auto& slot : lora.slots()) {
    for (const std::size_t off : {slot.a_offset + 1, slot.b_offset + 2}) {
      const float x0 = params[off];
      auto central = [&](float h) {
        params[off] = x0 + h;
        const double up = minibatch_loss(u, idx, pg, vf);
        params[off] = x0 - h;
        const double down = minibatch_loss(u, idx, pg, vf);
        params[off] = x0;
        return (up - down) / (2.0 * h);
      };
      const float h = 4e-2f * std::max(1.0f, std::abs(x0));
      const double num = (4.0 * central(h / 2) - central(h)) / 3.0;
      EXPECT_NEAR(grads[off], num, 1e-2 * std::max(1e-2, std::abs(num))) << "layer " << slot.layer << " offset " << off;
      ++checked;
    }
  }
  const nlohmann::json st = u.vh->state();
  for (const std::size_t k : {std::size_t{0}, std::size_t{17}, u.vh->params().size() - 1}) {
    auto at = [&](double e) {
      nlohmann::json moved = st;
      auto p = st["params"].get<std::vector<float>>();
      p[k] += static_cast<float>(e);
      moved["params"] = p;
      u.vh->restore(moved);
      return minibatch_loss(u, idx, pg, vf);
    };
    const double num = (at(1e-3) - at(-1e-3)) / 2e-3;
    u.vh->restore(st);
    EXPECT_NEAR(vgrads[k], num, 1e-2 * std::max(1e-2, std::abs(num))) << "value head " << k;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

}  // namespace
}  // namespace mgrl::rl
