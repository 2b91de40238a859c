// prompts.cpp: reading and tokenizing GRPO and PPO prompt files; a completion as the reward functions see it.
#include "rl/prompts.h"

#include <cstdio>
#include <utility>

#include "core/error.h"
#include "io/jsonl.h"

namespace mgrl::rl {

RewardSample reward_sample(const PromptRow& p, std::string completion, int completion_tokens, std::string finish_reason) {
  RewardSample s;
  s.prompt = p.text;
  s.completion = std::move(completion);
  s.row = &p.row;
  s.completion_tokens = completion_tokens;
  s.finish_reason = std::move(finish_reason);
  return s;
}

std::vector<PromptRow> load_prompts(const std::string& path, const io::Tokenizer& tok, const io::ChatTemplate& chat,
                                    int max_prompt_length) {
  std::vector<PromptRow> rows;
  io::read_jsonl(path, [&](const nlohmann::ordered_json& j, int line) {
    PromptRow p;
    p.index = line - 1;
    if (!j.is_object()) io::jsonl_error(path, line, "each line must be a JSON object");
    // {"messages": [...]}, or trl's conversational form {"prompt": [...]} (a list of messages): through the chat
    // template with the generation prompt.
    const char* chat_key = j.contains("messages") ? "messages" : j.contains("prompt") && j["prompt"].is_array() ? "prompt" : nullptr;
    if (chat_key) {
      try {
        io::ChatTemplate::check_messages(j[chat_key]);
        p.tokens = chat.encode(j[chat_key], true, io::ChatExtras::of(j));
      } catch (const UserError& e) {
        io::jsonl_error(path, line, e.what());
      }
      p.text = tok.decode(p.tokens, false);
    } else if (j.contains("prompt")) {
      if (!j["prompt"].is_string())
        io::jsonl_error(path, line, "\"prompt\" must be a string (text) or a list of messages (chat)");
      p.text = j["prompt"].get<std::string>();
      p.tokens = tok.encode(p.text);
    } else {
      io::jsonl_error(path, line, "needs a \"prompt\" (text, or a list of messages) or \"messages\" (chat) field");
    }
    if (p.tokens.empty()) io::jsonl_error(path, line, "the prompt encodes to no tokens");
    if (static_cast<int>(p.tokens.size()) > max_prompt_length) {
      p.cut = p.tokens.size() - static_cast<std::size_t>(max_prompt_length);
      p.tokens.erase(p.tokens.begin(), p.tokens.end() - max_prompt_length);
    }
    p.row = j;
    rows.push_back(std::move(p));
  });
  if (rows.empty()) throw UserError(path + ": no prompts");
  return rows;
}

dist::Patience rewards_patience(const Rewards& rewards, std::size_t most, int threads) {
  const double s = rewards.max_seconds(most, threads);
  if (!(s > 0)) return {};
  char why[160];
  std::snprintf(why, sizeof why, "the rewards of the rank scoring last (up to %.0f s for %zu completions by reward[].timeout_s)",
                s, most);
  return {s, why};
}

void wait_for_rewards(const dist::MpiEnv& env, const Rewards& rewards, std::size_t most, int threads) {
  const dist::Patience p = rewards_patience(rewards, most, threads);
  if (!p.why.empty()) env.barrier(p);
}

}  // namespace mgrl::rl
