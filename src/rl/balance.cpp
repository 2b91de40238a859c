// balance.cpp: equal-count longest-processing-time-first assignment.
#include "rl/balance.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/random.h"

namespace mgrl::rl {

std::vector<std::vector<std::size_t>> balanced_split(const std::vector<double>& costs, int ranks) {
  MGRL_CHECK(ranks > 0 && costs.size() % static_cast<std::size_t>(ranks) == 0, "balanced_split: uneven item count");
  const std::size_t per = costs.size() / static_cast<std::size_t>(ranks);
  std::vector<std::size_t> order(costs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(ranks));
  std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
  for (std::size_t i : order) {
    // The least-loaded rank with room (a linear scan: ranks are few).
    std::size_t best = out.size();
    for (std::size_t r = 0; r < out.size(); ++r)
      if (out[r].size() < per && (best == out.size() || load[r] < load[best])) best = r;
    out[best].push_back(i);
    load[best] += costs[i];
  }
  for (auto& v : out) std::sort(v.begin(), v.end());
  return out;
}

std::vector<std::vector<std::size_t>> contiguous_split(std::size_t n, int ranks) {
  MGRL_CHECK(ranks > 0 && n % static_cast<std::size_t>(ranks) == 0, "contiguous_split: uneven item count");
  const std::size_t per = n / static_cast<std::size_t>(ranks);
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(ranks));
  for (std::size_t i = 0; i < n; ++i) out[i / per].push_back(i);
  return out;
}

SplitLoad split_load(const std::vector<double>& costs, const std::vector<std::vector<std::size_t>>& split) {
  SplitLoad s;
  for (const auto& v : split) {
    double sum = 0;
    for (std::size_t i : v) sum += costs[i];
    s.max = std::max(s.max, sum);
    s.mean += sum;
  }
  if (!split.empty()) s.mean /= static_cast<double>(split.size());
  return s;
}

std::vector<std::size_t> round_order(std::size_t n, int slices, std::uint64_t seed, std::int64_t first_step) {
  MGRL_CHECK(slices > 0 && n % static_cast<std::size_t>(slices) == 0, "round_order: uneven slices");
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (slices == 1) return order;
  const std::uint64_t key = random_bits(seed ^ 0x736c69636573706cull, static_cast<std::uint64_t>(first_step));
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[random_bits(key, i) % i]);
  return order;
}

}  // namespace mgrl::rl
