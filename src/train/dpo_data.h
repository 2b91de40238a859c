// dpo_data.h: preference pairs for DPO: JSONL lines {"prompt", "chosen", "rejected"} as strings, or with the prompt
// as a list of chat messages and chosen / rejected as assistant message lists (or strings), rendered through the
// model's chat template with the line's "tools" and "chat_template_kwargs" (every field of a message reaches it:
// tool_calls, reasoning_content); or {"chosen", "rejected"} alone, whose shared start is the prompt (trl's
// extract_prompt). Tokenized as trl's DPOTrainer does (the completion starts where the tokenized prompt and prompt +
// completion diverge), cut to max_length keeping the start, pairs whose prompt fills max_length left out.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/chat_template.h"
#include "io/tokenizer.h"

namespace mgrl::train {

struct PreferencePair {
  // Whole sequences, prompt + completion, at most max_length tokens; the completion is tokens[prompt_len..].
  std::vector<std::int32_t> chosen, rejected;
  std::int32_t prompt_len = 0;
  std::string chosen_text;  // the chosen completion as text (greedy exact-match accuracy)
  // The reference policy's sequence log-probs, when computed before training (dpo.precompute_ref_log_probs).
  double ref_chosen = 0, ref_rejected = 0;
  // A KTO example (load_kto): 1 desirable, 0 undesirable; chosen is its prompt + completion, rejected its KL sequence
  // (the prompt + another example's completion, set by train/dpo.h kto_example where it is batched); completion its
  // whole completion's tokens (before max_length). -1: a DPO pair.
  int label = -1;
  std::vector<std::int32_t> completion;
  int chosen_tokens() const { return static_cast<int>(chosen.size()) - prompt_len; }
  int rejected_tokens() const { return static_cast<int>(rejected.size()) - prompt_len; }
};

struct PairOptions {
  int max_length = 1024;  // trl's max_length (keep_start truncation)
  const io::ChatTemplate* chat = nullptr;  // how chat-message pairs become tokens (required for them)
};

struct PairData {
  std::vector<PreferencePair> pairs;
  bool kto = false;  // KTO examples (load_kto): the notes count examples
  int dropped = 0;           // pairs whose prompt alone has max_length tokens or more (trl drops them too)
  int first_dropped_line = 0;
  // Pairs whose chosen and rejected token sequences are the same as read (`same`), or once cut to max_length (`cut_same`:
  // they differ after it): every DPO loss gives such a pair a gradient of 0 (the two sides cancel).
  int same = 0, first_same_line = 0;
  int cut_same = 0, first_cut_same_line = 0;
  // The warnings about this file (one line each): pairs left out, pairs that teach nothing.
  // cancels: the loss is a function of the log-ratios' difference (a pair of equal sides has gradient 0); false for
  // the losses of each side on its own (nca_pair, bco_pair, sppo_hard, apo_*), which pull such a pair both ways.
  std::vector<std::string> notes(const std::string& path, int max_length, bool cancels = true) const;
};

// Reads and tokenizes a JSONL file of preference pairs. UserError "file:line: ..." for a broken line, and naming
// the file when no pair is left.
PairData load_pairs(const std::string& path, const io::Tokenizer& tok, const PairOptions& opts);

// KTO examples (trl's KTOTrainer): JSONL lines {"prompt", "completion", "label": true | false} (strings, or messages
// as DPO's), or preference pairs {"prompt", "chosen", "rejected"} (the prompt implicit as in load_pairs) unpaired as
// trl's unpair_preference_dataset does (in blocks of 1000 lines: the block's chosen completions, label true, then its
// rejected ones, label false); each tokenized as trl does (the completion from where the tokenized prompt and prompt
// + completion diverge; EOS appended to a string completion), those whose prompt fills max_length left out (as trl,
// before its KL pairing); chosen cut to max_length keeping the start. `rejected` stays empty: the KL sequences are
// paired where the examples are batched (train/dpo.h kto_example). `dropped` counts the examples left out.
PairData load_kto(const std::string& path, const io::Tokenizer& tok, const PairOptions& opts);

// The token ids of a conversation through the chat template (io/chat_template.h, the path SFT, GRPO and
// `mgrl render` use): the one place DPO renders messages.
std::vector<std::int32_t> render_conversation(const io::ChatTemplate& chat, const nlohmann::ordered_json& messages,
                                              bool add_generation_prompt, const io::ChatExtras& extras = {});

}  // namespace mgrl::train
