// rewards.h: GRPO's reward functions, configured by [[reward]] tables (docs/rewards.md): answer_match (an answer
// extracted from the completion against a data column), regex (a format check), overlong (DAPO's soft length
// penalty), code_exec (a fenced code block run against the data line's tests in a sandbox) and command (a user
// program reading JSON lines, printing one number per line). The total reward is the weighted sum.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"

namespace mgrl::rl {

struct RewardSample {
  std::string prompt;          // the prompt text as the model saw it (after chat formatting)
  std::string completion;      // decoded completion text (cut at a stop string, EOS not included)
  const nlohmann::json* row = nullptr;  // the whole data line (answer, tests, ...); may be nullptr
  int completion_tokens = 0;   // its length in tokens
  std::string finish_reason;   // eos, length (truncated) or stop
};

class RewardFunction;

class Rewards {
 public:
  Rewards();
  ~Rewards();
  Rewards(Rewards&&) noexcept;
  Rewards& operator=(Rewards&&) noexcept;
  // Reads and checks every [[reward]] table (regexes compiled, programs found); UserError naming file:line and
  // the key on any mistake. Needs no model.
  static Rewards from_config(const io::Config& cfg);
  std::size_t size() const { return names_.size(); }
  const std::vector<std::string>& names() const { return names_; }  // unique
  const std::vector<std::string>& kinds() const { return kinds_; }
  const std::vector<double>& weights() const { return weights_; }
  // values[i][f]: function f on sample i. run_dir: working directory of command rewards; threads: parallel
  // code_exec runs.
  std::vector<std::vector<double>> score(const std::vector<RewardSample>& samples, const std::string& run_dir,
                                         int threads) const;
  // The weighted sum of a sample's values; a function's NaN (a command's null: no value for it) adds nothing (trl's
  // nansum); NaN when no function gave a value (unscorable: advantage 0, left out of the reward statistics).
  double total(const std::vector<double>& values) const;
  // The longest that score() may take for `samples` on `threads` threads before the rewards' own time limits end it
  // (reward[].timeout_s: a command's per batch, code_exec's per completion with its test planner's 60 s): how long
  // the ranks that finish scoring first may wait for the others (MpiEnv::Patience). 0 without command or code_exec.
  double max_seconds(std::size_t samples, int threads) const;
  // The data lines against the functions that read them (answer_match's column, code_exec's tests): a UserError naming
  // `path`, the function and the first line when no line can earn a function anything whatever the completion (a
  // column that is absent everywhere, GSM8K's "...#### 72" where a number is compared); a warning with the count when
  // some lines cannot. lines[i] is rows[i]'s 1-based line. Until 2026-11-28 such a reward scored 0 in silence.
  // Returns the warnings (one line each) for the caller to say once the start-up checks have passed.
  std::vector<std::string> check_data(const std::vector<const nlohmann::json*>& rows, const std::vector<std::int64_t>& lines,
                         const std::string& path) const;
  // The functions against the generation's length limit (`max_tokens`, the key `limit_key`): a UserError when no
  // function of weight != 0 can tell two completions apart (an overlong penalty that starts beyond the limit, alone),
  // the warnings (one line each) when some cannot. Until 2026-11-28 such a reward was 0 in silence.
  std::vector<std::string> check_lengths(int max_tokens, const std::string& limit_key) const;
  // The function whose value >= 1 counts a completion as correct in evaluation: the one named `named` (a UserError
  // naming eval.accuracy_reward when none is), else the first answer_match or code_exec; -1 when there is none.
  int accuracy_index(const std::string& named) const;

 private:
  std::vector<std::unique_ptr<RewardFunction>> fns_;
  std::vector<std::string> names_, kinds_, wheres_;  // wheres_: "file:line: " of each table
  std::vector<double> weights_;
};

// Pieces exposed for tests.
// The last number of a text ("-1,234.5" -> -1234.5 as text "-1234.5"); "" when there is none.
std::string last_number(const std::string& text);
// The content of the last \boxed{...} (nested braces balanced); "" when there is none.
std::string last_boxed(const std::string& text);
// The fenced code block (```lang ... ```) of a text, first or last; found = false when there is none.
std::string code_block(const std::string& text, bool last, bool* found);
// DAPO's soft overlong penalty of a completion of `len` tokens.
double overlong_penalty(int len, int max_length, int buffer_length);

}  // namespace mgrl::rl
