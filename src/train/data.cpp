// data.cpp: SFT examples and the epoch sampler.
#include "train/data.h"

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>

#include "core/error.h"
#include "core/random.h"
#include "io/jsonl.h"

namespace mgrl::train {

namespace {
// The loss over every token but the first (predicted from nothing): train.completion_only_loss = false.
void train_whole(Example& ex) {
  ex.loss_mask.assign(ex.tokens.size(), 1);
  if (!ex.loss_mask.empty()) ex.loss_mask[0] = 0;
}

std::size_t common_prefix(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}
}  // namespace

Example chat_example(const nlohmann::ordered_json& messages, const io::Tokenizer& tok, const DataOptions& opts,
                     std::string* text, const io::ChatExtras& extras) {
  io::ChatTemplate::check_messages(messages);
  if (messages.back()["role"] != "assistant")
    throw UserError("\"messages\" must end with an assistant message (the completion)");
  if (opts.chat == nullptr) throw UserError("internal: no chat template given for \"messages\"");
  const io::ChatTemplate& chat = *opts.chat;
  Example ex;
  const auto& final_message = messages.back();
  ex.completion = final_message.contains("content") && final_message["content"].is_string()
                      ? final_message["content"].get<std::string>()
                      : "";
  const auto too_long = [&](std::size_t prompt) {
    throw UserError("the prompt alone has " + std::to_string(prompt) + " tokens, not less than " +
                    opts.max_seq_len_name + " (" + std::to_string(opts.max_seq_len) + ")");
  };
  if (chat.builtin()) {
    const auto eos = opts.eos ? opts.eos : tok.eos_id();
    if (opts.add_eos && !eos)
      throw UserError(tok.path() + ": the tokenizer has no EOS token (tokenizer_config.json eos_token)");
    const nlohmann::ordered_json earlier(messages.begin(), messages.end() - 1);
    std::vector<std::int32_t> prompt = chat.encode(earlier, true, extras);
    std::vector<std::int32_t> completion = tok.encode(ex.completion, false);
    if (opts.add_eos) completion.push_back(*eos);
    if (prompt.empty()) throw UserError("the prompt has no tokens");
    if (completion.empty()) throw UserError("the completion has no tokens");
    if (static_cast<int>(prompt.size()) >= opts.max_seq_len) too_long(prompt.size());
    if (text) *text = chat.text(earlier, true, extras) + ex.completion + (opts.add_eos ? *tok.id_to_token(*eos) : "");
    ex.prompt_len = static_cast<std::int32_t>(prompt.size());
    ex.tokens = std::move(prompt);
    for (auto t : completion) {
      if (static_cast<int>(ex.tokens.size()) >= opts.max_seq_len) ++ex.cut;
      else ex.tokens.push_back(t);
    }
    if (!opts.completion_only) train_whole(ex);
    return ex;
  }
  io::RenderedChat r = chat.render(messages, false, extras);
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
  if (!opts.completion_only) train_whole(ex);
  return ex;
}

namespace {
// The tokens of a whole sequence cut to opts.max_seq_len (what is left out counted in ex.cut), the prompt checked
// to leave room; then the loss positions.
void finish_example(Example& ex, std::vector<std::int32_t> whole, std::size_t prompt_len, const DataOptions& opts) {
  if (static_cast<int>(prompt_len) >= opts.max_seq_len)
    throw UserError("the prompt alone has " + std::to_string(prompt_len) + " tokens, not less than " +
                    opts.max_seq_len_name + " (" + std::to_string(opts.max_seq_len) + ")");
  if (static_cast<int>(whole.size()) > opts.max_seq_len) {
    ex.cut = whole.size() - static_cast<std::size_t>(opts.max_seq_len);
    whole.resize(static_cast<std::size_t>(opts.max_seq_len));
  }
  ex.prompt_len = static_cast<std::int32_t>(prompt_len);
  ex.tokens = std::move(whole);
  if (!opts.completion_only) train_whole(ex);
}

std::string final_content(const nlohmann::ordered_json& messages) {
  const auto& m = messages.back();
  return m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : std::string();
}
}  // namespace

Example example_of(const nlohmann::ordered_json& j, const io::Tokenizer& tok, const DataOptions& opts,
                   std::string* text) {
  const io::ChatExtras extras = io::ChatExtras::of(j);
  if (j.contains("messages")) return chat_example(j["messages"], tok, opts, text, extras);
  Example ex;
  const auto eos = opts.eos ? opts.eos : tok.eos_id();
  if (j.contains("prompt") && j.contains("completion") && j["prompt"].is_array() && j["completion"].is_array()) {
    // trl's conversational prompt-completion: the prompt's messages with the generation prompt, then the whole
    // conversation; the completion starts where the two renderings' tokens diverge.
    if (opts.chat == nullptr) throw UserError("internal: no chat template given for chat messages");
    io::ChatTemplate::check_messages(j["prompt"]);
    io::ChatTemplate::check_messages(j["completion"]);
    nlohmann::ordered_json all = j["prompt"];
    for (const auto& m : j["completion"]) all.push_back(m);
    const std::vector<std::int32_t> prompt = opts.chat->encode(j["prompt"], true, extras);
    std::vector<std::int32_t> whole = opts.chat->encode(all, false, extras);
    const std::size_t plen = common_prefix(prompt, whole);
    if (plen == 0) throw UserError("the prompt has no tokens");
    if (whole.size() <= plen) throw UserError("the completion has no tokens");
    ex.completion = final_content(j["completion"]);
    if (text) *text = opts.chat->text(all, false, extras);
    finish_example(ex, std::move(whole), plen, opts);
    return ex;
  }
  if (!extras.tools.is_null() || !extras.kwargs.is_null())
    throw UserError("\"tools\" and \"chat_template_kwargs\" apply to chat messages only");
  if (opts.add_eos && !eos) throw UserError(tok.path() + ": the tokenizer has no EOS token (tokenizer_config.json eos_token)");
  std::vector<std::int32_t> whole;
  std::size_t prompt_len = 0;
  std::string all_text;
  if (j.contains("prompt") && j.contains("completion")) {
    if (!j["prompt"].is_string() || !j["completion"].is_string())
      throw UserError("\"prompt\" and \"completion\" must be strings (or both lists of chat messages)");
    // As trl's SFTTrainer: the prompt alone and prompt + completion are tokenized each whole (special tokens as the
    // tokenizer adds them), the EOS appended unless the completion ends with it, and the completion starts where
    // the two diverge. Until 2026-11-28 the completion was tokenized on its own (" hello" after "Say" as "Ġ", "he"
    // where the tokenizer gives "Ġhe") and an EOS appended even after one the completion ended with.
    ex.completion = j["completion"].get<std::string>();
    const std::string prompt_text = j["prompt"].get<std::string>();
    const std::vector<std::int32_t> prompt = tok.encode(prompt_text, true);
    all_text = prompt_text + ex.completion;
    whole = tok.encode(all_text, true);
    if (opts.add_eos && (whole.empty() || whole.back() != *eos)) whole.push_back(*eos);
    prompt_len = common_prefix(prompt, whole);
    ex.merged = prompt_len < prompt.size();
    if (prompt.empty()) throw UserError("the prompt has no tokens");
    if (whole.size() <= prompt_len) throw UserError("the completion has no tokens");
  } else if (opts.text_field.empty()) {
    throw UserError("key 'data.text_field' is empty: it names the key of a line's text");
  } else if (j.contains(opts.text_field)) {
    // trl's language-modeling form: the text trained whole (its EOS appended unless it ends with one).
    if (!j[opts.text_field].is_string()) throw UserError("\"" + opts.text_field + "\" must be a string");
    all_text = j[opts.text_field].get<std::string>();
    whole = tok.encode(all_text, true);
    if (opts.add_eos && (whole.empty() || whole.back() != *eos)) whole.push_back(*eos);
    if (whole.size() < 2) throw UserError("the text has fewer than 2 tokens: nothing to predict");
    prompt_len = 1;  // the first token is predicted from nothing
  } else {
    throw UserError("expected {\"prompt\", \"completion\"}, {\"" + opts.text_field + "\"} or {\"messages\": [...]}" +
                    (opts.text_field != "text" ? " (data.text_field)" : ""));
  }
  if (text) *text = tok.decode(whole, false);
  finish_example(ex, std::move(whole), prompt_len, opts);
  return ex;
}

std::vector<Example> load_examples(const std::string& path, const io::Tokenizer& tok, const DataOptions& opts) {
  std::vector<Example> out;
  if (opts.add_eos && !opts.eos && !tok.eos_id())
    throw UserError(tok.path() + ": the tokenizer has no EOS token (tokenizer_config.json eos_token)");
  io::read_jsonl(path, [&](const nlohmann::ordered_json& j, int line) {
    try {
      out.push_back(example_of(j, tok, opts));
    } catch (const UserError& e) {
      io::jsonl_error(path, line, e.what());
    }
    out.back().line = line;
  });
  if (out.empty()) throw UserError(path + ": no examples");
  return out;
}

std::vector<std::vector<std::size_t>> pack_bfd(const std::vector<std::size_t>& lengths, std::size_t capacity,
                                               std::size_t chunk) {
  std::vector<std::vector<std::size_t>> rows;
  for (std::size_t begin = 0; begin < lengths.size(); begin += chunk) {
    const std::size_t end = std::min(lengths.size(), begin + chunk);
    std::vector<std::size_t> by_length(end - begin);
    std::iota(by_length.begin(), by_length.end(), begin);
    std::stable_sort(by_length.begin(), by_length.end(),
                     [&](std::size_t a, std::size_t b) { return lengths[a] > lengths[b]; });
    // Free space -> the rows (indices into `rows`) with that much free, first reached first; a full row has 0.
    std::map<std::size_t, std::deque<std::size_t>> open;
    for (const std::size_t i : by_length) {
      const std::size_t len = lengths[i];
      MGRL_CHECK(len > 0 && len <= capacity, "pack_bfd: an example longer than a row");
      std::size_t row = rows.size(), space = capacity;
      const auto fit = open.lower_bound(len);
      if (fit != open.end() && fit->first > 0) {
        space = fit->first;
        row = fit->second.front();
        fit->second.pop_front();
        if (fit->second.empty()) open.erase(fit);
      } else {
        rows.emplace_back();
      }
      rows[row].push_back(i);
      if (space - len > 0) open[space - len].push_back(row);
    }
  }
  return rows;
}

std::vector<std::size_t> Sampler::order(std::int64_t epoch) const {
  std::vector<std::size_t> p(n_);
  std::iota(p.begin(), p.end(), 0);
  if (!shuffle_) return p;
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
