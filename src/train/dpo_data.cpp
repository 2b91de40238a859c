// dpo_data.cpp: preference pairs from JSONL, tokenized as trl's DPOTrainer tokenizes them.
#include "train/dpo_data.h"

#include <algorithm>

#include "core/error.h"
#include "io/jsonl.h"

namespace mgrl::train {

std::vector<std::int32_t> render_conversation(const io::ChatTemplate& chat, const nlohmann::ordered_json& messages,
                                              bool add_generation_prompt, const io::ChatExtras& extras) {
  return chat.encode(messages, add_generation_prompt, extras);
}

namespace {

std::size_t common_prefix(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// A list of messages as the line has them (every field kept: tool_calls, reasoning_content reach the template; until
// 2026-11-28 only role and content did, so a tool-call answer trained as an empty one), or the line's error naming
// `key`.
nlohmann::ordered_json messages_of(const nlohmann::ordered_json& v, const std::string& key, const std::string& path,
                                   int line) {
  if (!v.is_array() || v.empty()) io::jsonl_error(path, line, "\"" + key + "\" must be a non-empty list of messages");
  try {
    io::ChatTemplate::check_messages(v);
  } catch (const UserError&) {
    io::jsonl_error(path, line, "each message of \"" + key + "\" needs string \"role\" and \"content\" (an assistant "
                                "message with \"tool_calls\" may have none)");
  }
  return v;
}

// The text a message list ends with (the last message's content; "" for a tool call without one).
std::string last_content(const nlohmann::ordered_json& messages) {
  const auto& m = messages.back();
  return m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : std::string();
}

// The prompt of a pair line: its "prompt"; or without one (or a string one beside conversations) the shared start of
// chosen and rejected, as trl's extract_prompt finds it (messages, or characters with a space before the split going
// to the completions), cut from both.
void split_pair(const nlohmann::ordered_json& j, const std::string& path, int line, nlohmann::ordered_json* prompt,
                nlohmann::ordered_json* chosen_io, nlohmann::ordered_json* rejected_io) {
  nlohmann::ordered_json& p = *prompt;
  nlohmann::ordered_json& chosen = *chosen_io;
  nlohmann::ordered_json& rejected = *rejected_io;
  const bool conv = chosen.is_array() && rejected.is_array();
  if (j.contains("prompt") && (j["prompt"].is_array() == conv || !conv)) {
    p = j["prompt"];
  } else {
    if (!conv && !(chosen.is_string() && rejected.is_string()))
      io::jsonl_error(path, line, "expected {\"prompt\", \"chosen\", \"rejected\"}: no \"prompt\"");
    const std::size_t n = std::min(chosen.size(), rejected.size());
    const std::string cs = conv ? "" : chosen.get<std::string>(), rs = conv ? "" : rejected.get<std::string>();
    const std::size_t len = conv ? n : std::min(cs.size(), rs.size());
    std::size_t idx = 0;
    for (idx = 0; idx < len; ++idx)
      if (conv ? chosen[idx] != rejected[idx] : cs[idx] != rs[idx]) break;
    if (idx == len && len > 0) idx = len - 1;  // Python's loop variable after a loop without a break
    if (!conv && idx > 0 && idx < len && cs[idx - 1] == ' ') --idx;
    if (conv) {
      p = nlohmann::ordered_json(chosen.begin(), chosen.begin() + static_cast<std::ptrdiff_t>(idx));
      chosen = nlohmann::ordered_json(chosen.begin() + static_cast<std::ptrdiff_t>(idx), chosen.end());
      rejected = nlohmann::ordered_json(rejected.begin() + static_cast<std::ptrdiff_t>(idx), rejected.end());
    } else {
      p = cs.substr(0, idx);
      chosen = cs.substr(idx);
      rejected = rs.substr(idx);
    }
    if (p.empty()) io::jsonl_error(path, line, "chosen and rejected share no start to take as the prompt (no \"prompt\")");
  }
}

}  // namespace

PairData load_pairs(const std::string& path, const io::Tokenizer& tok, const PairOptions& opts) {
  PairData out;
  const auto eos = tok.eos_id();
  io::read_jsonl(path, [&](const nlohmann::ordered_json& j, int line) {
    for (const char* k : {"chosen", "rejected"})
      if (!j.contains(k)) io::jsonl_error(path, line, std::string("expected {\"prompt\", \"chosen\", \"rejected\"}: no \"") + k + "\"");
    nlohmann::ordered_json p, chosen = j["chosen"], rejected = j["rejected"];
    split_pair(j, path, line, &p, &chosen, &rejected);
    PreferencePair pr;
    std::vector<std::int32_t> prompt, with_chosen, with_rejected;
    if (p.is_string()) {
      // trl: the prompt, and prompt + completion + EOS, each tokenized whole.
      if (!chosen.is_string() || !rejected.is_string())
        io::jsonl_error(path, line, "with a string \"prompt\", \"chosen\" and \"rejected\" must be strings");
      if (!eos) throw UserError(tok.path() + ": the tokenizer has no EOS token (tokenizer_config.json eos_token)");
      const std::string ps = p.get<std::string>();
      pr.chosen_text = chosen.get<std::string>();
      prompt = tok.encode(ps, true);
      with_chosen = tok.encode(ps + pr.chosen_text, true);
      with_rejected = tok.encode(ps + rejected.get<std::string>(), true);
      for (auto* s : {&with_chosen, &with_rejected})
        if (s->empty() || s->back() != *eos) s->push_back(*eos);
    } else if (p.is_array()) {
      // trl's conversational form: the prompt with the generation prompt, and prompt + completion messages, each
      // rendered through the chat template with the line's tools and keyword arguments (no EOS added: the template
      // ends the turn).
      const auto msgs = messages_of(p, "prompt", path, line);
      auto completion = [&](const char* key, const nlohmann::ordered_json& v) {
        if (v.is_string()) return nlohmann::ordered_json::array({{{"role", "assistant"}, {"content", v.get<std::string>()}}});
        return messages_of(v, key, path, line);
      };
      const auto c = completion("chosen", chosen), r = completion("rejected", rejected);
      pr.chosen_text = last_content(c);
      if (!opts.chat) io::jsonl_error(path, line, "chat messages need a chat template (none was given)");
      io::ChatExtras extras;
      try {
        extras = io::ChatExtras::of(j);
        auto joined = msgs;
        for (const auto& m : c) joined.push_back(m);
        with_chosen = render_conversation(*opts.chat, joined, false, extras);
        joined = msgs;
        for (const auto& m : r) joined.push_back(m);
        with_rejected = render_conversation(*opts.chat, joined, false, extras);
        prompt = render_conversation(*opts.chat, msgs, true, extras);
      } catch (const UserError& e) {
        io::jsonl_error(path, line, e.what());
      }
    } else {
      io::jsonl_error(path, line, "\"prompt\" must be a string or a list of chat messages");
    }
    // The completion starts where the tokenized prompt and prompt + completion diverge (as trl).
    const std::size_t plen = std::min(common_prefix(prompt, with_chosen), common_prefix(prompt, with_rejected));
    if (plen == 0) io::jsonl_error(path, line, "the prompt has no tokens");
    if (with_chosen.size() <= plen) io::jsonl_error(path, line, "the chosen completion has no tokens");
    if (with_rejected.size() <= plen) io::jsonl_error(path, line, "the rejected completion has no tokens");
    if (static_cast<int>(plen) >= opts.max_length) {  // trl drops these: nothing of the completions would be left
      if (out.dropped++ == 0) out.first_dropped_line = line;
      return;
    }
    pr.prompt_len = static_cast<std::int32_t>(plen);
    if (with_chosen == with_rejected && out.same++ == 0) out.first_same_line = line;
    const bool differed = with_chosen != with_rejected;
    with_chosen.resize(std::min<std::size_t>(with_chosen.size(), static_cast<std::size_t>(opts.max_length)));
    with_rejected.resize(std::min<std::size_t>(with_rejected.size(), static_cast<std::size_t>(opts.max_length)));
    if (differed && with_chosen == with_rejected && out.cut_same++ == 0) out.first_cut_same_line = line;
    pr.chosen = std::move(with_chosen);
    pr.rejected = std::move(with_rejected);
    out.pairs.push_back(std::move(pr));
  });
  if (out.pairs.empty())
    throw UserError(path + (out.dropped > 0 ? ": no pairs left: every prompt has dpo.max_length (" +
                                                  std::to_string(opts.max_length) + ") tokens or more"
                                            : std::string(": no pairs")));
  return out;
}

std::vector<std::string> PairData::notes(const std::string& path, int max_length, bool cancels) const {
  std::vector<std::string> out;
  const std::string unit = kto ? " example" : " pair", key = kto ? "kto.max_length" : "dpo.max_length";
  auto add = [&](int n, int first, const std::string& what) {
    if (n == 0) return;
    out.push_back(path + ": " + std::to_string(n) + unit + (n == 1 ? " " : "s ") + what + " (the first at line " +
           std::to_string(first) + ")");
  };
  add(dropped, first_dropped_line,
      std::string(dropped == 1 ? "is" : "are") + " left out: the prompt alone has " + key + " (" +
          std::to_string(max_length) + ") tokens or more");
  if (kto) return out;
  add(same, first_same_line, std::string(same == 1 ? "has" : "have") + " the same chosen and rejected tokens: " +
                                 (cancels ? "the loss's gradient is 0 for them, they teach nothing"
                                          : "the loss pulls the same completion up as chosen and down as rejected"));
  add(cut_same, first_cut_same_line,
      std::string(cut_same == 1 ? "differs" : "differ") + " only after dpo.max_length (" + std::to_string(max_length) +
          ") tokens: cut there, chosen and rejected are the same and " +
          (cancels ? "teach nothing" : "pulled both ways") + "; raise dpo.max_length");
  return out;
}

PairData load_kto(const std::string& path, const io::Tokenizer& tok, const PairOptions& opts) {
  struct Row {
    nlohmann::ordered_json prompt, completion;
    io::ChatExtras extras;
    bool label = false;
    int line = 0;
  };
  std::vector<Row> rows;
  int paired = -1;  // the file's form, from its first line: 1 preference pairs, 0 labelled completions
  std::vector<Row> chosen_rows, rejected_rows;  // the current block of pairs (trl's unpairing map, 1000 a batch)
  const auto flush_pairs = [&] {
    for (auto* part : {&chosen_rows, &rejected_rows})
      for (auto& r : *part) rows.push_back(std::move(r));
    chosen_rows.clear();
    rejected_rows.clear();
  };
  io::read_jsonl(path, [&](const nlohmann::ordered_json& j, int line) {
    const bool pair = j.contains("chosen") || j.contains("rejected");
    if (paired < 0) paired = pair ? 1 : 0;
    if (pair != (paired == 1))
      io::jsonl_error(path, line, paired == 1 ? "expected {\"prompt\", \"chosen\", \"rejected\"} as the first line"
                                              : "expected {\"prompt\", \"completion\", \"label\"} as the first line");
    if (!pair && !j.contains("prompt"))
      io::jsonl_error(path, line, "expected {\"prompt\", \"completion\", \"label\"}: no \"prompt\"");
    Row r;
    r.line = line;
    try {
      r.extras = io::ChatExtras::of(j);
    } catch (const UserError& e) {
      io::jsonl_error(path, line, e.what());
    }
    if (pair) {
      for (const char* k : {"chosen", "rejected"})
        if (!j.contains(k)) io::jsonl_error(path, line, std::string("expected {\"prompt\", \"chosen\", \"rejected\"}: no \"") + k + "\"");
      // trl's KTOTrainer extracts an implicit prompt before it unpairs, as DPO's
      nlohmann::ordered_json chosen = j["chosen"], rejected = j["rejected"];
      split_pair(j, path, line, &r.prompt, &chosen, &rejected);
      Row c = r;
      c.completion = chosen;
      c.label = true;
      r.completion = rejected;
      r.label = false;
      chosen_rows.push_back(std::move(c));
      rejected_rows.push_back(std::move(r));
      if (chosen_rows.size() == 1000) flush_pairs();
      return;
    }
    if (!j.contains("completion") || !j.contains("label"))
      io::jsonl_error(path, line, std::string("expected {\"prompt\", \"completion\", \"label\"}: no \"") +
                                      (j.contains("completion") ? "label" : "completion") + "\"");
    if (!j["label"].is_boolean()) io::jsonl_error(path, line, "\"label\" must be true (desirable) or false (undesirable)");
    r.prompt = j["prompt"];
    r.completion = j["completion"];
    r.label = j["label"].get<bool>();
    rows.push_back(std::move(r));
  });
  flush_pairs();
  // Each row tokenized as trl's KTOTrainer does: the prompt, and prompt + completion, each whole.
  struct Tokenized {
    std::vector<std::int32_t> ids;
    std::size_t prompt_len = 0;
    bool label = false;
    int line = 0;
    std::string text;
  };
  std::vector<Tokenized> kept;
  PairData out;
  out.kto = true;
  const auto eos = tok.eos_id();
  for (const Row& r : rows) {
    Tokenized t;
    t.label = r.label;
    t.line = r.line;
    std::vector<std::int32_t> prompt;
    if (r.prompt.is_string()) {
      if (!r.completion.is_string())
        io::jsonl_error(path, r.line, "with a string \"prompt\" the completion must be a string");
      if (!eos) throw UserError(tok.path() + ": the tokenizer has no EOS token (tokenizer_config.json eos_token)");
      const std::string ps = r.prompt.get<std::string>();
      t.text = r.completion.get<std::string>();
      prompt = tok.encode(ps, true);
      t.ids = tok.encode(ps + t.text, true);
      if (t.ids.empty() || t.ids.back() != *eos) t.ids.push_back(*eos);
    } else if (r.prompt.is_array()) {
      const auto msgs = messages_of(r.prompt, "prompt", path, r.line);
      const auto c = r.completion.is_string()
                         ? nlohmann::ordered_json::array({{{"role", "assistant"}, {"content", r.completion.get<std::string>()}}})
                         : messages_of(r.completion, "completion", path, r.line);
      t.text = last_content(c);
      if (!opts.chat) io::jsonl_error(path, r.line, "chat messages need a chat template (none was given)");
      try {
        auto joined = msgs;
        for (const auto& m : c) joined.push_back(m);
        t.ids = render_conversation(*opts.chat, joined, false, r.extras);
        prompt = render_conversation(*opts.chat, msgs, true, r.extras);
      } catch (const UserError& e) {
        io::jsonl_error(path, r.line, e.what());
      }
    } else {
      io::jsonl_error(path, r.line, "\"prompt\" must be a string or a list of chat messages");
    }
    t.prompt_len = common_prefix(prompt, t.ids);
    if (t.prompt_len == 0) io::jsonl_error(path, r.line, "the prompt has no tokens");
    if (t.ids.size() <= t.prompt_len) io::jsonl_error(path, r.line, "the completion has no tokens");
    if (static_cast<int>(t.prompt_len) >= opts.max_length) {  // trl drops these before pairing the KL completions
      if (out.dropped++ == 0) out.first_dropped_line = r.line;
      continue;
    }
    kept.push_back(std::move(t));
  }
  if (kept.empty())
    throw UserError(path + (out.dropped > 0 ? ": no examples left: every prompt has kto.max_length (" +
                                                  std::to_string(opts.max_length) + ") tokens or more"
                                            : std::string(": no examples")));
  for (Tokenized& t : kept) {  // the KL sequences are paired by the trainer (kto_example)
    PreferencePair e;
    e.label = t.label ? 1 : 0;
    e.prompt_len = static_cast<std::int32_t>(t.prompt_len);
    e.chosen_text = std::move(t.text);
    e.completion.assign(t.ids.begin() + static_cast<std::ptrdiff_t>(t.prompt_len), t.ids.end());
    e.chosen = std::move(t.ids);
    e.chosen.resize(std::min<std::size_t>(e.chosen.size(), static_cast<std::size_t>(opts.max_length)));
    out.pairs.push_back(std::move(e));
  }
  return out;
}

}  // namespace mgrl::train
