// data.h: supervised fine-tuning data: JSONL examples ({"prompt", "completion"} or chat {"messages"})
// tokenized once, with the loss on completion tokens only; an epoch-wise shuffled order from the run seed;
// the global batch of each step split over ranks and micro-batches. A micro-batch is packed (model::Batch): every
// sequence attends only to itself, exactly as at inference, and nothing is spent on padding.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "train/checkpoint.h"

namespace mgrl::train {

struct Example {
  std::vector<std::int32_t> tokens;
  std::int32_t prompt_len = 0;  // the loss covers tokens[prompt_len..]: each predicted from what precedes it
  std::string completion;       // the expected completion text (for exact-match accuracy)
  std::vector<std::int32_t> prompt_tokens() const { return {tokens.begin(), tokens.begin() + prompt_len}; }
};

struct DataOptions {
  int max_seq_len = 2048;  // longer examples are cut (completion tokens dropped from the end)
  io::ChatFormat chat = io::ChatFormat::None;
  bool add_eos = true;  // append the tokenizer's EOS to every completion
};

// Reads and tokenizes a JSONL file. UserError "file:line: ..." for a broken line.
std::vector<Example> load_examples(const std::string& path, const io::Tokenizer& tok, const DataOptions& opts);

// Which examples form a step's batch, identical on every rank.
class Sampler {
 public:
  Sampler(std::size_t n_examples, std::uint64_t seed) : n_(n_examples), seed_(seed) {}
  // The next `global_batch` example indices from the cursor (epochs wrap, each with its own shuffle),
  // advancing the cursor.
  std::vector<std::size_t> next(DataCursor& cursor, int global_batch) const;
  // The permutation of one epoch.
  std::vector<std::size_t> order(std::int64_t epoch) const;

 private:
  std::size_t n_;
  std::uint64_t seed_;
};

}  // namespace mgrl::train
