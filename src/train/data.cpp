// data.cpp: SFT examples and the epoch sampler.
#include "train/data.h"

#include <numeric>

#include "core/error.h"
#include "core/random.h"
#include "io/jsonl.h"

namespace mgrl::train {

std::vector<Example> load_examples(const std::string& path, const io::Tokenizer& tok, const DataOptions& opts) {
  std::vector<Example> out;
  const auto eos = tok.eos_id();
  if (opts.add_eos && !eos) throw UserError(tok.path() + ": the tokenizer has no EOS token (tokenizer_config.json eos_token)");
  io::read_jsonl(path, [&](const nlohmann::json& j, int line) {
    Example ex;
    std::vector<std::int32_t> prompt, completion;
    if (j.contains("messages")) {
      const auto& m = j["messages"];
      const auto must_end_with_assistant = [&] {
        io::jsonl_error(path, line, "\"messages\" must end with an assistant message (the completion)");
      };
      if (!m.is_array() || m.empty()) must_end_with_assistant();
      // Every message is checked before any role is read: a role that is not a string is this line's error,
      // not a JSON library exception.
      std::vector<io::Message> msgs;
      for (const auto& x : m) {
        if (!x.is_object() || !x.contains("role") || !x.contains("content") || !x["role"].is_string() ||
            !x["content"].is_string())
          io::jsonl_error(path, line, "each message needs string \"role\" and \"content\"");
        msgs.push_back({x["role"].get<std::string>(), x["content"].get<std::string>()});
      }
      if (msgs.back().role != "assistant") must_end_with_assistant();
      ex.completion = msgs.back().content;
      msgs.pop_back();
      prompt = tok.encode_chat(msgs, opts.chat, true);
      completion = tok.encode(ex.completion, false);
    } else if (j.contains("prompt") && j.contains("completion")) {
      if (!j["prompt"].is_string() || !j["completion"].is_string())
        io::jsonl_error(path, line, "\"prompt\" and \"completion\" must be strings");
      ex.completion = j["completion"].get<std::string>();
      prompt = tok.encode(j["prompt"].get<std::string>(), true);
      completion = tok.encode(ex.completion, false);
    } else {
      io::jsonl_error(path, line, "expected {\"prompt\", \"completion\"} or {\"messages\": [...]}");
    }
    if (opts.add_eos) completion.push_back(*eos);
    if (prompt.empty()) io::jsonl_error(path, line, "the prompt has no tokens");
    if (completion.empty()) io::jsonl_error(path, line, "the completion has no tokens");
    if (static_cast<int>(prompt.size()) >= opts.max_seq_len)
      io::jsonl_error(path, line, "the prompt alone has " + std::to_string(prompt.size()) +
                                      " tokens, not less than train.max_seq_len (" + std::to_string(opts.max_seq_len) + ")");
    ex.prompt_len = static_cast<std::int32_t>(prompt.size());
    ex.tokens = std::move(prompt);
    for (auto t : completion) {
      if (static_cast<int>(ex.tokens.size()) >= opts.max_seq_len) break;
      ex.tokens.push_back(t);
    }
    out.push_back(std::move(ex));
  });
  if (out.empty()) throw UserError(path + ": no examples");
  return out;
}

std::vector<std::size_t> Sampler::order(std::int64_t epoch) const {
  std::vector<std::size_t> p(n_);
  std::iota(p.begin(), p.end(), 0);
  const std::uint64_t stream = random_bits(seed_, static_cast<std::uint64_t>(epoch));
  for (std::size_t i = n_; i > 1; --i) {  // Fisher-Yates
    const std::size_t j = static_cast<std::size_t>(random_bits(stream, i) % i);
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

std::vector<std::size_t> Sampler::next(DataCursor& cursor, int global_batch) const {
  std::vector<std::size_t> out;
  std::vector<std::size_t> ord = order(cursor.epoch);
  while (static_cast<int>(out.size()) < global_batch) {
    if (cursor.position >= static_cast<std::int64_t>(n_)) {
      ++cursor.epoch;
      cursor.position = 0;
      ord = order(cursor.epoch);
    }
    out.push_back(ord[static_cast<std::size_t>(cursor.position++)]);
  }
  return out;
}

}  // namespace mgrl::train
