// rollout.h: one sampled completion of a GRPO (or PPO) batch with everything the loss and the logs need, its JSON form
// (gathered to rank 0 and kept in checkpoints while a generation round is in progress), and the rollout buffer
// files <log.dir>/rollouts/step_<8 digits>.h5 (layout: docs/grpo.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mgrl::rl {

struct Rollout {
  std::int64_t slot = 0;          // position in the global batch: prompt position x G + generation
  std::int64_t prompt_index = 0;  // 0-based line of the prompt in the data file
  int generation = 0;             // 0..G-1
  std::vector<std::int32_t> prompt, completion;
  std::string finish_reason;      // eos | length | stop
  // The completion's text as the rewards see it: decoded, cut at a stop string (the generator's); not sent between
  // ranks nor kept in checkpoints (rewards are scored where the completion was generated).
  std::string text;
  std::vector<double> rewards;    // one per reward function
  double reward = 0, advantage = 0;
  std::vector<float> sample_logps;  // log-probs at sampling time (temperature 1, unfiltered), one per token
  std::vector<float> old_logps;     // old policy (at the sampling temperature); empty when a round serves one step
  std::vector<float> ref_logps;     // reference; empty when beta = 0
  bool masked = false;              // truncated and grpo.mask_truncated_completions: no loss
  // PPO (empty for GRPO): the value head at the value positions, the returns there, the whitened per-token advantages.
  std::vector<float> values, returns, token_advantages;
};

// JSON has no NaN or infinity (nlohmann writes null): a diverged policy's log-probs are NaN, and rollouts must still
// cross ranks and checkpoints intact. Numbers go through these: non-finite values travel as the strings "nan",
// "inf", "-inf"; num_of also reads plain numbers (nlohmann's type error for anything else).
nlohmann::json num(double v);
nlohmann::json nums(const std::vector<float>& v);
nlohmann::json nums(const std::vector<double>& v);
double num_of(const nlohmann::json& j);
template <class T>
std::vector<T> nums_of(const nlohmann::json& j);  // T: float or double
nlohmann::json to_json(const Rollout& r);
Rollout rollout_from_json(const nlohmann::json& j);

// finish_reason codes of the rollout files.
const std::vector<std::string>& finish_reason_names();  // {"eos", "length", "stop"}
std::int8_t finish_reason_code(const std::string& reason);

struct RolloutFileInfo {
  std::int64_t step = 0;
  std::uint64_t seed = 0;
  std::string config_text;
  std::vector<std::string> reward_names;
};
// Writes <dir>/step_<8 digits>.h5 (temporary name, then renamed); rollouts in prompt order.
std::string write_rollout_file(const std::string& dir, const std::vector<Rollout>& rollouts, const RolloutFileInfo& info);
// The training loops' rollout files (rank 0): write_rollout_file, but a file that cannot be written (a full disk) is
// a warning, and no later rollout file is written: the run goes on, as it does when its metrics cannot be written.
void write_rollouts_of_step(const std::string& dir, const std::vector<Rollout>& rollouts, const RolloutFileInfo& info);

}  // namespace mgrl::rl
