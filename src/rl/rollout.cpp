// rollout.cpp: rollouts as JSON and as HDF5 rollout buffer files.
#include "rl/rollout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "io/hdf5_file.h"

namespace mgrl::rl {

nlohmann::json num(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}
namespace {
template <class T>
nlohmann::json nums(const std::vector<T>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const T x : v) a.push_back(num(static_cast<double>(x)));
  return a;
}
}  // namespace
nlohmann::json nums(const std::vector<float>& v) { return nums<float>(v); }
nlohmann::json nums(const std::vector<double>& v) { return nums<double>(v); }
double num_of(const nlohmann::json& j) {
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  return j.get<double>();  // anything else that is no number: nlohmann's type error
}
template <class T>
std::vector<T> nums_of(const nlohmann::json& j) {
  std::vector<T> v;
  v.reserve(j.size());
  for (const auto& x : j) v.push_back(static_cast<T>(num_of(x)));
  return v;
}
template std::vector<float> nums_of<float>(const nlohmann::json&);
template std::vector<double> nums_of<double>(const nlohmann::json&);

nlohmann::json to_json(const Rollout& r) {
  nlohmann::json j = {{"k", r.slot},      {"i", r.prompt_index},       {"g", r.generation},  {"p", r.prompt},
                      {"c", r.completion}, {"f", r.finish_reason},      {"rs", nums(r.rewards)}, {"r", num(r.reward)},
                      {"a", num(r.advantage)}, {"s", nums(r.sample_logps)}, {"m", r.masked}};
  if (!r.old_logps.empty()) j["o"] = nums(r.old_logps);
  if (!r.ref_logps.empty()) j["x"] = nums(r.ref_logps);
  return j;
}

Rollout rollout_from_json(const nlohmann::json& j) {
  Rollout r;
  r.slot = j.value("k", std::int64_t{-1});  // absent in checkpoints before balancing: the caller numbers them
  r.prompt_index = j.at("i").get<std::int64_t>();
  r.generation = j.at("g").get<int>();
  r.prompt = j.at("p").get<std::vector<std::int32_t>>();
  r.completion = j.at("c").get<std::vector<std::int32_t>>();
  r.finish_reason = j.at("f").get<std::string>();
  r.rewards = nums_of<double>(j.at("rs"));
  r.reward = num_of(j.at("r"));
  r.advantage = num_of(j.at("a"));
  r.sample_logps = nums_of<float>(j.at("s"));
  r.masked = j.at("m").get<bool>();
  if (j.contains("o")) r.old_logps = nums_of<float>(j["o"]);
  if (j.contains("x")) r.ref_logps = nums_of<float>(j["x"]);
  return r;
}

const std::vector<std::string>& finish_reason_names() {
  static const std::vector<std::string> names{"eos", "length", "stop"};
  return names;
}

std::int8_t finish_reason_code(const std::string& reason) {
  const auto& n = finish_reason_names();
  const auto it = std::find(n.begin(), n.end(), reason);
  MGRL_CHECK(it != n.end(), "unknown finish reason '" + reason + "'");
  return static_cast<std::int8_t>(it - n.begin());
}

std::string write_rollout_file(const std::string& dir, const std::vector<Rollout>& rs, const RolloutFileInfo& info) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UserError(dir + ": cannot create the rollout directory (" + ec.message() + ")");
  char name[40];
  std::snprintf(name, sizeof name, "/step_%08lld.h5", static_cast<long long>(info.step));
  const std::string path = dir + name;
  const std::size_t N = rs.size(), F = info.reward_names.size();
  std::size_t Lp = 1, Lc = 1;
  for (const auto& r : rs) {
    Lp = std::max(Lp, r.prompt.size());
    Lc = std::max(Lc, r.completion.size());
  }
  std::vector<std::int32_t> prompt_index(N), gen(N), plen(N), clen(N), ptok(N * Lp, -1), ctok(N * Lc, -1);
  std::vector<std::int8_t> finish(N);
  std::vector<float> rewards(N * F), reward(N), adv(N);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> lps(N * Lc, nan), refs(N * Lc, nan);
  std::vector<float> vals(N * (Lc + 1), nan), rets(N * (Lc + 1), nan), tadv(N * Lc, nan);
  bool have_ref = false, have_values = false;
  for (std::size_t i = 0; i < N; ++i) {
    const Rollout& r = rs[i];
    prompt_index[i] = static_cast<std::int32_t>(r.prompt_index);
    gen[i] = r.generation;
    plen[i] = static_cast<std::int32_t>(r.prompt.size());
    clen[i] = static_cast<std::int32_t>(r.completion.size());
    std::copy(r.prompt.begin(), r.prompt.end(), ptok.begin() + static_cast<std::ptrdiff_t>(i * Lp));
    std::copy(r.completion.begin(), r.completion.end(), ctok.begin() + static_cast<std::ptrdiff_t>(i * Lc));
    finish[i] = finish_reason_code(r.finish_reason);
    MGRL_CHECK(r.rewards.size() == F, "a rollout has the wrong number of reward values");
    for (std::size_t f = 0; f < F; ++f) rewards[i * F + f] = static_cast<float>(r.rewards[f]);
    reward[i] = static_cast<float>(r.reward);
    adv[i] = static_cast<float>(r.advantage);
    std::copy(r.sample_logps.begin(), r.sample_logps.end(), lps.begin() + static_cast<std::ptrdiff_t>(i * Lc));
    if (!r.values.empty()) {
      have_values = true;
      std::copy(r.values.begin(), r.values.end(), vals.begin() + static_cast<std::ptrdiff_t>(i * (Lc + 1)));
      std::copy(r.returns.begin(), r.returns.end(), rets.begin() + static_cast<std::ptrdiff_t>(i * (Lc + 1)));
      std::copy(r.token_advantages.begin(), r.token_advantages.end(), tadv.begin() + static_cast<std::ptrdiff_t>(i * Lc));
    }
    if (!r.ref_logps.empty()) {
      have_ref = true;
      std::copy(r.ref_logps.begin(), r.ref_logps.end(), refs.begin() + static_cast<std::ptrdiff_t>(i * Lc));
    }
  }
  io::H5Writer w(path);
  const std::uint64_t n = N, lp = Lp, lc = Lc, f = F;
  io::write_or_explain(path, "the rollout file", [&] {  // a full disk: a UserError naming it (FatalError before)
    w.write("prompt_index", DType::I32, {n}, prompt_index.data());
    w.write("generation_index", DType::I32, {n}, gen.data());
    w.write("prompt_tokens", DType::I32, {n, lp}, ptok.data());
    w.write("prompt_lengths", DType::I32, {n}, plen.data());
    w.write("completion_tokens", DType::I32, {n, lc}, ctok.data());
    w.write("completion_lengths", DType::I32, {n}, clen.data());
    w.write_i8("finish_reason", {n}, finish.data());
    w.attr("finish_reason", "names", finish_reason_names());
    w.write("rewards", DType::F32, {n, f}, rewards.data());
    w.attr("rewards", "names", info.reward_names);
    w.write("reward", DType::F32, {n}, reward.data());
    w.write("advantages", DType::F32, {n}, adv.data());
    w.write("logprobs", DType::F32, {n, lc}, lps.data());
    if (have_ref) w.write("ref_logprobs", DType::F32, {n, lc}, refs.data());
    if (have_values) {  // PPO
      w.write("values", DType::F32, {n, lc + 1}, vals.data());
      w.write("returns", DType::F32, {n, lc + 1}, rets.data());
      w.write("token_advantages", DType::F32, {n, lc}, tadv.data());
    }
    w.attr("/", "step", info.step);
    w.attr("/", "seed", static_cast<std::int64_t>(info.seed));
    w.attr("/", "config", info.config_text);
    w.attr("/", "format", std::string("mgrl-rollouts"));
    w.attr("/", "format_version", std::int64_t{1});
    w.commit();
  });
  return path;
}

void write_rollouts_of_step(const std::string& dir, const std::vector<Rollout>& rollouts, const RolloutFileInfo& info) {
  static bool failed = false;
  if (failed) return;
  try {
    write_rollout_file(dir, rollouts, info);
  } catch (const UserError& e) {
    failed = true;
    log::warn(std::string(e.what()) + "; the rollout files of later steps are not written (the run goes on)");
  }
}

}  // namespace mgrl::rl
