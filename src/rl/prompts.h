// prompts.h: GRPO prompt data: JSONL lines with a `prompt` text or chat `messages` and any other columns
// (answer, tests, ...) which the rewards read; tokenized once; prompts longer than max_prompt_length keep their
// last tokens (mgrl's limit, grpo.max_prompt_length; trl 1.16's GRPOTrainer keeps whole prompts).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/mpi_env.h"
#include "io/chat_template.h"
#include "io/tokenizer.h"
#include "rl/rewards/rewards.h"

namespace mgrl::rl {

struct PromptRow {
  std::int64_t index = 0;             // 0-based line in the file (blank lines count)
  std::vector<std::int32_t> tokens;   // what the model sees
  std::string text;                   // the prompt as text (chat-formatted for messages), for the rewards
  nlohmann::json row;                 // the whole line
  std::size_t cut = 0;                // tokens left out at its start (a prompt longer than the maximum keeps its end)
};

// What the reward functions see of one completion of prompt row p: the prompt text, the decoded completion, the
// whole data line (p must outlive the sample), the completion's length in tokens and why it ended.
RewardSample reward_sample(const PromptRow& p, std::string completion, int completion_tokens, std::string finish_reason);

// Collective, after the rewards of a generation round: where the ranks that finish scoring first wait for the
// others. Rewards that run programs (command, code_exec) may take up to their own limits (reward[].timeout_s), which
// may exceed runtime.comm_timeout_s: the wait may last that much longer (MpiEnv::Patience), and the timeout's line
// names it. `most`: the largest number of completions any rank scores (the same on every rank). Without such
// rewards, nothing (no collective).
void wait_for_rewards(const dist::MpiEnv& env, const Rewards& rewards, std::size_t most, int threads);
// The patience of that wait (an empty `why` without such rewards), for a collective that follows scoring.
dist::Patience rewards_patience(const Rewards& rewards, std::size_t most, int threads);

// UserError "file:line: ..." for a broken line, a line with neither prompt nor messages, or an empty file.
std::vector<PromptRow> load_prompts(const std::string& path, const io::Tokenizer& tok, const io::ChatTemplate& chat,
                                    int max_prompt_length);

}  // namespace mgrl::rl
