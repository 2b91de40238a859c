// reference_batch.h: the batch of a model fixture's reference.safetensors (tools/make_fixtures.py,
// tools/make_nf4_fixtures.py): input_ids [B, L] right-padded with lengths [B], packed, and the weights of the mean
// loss the generators computed (1 / N at each of the N targets: every position after a sequence's first).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/batch.h"

namespace mgrl::test {

inline std::vector<std::int32_t> read_i32(const io::TensorInfo& t) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(t.numel()));
  EXPECT_EQ(t.dtype, DType::I32) << t.name;
  std::memcpy(v.data(), t.data, v.size() * sizeof(std::int32_t));
  return v;
}

// A fixture's reference.safetensors, as a base class listed before ReferenceBatch, so that it is open (bases are
// built in order) when the batch is read from it.
struct ReferenceFile {
  io::SafetensorsFile ref;
  explicit ReferenceFile(const std::string& path) : ref(path) {}
  std::vector<float> reference(const std::string& name) const { return io::to_f32(ref.get(name)); }
};

struct ReferenceBatch {
  int B = 0, L = 0, n_targets = 0;  // the padded layout, and the number of targets
  std::vector<std::int32_t> lengths;
  model::Batch batch;          // packed
  std::vector<float> weights;  // packed as batch: 1 / n_targets at every target, 0 at each first position

  explicit ReferenceBatch(const io::SafetensorsFile& ref) {
    B = static_cast<int>(ref.get("input_ids").shape[0]);
    L = static_cast<int>(ref.get("input_ids").shape[1]);
    lengths = read_i32(ref.get("lengths"));
    batch = model::Batch::from_padded(read_i32(ref.get("input_ids")).data(), lengths.data(), B, L);
    weights.assign(batch.tokens.size(), 0.0f);
    for (int b = 0; b < B; ++b) n_targets += lengths[b] - 1;
    for (int b = 0; b < B; ++b)
      for (int t = 1; t < lengths[b]; ++t) weights[static_cast<std::size_t>(batch.offsets[b] + t)] = 1.0f / n_targets;
  }
  // The rows of a right-padded [B, L, width] reference tensor at valid positions, i.e. in the packed layout.
  std::vector<float> valid_rows(const std::vector<float>& v, std::size_t width) const {
    std::vector<float> out;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < lengths[b]; ++t)
        for (std::size_t j = 0; j < width; ++j) out.push_back(v[(static_cast<std::size_t>(b) * L + t) * width + j]);
    return out;
  }
  // The mean loss the generators computed, from packed log-probs.
  double loss(const std::vector<float>& lp) const {
    double s = 0;
    for (std::size_t i = 0; i < lp.size(); ++i) s -= static_cast<double>(weights[i]) * lp[i];
    return s;
  }
};

}  // namespace mgrl::test
