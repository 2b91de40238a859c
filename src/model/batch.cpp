// batch.cpp: building packed batches (from sequences, from a right-padded layout).
#include "model/batch.h"

#include <algorithm>
#include <cstddef>

namespace mgrl::model {

int Batch::max_len() const {
  int m = 0;
  for (int b = 0; b < B(); ++b) m = std::max(m, length(b));
  return m;
}

void Batch::add(const std::vector<std::int32_t>& seq) {
  tokens.insert(tokens.end(), seq.begin(), seq.end());
  offsets.push_back(static_cast<std::int32_t>(tokens.size()));
}

Batch Batch::from_sequences(const std::vector<std::vector<std::int32_t>>& seqs) {
  Batch b;
  std::size_t n = 0;
  for (const auto& s : seqs) n += s.size();
  b.tokens.reserve(n);
  b.offsets.reserve(seqs.size() + 1);
  for (const auto& s : seqs) b.add(s);
  return b;
}

Batch Batch::from_padded(const std::int32_t* tokens, const std::int32_t* lengths, int B, int L) {
  Batch b;
  for (int i = 0; i < B; ++i) {
    const std::int32_t* row = tokens + static_cast<std::ptrdiff_t>(i) * L;
    b.add(std::vector<std::int32_t>(row, row + std::clamp(lengths[i], 0, L)));
  }
  return b;
}

}  // namespace mgrl::model
