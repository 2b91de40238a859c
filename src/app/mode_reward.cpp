// mode_reward.cpp: `mgrl reward`: scores a JSONL of {"prompt", "completion", ...columns} lines with the configured
// [[reward]] functions, without a model, and writes one JSON line per input line to standard output (rank 0).
#include <cstdint>
#include <iostream>
#include <limits>

#include "app/modes.h"
#include "core/error.h"
#include "dist/device.h"
#include "dist/mpi_env.h"
#include "io/config.h"
#include "io/jsonl.h"
#include "rl/prompts.h"
#include "rl/rewards/rewards.h"

namespace mgrl::app {

int run_reward(Context& ctx) {
  const auto& cfg = ctx.cfg;
  const std::string input = cfg.get_string("data.input");
  rl::Rewards rewards;
  std::vector<nlohmann::json> rows;
  std::vector<rl::RewardSample> samples;
  ctx.env.agree([&] {
    rewards = rl::Rewards::from_config(cfg);
    if (rewards.size() == 0)
      throw UserError((cfg.file().empty() ? std::string("configuration") : cfg.file()) +
                      ": no [[reward]] table: nothing to score (docs/rewards.md)");
    io::read_jsonl(input, [&](const nlohmann::ordered_json& j, int line) {
      if (!j.is_object() || !j.contains("completion") || !j["completion"].is_string())
        io::jsonl_error(input, line, "each line needs a string \"completion\" (and usually \"prompt\")");
      if (j.contains("prompt") && !j["prompt"].is_string()) io::jsonl_error(input, line, "\"prompt\" must be a string");
      if (j.contains("completion_tokens") &&
          (!j["completion_tokens"].is_number_integer() || j["completion_tokens"].get<std::int64_t>() < 0 ||
           j["completion_tokens"].get<std::int64_t>() > std::numeric_limits<int>::max()))
        io::jsonl_error(input, line, "\"completion_tokens\" must be an integer in [0, 2^31)");
      // Read below with a default: a value of another type would be a JSON library exception (exit 1), not this line.
      if (j.contains("finish_reason") && !j["finish_reason"].is_string())
        io::jsonl_error(input, line, "\"finish_reason\" must be a string");
      rows.push_back(j);
    });
  });
  for (const auto& j : rows) {
    rl::RewardSample s;
    s.prompt = j.value("prompt", "");
    s.completion = j["completion"].get<std::string>();
    s.row = &j;
    // Without a model no tokenizer is needed: completion_tokens from the line, else whitespace-separated words.
    if (j.contains("completion_tokens")) {
      s.completion_tokens = j["completion_tokens"].get<int>();
    } else {
      bool in_word = false;
      for (char c : s.completion) {
        const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
        if (!space && !in_word) ++s.completion_tokens;
        in_word = !space;
      }
    }
    s.finish_reason = j.value("finish_reason", "eos");
    samples.push_back(std::move(s));
  }
  std::vector<std::vector<double>> values;
  const int threads = std::max(1, ctx.device.cpu_threads);
  ctx.env.agree([&] { if (ctx.env.rank() == 0) values = rewards.score(samples, ".", threads); },
                rl::rewards_patience(rewards, samples.size(), threads));  // the other ranks wait for rank 0's
  if (ctx.env.rank() != 0) return 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    nlohmann::json out = {{"index", i}, {"rewards", nlohmann::json::object()}};
    for (std::size_t f = 0; f < rewards.size(); ++f) out["rewards"][rewards.names()[f]] = values[i][f];
    out["reward"] = rewards.total(values[i]);
    std::cout << out.dump() << "\n";
  }
  return 0;
}

}  // namespace mgrl::app
