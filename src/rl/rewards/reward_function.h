// reward_function.h: the interface of one reward function (internal to src/rl/rewards).
#pragma once
#include <string>
#include <vector>

#include "rl/rewards/rewards.h"

namespace mgrl::rl {

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  // One value per sample.
  virtual std::vector<double> score(const std::vector<RewardSample>& samples, const std::string& run_dir,
                                    int threads) const = 0;
};

}  // namespace mgrl::rl
