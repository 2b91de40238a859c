// data.h: supervised fine-tuning data: JSONL examples ({"prompt", "completion"} or chat {"messages"})
// tokenized once, with the loss on completion tokens (chat: the assistant turns, io/chat_template.h) only; an epoch-wise shuffled order from the run seed;
// the global batch of each step split over ranks and micro-batches. A micro-batch is packed (model::Batch): every
// sequence attends only to itself, exactly as at inference, and nothing is spent on padding.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/chat_template.h"
#include "io/tokenizer.h"
#include "train/checkpoint.h"

namespace mgrl::train {

struct Example {
  std::vector<std::int32_t> tokens;
  std::int32_t prompt_len = 0;  // the loss covers tokens[prompt_len..]: each predicted from what precedes it
  // When not empty (chat through the model's template): the loss covers the tokens t with loss_mask[t] = 1 (every
  // trained assistant turn) instead, and prompt_len is where the final assistant turn starts.
  std::vector<std::uint8_t> loss_mask;
  std::string completion;       // the expected completion text (for exact-match accuracy)
  std::size_t cut = 0;          // tokens past train.max_seq_len, left out (the end of the completion, its EOS first)
  // {"prompt", "completion"} strings whose tokens merge across the boundary: tokenized together (as trl does), the
  // completion starts where the prompt's own tokens and the whole's diverge, so the prompt's last tokens differ
  // from the prompt's alone (what the model sees at inference).
  bool merged = false;
  int line = 0;  // of its JSONL file (1-based; 0 when not from a file)
  std::vector<std::int32_t> prompt_tokens() const { return {tokens.begin(), tokens.begin() + prompt_len}; }
};

struct DataOptions {
  int max_seq_len = 2048;  // longer examples are cut (completion tokens dropped from the end)
  // What max_seq_len is, for errors: "train.max_seq_len" or "the model's max_position_embeddings" (the fewer).
  std::string max_seq_len_name = "train.max_seq_len";
  const io::ChatTemplate* chat = nullptr;  // how {"messages"} examples become tokens (required for them)
  bool add_eos = true;  // append the tokenizer's EOS to every completion (not to a template's conversation: it ends its turns)
  // train.eos_token (trl's SFTConfig.eos_token): the id appended in its place; unset: the tokenizer's EOS.
  std::optional<std::int32_t> eos;
  // data.text_field (trl's dataset_text_field): the key of a language-modeling line's text.
  std::string text_field = "text";
  // train.completion_only_loss: the loss covers the completion (the assistant turns of a conversation) only; false:
  // every token but the first, the prompt too (trl's default for {"messages"} without assistant_only_loss, and its
  // completion_only_loss = False). {"text"} examples are trained whole either way.
  bool completion_only = true;
};

// One {"messages": [...]} example as SFT trains on it (what `mgrl render` shows): the messages end with an
// assistant message. With the model's template: the rendered conversation, the loss on every assistant turn the
// template's marks or prefixes show (io::ChatTemplate::render); with a built-in format: the earlier messages with
// the generation prompt, then the final message's content and EOS, the loss on those. The text is returned in
// *text when given. UserError (the caller adds file and line) for a conversation that cannot be trained.
Example chat_example(const nlohmann::ordered_json& messages, const io::Tokenizer& tok, const DataOptions& opts,
                     std::string* text = nullptr, const io::ChatExtras& extras = {});

// One data line as SFT trains on it ({"prompt", "completion"} strings or message lists, {"text"}, {"messages"}: see
// docs/sft.md "Data"); its text in *text when given. UserError (the caller adds file and line) for a broken line.
Example example_of(const nlohmann::ordered_json& line, const io::Tokenizer& tok, const DataOptions& opts,
                   std::string* text = nullptr);

// Reads and tokenizes a JSONL file. UserError "file:line: ..." for a broken line.
std::vector<Example> load_examples(const std::string& path, const io::Tokenizer& tok, const DataOptions& opts);

// train.packing: rows of up to `capacity` tokens, each a list of example indices (lengths[i]: example i's tokens,
// 0 < lengths[i] <= capacity), packed by best fit decreasing as trl's pack_dataset(strategy = "bfd") packs them
// under datasets' batched map: within each run of `chunk` consecutive examples, the examples by length, longest
// first (ties in data order), each into the open row whose free space is the smallest that fits it (the row that
// reached that space first among equals), else into a new row. Rows in the order opened, each listing its examples
// in the order put in.
std::vector<std::vector<std::size_t>> pack_bfd(const std::vector<std::size_t>& lengths, std::size_t capacity,
                                               std::size_t chunk = 1000);

// Which examples form a step's batch, identical on every rank.
class Sampler {
 public:
  // shuffle false (data.shuffle): every epoch in the data's order.
  Sampler(std::size_t n_examples, std::uint64_t seed, bool shuffle = true)
      : n_(n_examples), seed_(seed), shuffle_(shuffle) {}
  // The next `global_batch` example indices from the cursor (epochs wrap, each with its own shuffle),
  // advancing the cursor.
  std::vector<std::size_t> next(DataCursor& cursor, int global_batch) const;
  // The permutation of one epoch.
  std::vector<std::size_t> order(std::int64_t epoch) const;

 private:
  std::size_t n_;
  std::uint64_t seed_;
  bool shuffle_ = true;
};

}  // namespace mgrl::train
