// data.cpp: SFT examples and the epoch sampler.
#include "train/data.h"

#include <numeric>

#include "core/error.h"
#include "core/random.h"
#include "io/jsonl.h"

namespace mgrl::train {

Example chat_example(const nlohmann::ordered_json& messages, const io::Tokenizer& tok, const DataOptions& opts,
                     std::string* text) {
  io::ChatTemplate::check_messages(messages);
  if (messages.back()["role"] != "assistant")
    throw UserError("\"messages\" must end with an assistant message (the completion)");
  if (opts.chat == nullptr) throw UserError("internal: no chat template given for \"messages\"");
  const io::ChatTemplate& chat = *opts.chat;
  Example ex;
  ex.completion = messages.back()["content"].get<std::string>();
  const auto too_long = [&](std::size_t prompt) {
    throw UserError("the prompt alone has " + std::to_string(prompt) + " tokens, not less than " +
                    opts.max_seq_len_name + " (" + std::to_string(opts.max_seq_len) + ")");
  };
  if (chat.builtin()) {
    if (opts.add_eos && !tok.eos_id())
      throw UserError(tok.path() + ": the tokenizer has no EOS token (tokenizer_config.json eos_token)");
    const nlohmann::ordered_json earlier(messages.begin(), messages.end() - 1);
    std::vector<std::int32_t> prompt = chat.encode(earlier, true);
    std::vector<std::int32_t> completion = tok.encode(ex.completion, false);
    if (opts.add_eos) completion.push_back(*tok.eos_id());
    if (prompt.empty()) throw UserError("the prompt has no tokens");
    if (completion.empty()) throw UserError("the completion has no tokens");
    if (static_cast<int>(prompt.size()) >= opts.max_seq_len) too_long(prompt.size());
    if (text) *text = chat.text(earlier, true) + ex.completion + (opts.add_eos ? *tok.id_to_token(*tok.eos_id()) : "");
    ex.prompt_len = static_cast<std::int32_t>(prompt.size());
    ex.tokens = std::move(prompt);
    for (auto t : completion) {
      if (static_cast<int>(ex.tokens.size()) >= opts.max_seq_len) ++ex.cut;
      else ex.tokens.push_back(t);
    }
    return ex;
  }
  io::RenderedChat r = chat.render(messages, false);
  if (!r.mask.empty()) r.mask[0] = 0;  // the first token is predicted from nothing
  // the final assistant turn starts at the last run of trained tokens
  std::size_t last = r.mask.size();
  while (last > 0 && !r.mask[last - 1]) --last;
  if (last == 0)
    throw UserError("no assistant turn is trained: " + chat.describe() +
                    " renders none of them as an extension of the conversation before it (mark the assistant text "
                    "with {% generation %} ... {% endgeneration %})");
  std::size_t start = last;
  while (start > 0 && r.mask[start - 1]) --start;
  if (static_cast<int>(start) >= opts.max_seq_len) too_long(start);
  if (static_cast<int>(r.tokens.size()) > opts.max_seq_len) {
    ex.cut = r.tokens.size() - static_cast<std::size_t>(opts.max_seq_len);
    r.tokens.resize(static_cast<std::size_t>(opts.max_seq_len));
    r.mask.resize(static_cast<std::size_t>(opts.max_seq_len));
  }
  if (text) *text = std::move(r.text);
  ex.prompt_len = static_cast<std::int32_t>(start);
  ex.tokens = std::move(r.tokens);
  ex.loss_mask = std::move(r.mask);
  return ex;
}

std::vector<Example> load_examples(const std::string& path, const io::Tokenizer& tok, const DataOptions& opts) {
  std::vector<Example> out;
  const auto eos = tok.eos_id();
  if (opts.add_eos && !eos) throw UserError(tok.path() + ": the tokenizer has no EOS token (tokenizer_config.json eos_token)");
  io::read_jsonl(path, [&](const nlohmann::ordered_json& j, int line) {
    Example ex;
    std::vector<std::int32_t> prompt, completion;
    if (j.contains("messages")) {
      try {
        out.push_back(chat_example(j["messages"], tok, opts));
      } catch (const UserError& e) {
        io::jsonl_error(path, line, e.what());
      }
      return;
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
                                      " tokens, not less than " + opts.max_seq_len_name + " (" +
                                      std::to_string(opts.max_seq_len) + ")");
    ex.prompt_len = static_cast<std::int32_t>(prompt.size());
    ex.tokens = std::move(prompt);
    for (auto t : completion) {
      if (static_cast<int>(ex.tokens.size()) >= opts.max_seq_len) ++ex.cut;
      else ex.tokens.push_back(t);
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
