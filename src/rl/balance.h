// balance.h: token-balanced work assignment for GRPO ranks (issue 12). Completion lengths vary, so with the prompts
// split in equal contiguous blocks some ranks generate and train on many more tokens than others and the rest wait
// at the next collective. These functions assign items (prompts for generation, completions for training) to ranks
// in equal numbers while balancing their summed cost. They only decide who computes what: sampling draws depend on
// a completion's position in the global batch, and every loss normaliser is global, so the trained result does not
// depend on the assignment (up to the order of floating-point sums).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mgrl::rl {

// Splits items 0..n-1 (n = costs.size(), a multiple of `ranks`) over `ranks` ranks, n / ranks each, so that the
// largest summed cost is small: longest processing time first (items by decreasing cost, ties by lower index, each
// to the least-loaded rank that still has room, ties by lower rank). Returns each rank's items in increasing order.
// Deterministic: every rank computes the same assignment from the same costs.
std::vector<std::vector<std::size_t>> balanced_split(const std::vector<double>& costs, int ranks);

// The split without balancing: rank r gets the r-th contiguous block.
std::vector<std::vector<std::size_t>> contiguous_split(std::size_t n, int ranks);

// The order in which a GRPO generation round's n completions (slot order) are cut into `slices` consecutive slices of
// n / slices, one per optimizer step (grpo.steps_per_generation): the identity for one slice, else a permutation
// (Fisher-Yates) drawn from the run seed and the round's first step, so that each step trains on completions of
// many groups, as trl shuffles its generation batch before splitting it. It depends on nothing else: every rank, on
// any rank count and on resume, draws the same.
std::vector<std::size_t> round_order(std::size_t n, int slices, std::uint64_t seed, std::int64_t first_step);

// The largest and the mean summed cost of a split (for metrics and tests).
struct SplitLoad {
  double max = 0, mean = 0;
};
SplitLoad split_load(const std::vector<double>& costs, const std::vector<std::vector<std::size_t>>& split);

}  // namespace mgrl::rl
