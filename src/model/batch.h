// batch.h: a packed batch of token sequences (back to back, no padding) as the training executor takes it.
#pragma once
#include <cstdint>
#include <vector>

namespace mgrl::model {

// A packed batch: B sequences stored back to back, no padding. Sequence b is tokens[offsets[b] .. offsets[b+1]);
// every per-token array of the model (log-probs, loss weights) has the same packed layout, [T].
struct Batch {
  std::vector<std::int32_t> tokens;        // [T]
  std::vector<std::int32_t> offsets{0};    // [B + 1], offsets[0] = 0, offsets[B] = T
  // Optional, [B]: the log-probs wanted are those of sequence b's tokens at positions >= scored_from[b] (its
  // completion); the executor then runs the LM head on the rows that predict them alone, and the other positions'
  // log-probs come back 0 (a loss weight there is refused). Empty: every position (from 1) is scored.
  std::vector<std::int32_t> scored_from;
  // Optional, [B]: a key naming sequence b by its place in the training step (its slot in the global batch), not in
  // this batch. LoRA dropout draws token t of sequence b's mask from (the step's seed, seq_keys[b], t), so a sequence
  // gets the same mask whichever rank or micro-batch it lands in (1, 2 or 4 ranks and any grad_accum train alike).
  // Empty: b.
  std::vector<std::uint64_t> seq_keys;
  int B() const { return static_cast<int>(offsets.size()) - 1; }
  int T() const { return offsets.back(); }
  int length(int b) const { return offsets[b + 1] - offsets[b]; }
  int max_len() const;
  void add(const std::vector<std::int32_t>& seq);  // appends a sequence
  static Batch from_sequences(const std::vector<std::vector<std::int32_t>>& seqs);
  // From a right-padded [B, L] layout (fixture files): row b's first lengths[b] tokens.
  static Batch from_padded(const std::int32_t* tokens, const std::int32_t* lengths, int B, int L);
};

}  // namespace mgrl::model
