// reward_function.h: the interface of one reward function (internal to src/rl/rewards).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rl/rewards/rewards.h"

namespace mgrl::rl {

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  // One value per sample.
  virtual std::vector<double> score(const std::vector<RewardSample>& samples, const std::string& run_dir,
                                    int threads) const = 0;
  // The longest that score() may take for `samples` on `threads` threads before its own time limits end it (0: no
  // program runs, it takes no noticeable time).
  virtual double max_seconds(std::size_t /*samples*/, int /*threads*/) const { return 0; }
  // Why a data line can earn nothing of this function whatever the completion ("column 'answer' is absent", "its
  // answer '...#### 72' is no number"), or "" when it can (or the function reads nothing of the data).
  virtual std::string unusable(const nlohmann::json& /*row*/) const { return ""; }
  // Why this function gives every completion of at most `max_tokens` tokens the same value,
  // or "" when completions of that length can differ in it.
  virtual std::string inert(int /*max_tokens*/, const std::string& /*limit_key*/) const { return ""; }
};

}  // namespace mgrl::rl
