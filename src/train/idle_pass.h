// idle_pass.h: evening out the passes of ranks with unequal shares on a sharded base (model.shard_base), where every
// pass gathers each layer collectively: how many batches the busiest rank runs, and a pass whose result is dropped.
#pragma once
#include <algorithm>
#include <cstddef>

#include "model/transformer.h"

namespace mgrl::train {

// The most batches of up to `batch` items that any rank runs when n items are split contiguously over `ranks`
// (rank r gets [n r / ranks, n (r + 1) / ranks)).
inline std::size_t most_batches(std::size_t n, int ranks, std::size_t batch) {
  const std::size_t P = static_cast<std::size_t>(ranks);
  std::size_t most = 0;
  for (std::size_t r = 0; r < P; ++r) most = std::max(most, (n * (r + 1) / P - n * r / P + batch - 1) / batch);
  return most;
}

// A one-token scoring pass (token 0) whose log-prob is dropped.
inline void idle_pass(model::Transformer& m, bool use_lora) {
  static const model::Batch one = model::Batch::from_sequences({{0}});
  float lp = 0;
  m.score(one, &lp, use_lora);
}

}  // namespace mgrl::train
