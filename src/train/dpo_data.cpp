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

}  // namespace

PairData load_pairs(const std::string& path, const io::Tokenizer& tok, const PairOptions& opts) {
  PairData out;
  const auto eos = tok.eos_id();
  io::read_jsonl(path, [&](const nlohmann::ordered_json& j, int line) {
    for (const char* k : {"chosen", "rejected"})
      if (!j.contains(k)) io::jsonl_error(path, line, std::string("expected {\"prompt\", \"chosen\", \"rejected\"}: no \"") + k + "\"");
    // No "prompt" (or a string one beside conversations): the shared start of chosen and rejected is the prompt, as
    // trl's extract_prompt finds it (messages, or characters with a space before the split going to the completions).
    nlohmann::ordered_json p, chosen = j["chosen"], rejected = j["rejected"];
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
  auto add = [&](int n, int first, const std::string& what) {
    if (n == 0) return;
    out.push_back(path + ": " + std::to_string(n) + " pair" + (n == 1 ? " " : "s ") + what + " (the first at line " +
           std::to_string(first) + ")");
  };
  add(dropped, first_dropped_line,
      std::string(dropped == 1 ? "is" : "are") + " left out: the prompt alone has dpo.max_length (" +
          std::to_string(max_length) + ") tokens or more");
  add(same, first_same_line, std::string(same == 1 ? "has" : "have") + " the same chosen and rejected tokens: " +
                                 (cancels ? "the loss's gradient is 0 for them, they teach nothing"
                                          : "the loss pulls the same completion up as chosen and down as rejected"));
  add(cut_same, first_cut_same_line,
      std::string(cut_same == 1 ? "differs" : "differ") + " only after dpo.max_length (" + std::to_string(max_length) +
          ") tokens: cut there, chosen and rejected are the same and " +
          (cancels ? "teach nothing" : "pulled both ways") + "; raise dpo.max_length");
  return out;
}

}  // namespace mgrl::train
