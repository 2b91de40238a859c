// test_train.cpp: the pieces of the SFT loop: learning-rate schedules, the epoch sampler and its cursor,
// SFT examples (loss on completion tokens, EOS, truncation, errors), AdamW against a double-precision
// implementation of torch.optim.AdamW's update.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"
#include "kernels/ops.h"
#include "tests/unit/test_util.h"
#include "train/data.h"
#include "train/schedule.h"

namespace mgrl::train {
namespace {

TEST(Schedule, WarmupThenDecay) {
  Schedule s;
  s.lr = 1.0;
  s.warmup_steps = 4;
  s.total_steps = 14;
  for (const char* kind : {"constant", "linear", "cosine"}) {
    s.kind = kind;
    EXPECT_DOUBLE_EQ(s.at(0), 0.25) << kind;
    EXPECT_DOUBLE_EQ(s.at(3), 1.0) << kind;
    EXPECT_DOUBLE_EQ(s.at(4), 1.0) << kind;  // first step after warmup: progress 0
  }
  s.kind = "constant";
  EXPECT_DOUBLE_EQ(s.at(13), 1.0);
  s.kind = "linear";
  EXPECT_DOUBLE_EQ(s.at(9), 0.5);
  EXPECT_DOUBLE_EQ(s.at(14), 0.0);
  s.kind = "cosine";
  EXPECT_NEAR(s.at(9), 0.5, 1e-12);
  EXPECT_NEAR(s.at(6), 0.5 * (1 + std::cos(M_PI * 0.2)), 1e-12);
  EXPECT_EQ(Schedule::warmup_from_ratio(0.1, 95), 10);  // rounded up
  s.kind = "nope";
  EXPECT_THROW(s.at(5), UserError);
}

TEST(Sampler, EpochsArePermutationsAndTheCursorResumes) {
  Sampler s(10, 7);
  DataCursor c;
  const auto a = s.next(c, 6), b = s.next(c, 6);  // crosses into epoch 1
  EXPECT_EQ(c.epoch, 1);
  EXPECT_EQ(c.position, 2);
  std::vector<std::size_t> epoch0(a.begin(), a.end());
  epoch0.insert(epoch0.end(), b.begin(), b.begin() + 4);
  EXPECT_EQ(epoch0, s.order(0));
  EXPECT_EQ(std::set<std::size_t>(epoch0.begin(), epoch0.end()).size(), 10u);
  EXPECT_NE(s.order(0), s.order(1));
  EXPECT_NE(s.order(0), Sampler(10, 8).order(0));
  // A cursor saved and restored continues the same sequence.
  DataCursor saved = c;
  const auto next1 = s.next(c, 5);
  Sampler again(10, 7);
  EXPECT_EQ(again.next(saved, 5), next1);
}

io::Tokenizer quickstart_tokenizer() { return io::Tokenizer::from_dir(MGRL_SOURCE_DIR "/inputs/quickstart"); }

TEST(Data, LossCoversTheCompletionAndEos) {
  const auto tok = quickstart_tokenizer();
  const auto path = test::write_temp("sft.jsonl", "{\"prompt\": \"12+3=\", \"completion\": \"15\"}\n\n"
                                                  "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n");
  const auto ex = load_examples(path, tok, DataOptions{});
  ASSERT_EQ(ex.size(), 2u);
  // <bos> 1 2 + 3 = | 1 5 <eos>
  EXPECT_EQ(ex[0].prompt_len, 6);
  EXPECT_EQ(ex[0].tokens.size(), 9u);
  EXPECT_EQ(ex[0].tokens.front(), *tok.bos_id());
  EXPECT_EQ(ex[0].tokens.back(), *tok.eos_id());
  EXPECT_EQ(tok.decode(ex[0].prompt_tokens(), true), "12+3=");
  EXPECT_EQ(ex[0].completion, "15");
  DataOptions shortish;
  shortish.max_seq_len = 7;  // completion cut to one token
  const auto cut = load_examples(path, tok, shortish);
  EXPECT_EQ(cut[0].tokens.size(), 7u);
  EXPECT_EQ(cut[0].prompt_len, 6);
}

TEST(Data, BrokenLinesNameFileAndLine) {
  const auto tok = quickstart_tokenizer();
  auto msg = test::error_of([&] {
    load_examples(test::write_temp("b1.jsonl", "{\"prompt\": \"1=\", \"completion\": \"1\"}\n{\"prompt\": 3}\n"), tok, {});
  });
  EXPECT_NE(msg.find("b1.jsonl:2: expected {\"prompt\", \"completion\"}"), std::string::npos) << msg;
  msg = test::error_of([&] { load_examples(test::write_temp("b2.jsonl", "{\"prompt\": \"1=\", \"completion\": \"1\"\n"), tok, {}); });
  EXPECT_NE(msg.find("b2.jsonl:1: invalid JSON"), std::string::npos) << msg;
  DataOptions tiny;
  tiny.max_seq_len = 3;
  msg = test::error_of([&] {
    load_examples(test::write_temp("b3.jsonl", "{\"prompt\": \"123+4=\", \"completion\": \"127\"}\n"), tok, tiny);
  });
  EXPECT_NE(msg.find("b3.jsonl:1: the prompt alone has 7 tokens"), std::string::npos) << msg;
  msg = test::error_of([&] {
    load_examples(test::write_temp("b4.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"1=\"}]}\n"), tok, {});
  });
  EXPECT_NE(msg.find("b4.jsonl:1: \"messages\" must end with an assistant message"), std::string::npos) << msg;
  msg = test::error_of([&] { load_examples(test::write_temp("b5.jsonl", "\n\n"), tok, {}); });
  EXPECT_NE(msg.find("b5.jsonl: no examples"), std::string::npos) << msg;
  // Found by fuzzing (fuzz/fuzz_jsonl.cpp): a last message whose role is not a string was a JSON library exception
  // (an internal error, exit 1), not this line's error. Anything else than UserError fails the test.
  for (const char* line : {"{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}", "{\"messages\": [{\"role\": null}]}",
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": [1], \"content\": \"b\"}]}"}) {
    msg = test::error_of([&] { load_examples(test::write_temp("b6.jsonl", std::string(line) + "\n"), tok, {}); });
    EXPECT_NE(msg.find("b6.jsonl:1: each message needs string \"role\" and \"content\""), std::string::npos) << line;
  }
}

// Chat data through the model's template: every assistant turn is trained (its text and the turn's end token),
// nothing else; prompt_tokens() is the conversation up to the final turn, as generation would see it.
TEST(Data, ChatTemplateTrainsEveryAssistantTurn) {
  const auto tok = io::Tokenizer::from_dir(MGRL_SOURCE_DIR "/tests/data/tokenizers/llama3_bytelevel");
  const io::ChatTemplate chat(tok, io::ChatOptions{});
  DataOptions o;
  o.chat = &chat;
  const auto path = test::write_temp("chat.jsonl",
                                     "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
                                     "\"content\": \"Hello there\"}, {\"role\": \"user\", \"content\": \"Bye\"}, "
                                     "{\"role\": \"assistant\", \"content\": \"See you\"}]}\n");
  const auto ex = load_examples(path, tok, o);
  ASSERT_EQ(ex.size(), 1u);
  ASSERT_EQ(ex[0].loss_mask.size(), ex[0].tokens.size());
  std::string trained;
  for (std::size_t t = 0; t < ex[0].tokens.size(); ++t)
    if (ex[0].loss_mask[t]) trained += tok.decode({ex[0].tokens[t]});
  EXPECT_EQ(trained, "Hello there<|eot_id|>See you<|eot_id|>");
  EXPECT_EQ(tok.decode(ex[0].prompt_tokens()),
            chat.text(nlohmann::json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"},
                                                {"role": "user", "content": "Bye"}])"), true));
  EXPECT_EQ(ex[0].completion, "See you");
  DataOptions tiny = o;
  tiny.max_seq_len = 5;
  const auto msg = test::error_of([&] { load_examples(path, tok, tiny); });
  EXPECT_NE(msg.find("chat.jsonl:1: the prompt alone has"), std::string::npos) << msg;
}

TEST(AdamW, MatchesTorchUpdateRule) {
  auto ops = kernels::make_cpu_ops();
  const std::size_t n = 37;
  std::vector<float> p(n), g(n), m(n, 0), v(n, 0);
  std::vector<double> P(n), M(n, 0), V(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(std::sin(1.0 + i));
    P[i] = p[i];
  }
  kernels::Ops::AdamW hp;
  hp.lr = 0.01f;
  hp.weight_decay = 0.1f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-6f;
  for (int t = 1; t <= 5; ++t) {
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(std::cos(0.3 * t + i) * (i % 3 + 0.5));
    hp.step = t;
    hp.grad_scale = t == 3 ? 0.5f : 1.0f;
    ops->adamw(p.data(), g.data(), m.data(), v.data(), n, hp);
    for (std::size_t i = 0; i < n; ++i) {  // torch.optim.AdamW, in double
      const double gi = static_cast<double>(g[i]) * hp.grad_scale;
      P[i] *= 1.0 - static_cast<double>(hp.lr) * hp.weight_decay;
      M[i] = hp.beta1 * M[i] + (1 - static_cast<double>(hp.beta1)) * gi;
      V[i] = hp.beta2 * V[i] + (1 - static_cast<double>(hp.beta2)) * gi * gi;
      const double mh = M[i] / (1 - std::pow(static_cast<double>(hp.beta1), t));
      const double vh = V[i] / (1 - std::pow(static_cast<double>(hp.beta2), t));
      P[i] -= hp.lr * mh / (std::sqrt(vh) + hp.eps);
    }
  }
  for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], P[i], 2e-6 * std::max(1.0, std::abs(P[i]))) << i;
  EXPECT_NEAR(ops->sum_squares(g.data(), n), [&] {
    double s = 0;
    for (float x : g) s += static_cast<double>(x) * x;
    return s;
  }(), 1e-12);
  g[5] = NAN;
  EXPECT_FALSE(std::isfinite(ops->sum_squares(g.data(), n)));
}

}  // namespace
}  // namespace mgrl::train
