// idle_pass.h: evening out the passes of ranks with unequal shares on a sharded base (model.shard_base), where every
// pass gathers each layer collectively: how many batches the busiest rank runs, and a pass whose result is dropped.
#pragma once
#include <algorithm>
#include <cstddef>
#include <initializer_list>

#include "model/transformer.h"

namespace mgrl::train {

// A rank's share of n items split contiguously over `ranks` (rank r gets [n r / ranks, n (r + 1) / ranks)) is at
// most ceil(n / ranks) items: the busiest rank runs ceil(ceil(n / ranks) / batch) batches of up to `batch` items.
// A rank holding `mine` items runs, after its own batches, as many one-token passes (token 0, the result dropped;
// passes_per_batch for each missing batch: a mode that runs two passes a batch) as it has batches fewer than that.
// The adapter is left out of them: they exist for the layer gathers, which are the same either way.
// models: the models a batch passes through, in their order (mgrl distill: the teacher, then the student); those not
// sharded are left out (they gather nothing).
inline void idle_passes(std::initializer_list<model::Transformer*> models, std::size_t mine, std::size_t n, int ranks,
                        std::size_t batch, int passes_per_batch = 1) {
  const std::size_t P = static_cast<std::size_t>(std::max(1, ranks));
  const std::size_t most = ((n + P - 1) / P + batch - 1) / batch;
  static const model::Batch one = model::Batch::from_sequences({{0}});
  float lp = 0;
  for (std::size_t k = (mine + batch - 1) / batch; k < most; ++k)
    for (int p = 0; p < passes_per_batch; ++p)
      for (model::Transformer* m : models)
        if (m->definition().sharded()) m->score(one, &lp, /*use_lora=*/false);
}
inline void idle_passes(model::Transformer& m, std::size_t mine, std::size_t n, int ranks, std::size_t batch,
                        int passes_per_batch = 1) {
  idle_passes({&m}, mine, n, ranks, batch, passes_per_batch);
}

}  // namespace mgrl::train
