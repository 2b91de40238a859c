// dpo_data.cpp: preference pairs from JSONL, tokenized as trl's DPOTrainer tokenizes them.
#include "train/dpo_data.h"

#include <algorithm>

#include "core/error.h"
#include "io/jsonl.h"

namespace mgrl::train {

std::vector<std::int32_t> render_conversation(const io::ChatTemplate& chat, const std::vector<io::Message>& messages,
                                              bool add_generation_prompt) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();  // role first, as a dataset's messages are
  for (const auto& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
  return chat.encode(j, add_generation_prompt);
}

namespace {

std::size_t common_prefix(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// A list of {"role", "content"} messages, or the line's error naming `key`.
std::vector<io::Message> messages_of(const nlohmann::json& v, const std::string& key, const std::string& path, int line) {
  if (!v.is_array() || v.empty()) io::jsonl_error(path, line, "\"" + key + "\" must be a non-empty list of messages");
  std::vector<io::Message> out;
  for (const auto& x : v) {
    if (!x.is_object() || !x.contains("role") || !x.contains("content") || !x["role"].is_string() ||
        !x["content"].is_string())
      io::jsonl_error(path, line, "each message of \"" + key + "\" needs string \"role\" and \"content\"");
    out.push_back({x["role"].get<std::string>(), x["content"].get<std::string>()});
  }
  return out;
}

}  // namespace

PairData load_pairs(const std::string& path, const io::Tokenizer& tok, const PairOptions& opts) {
  PairData out;
  const auto eos = tok.eos_id();
  io::read_jsonl(path, [&](const nlohmann::ordered_json& j, int line) {
    for (const char* k : {"prompt", "chosen", "rejected"})
      if (!j.contains(k)) io::jsonl_error(path, line, std::string("expected {\"prompt\", \"chosen\", \"rejected\"}: no \"") + k + "\"");
    const auto& p = j["prompt"];
    PreferencePair pr;
    std::vector<std::int32_t> prompt, with_chosen, with_rejected;
    if (p.is_string()) {
      // trl: the prompt, and prompt + completion + EOS, each tokenized whole.
      if (!j["chosen"].is_string() || !j["rejected"].is_string())
        io::jsonl_error(path, line, "with a string \"prompt\", \"chosen\" and \"rejected\" must be strings");
      if (!eos) throw UserError(tok.path() + ": the tokenizer has no EOS token (tokenizer_config.json eos_token)");
      const std::string ps = p.get<std::string>();
      pr.chosen_text = j["chosen"].get<std::string>();
      prompt = tok.encode(ps, true);
      with_chosen = tok.encode(ps + pr.chosen_text, true);
      with_rejected = tok.encode(ps + j["rejected"].get<std::string>(), true);
      for (auto* s : {&with_chosen, &with_rejected})
        if (s->empty() || s->back() != *eos) s->push_back(*eos);
    } else if (p.is_array()) {
      // trl's conversational form: the prompt with the generation prompt, and prompt + completion messages, each
      // rendered through the chat template (no EOS added: the template ends the turn).
      const auto msgs = messages_of(p, "prompt", path, line);
      auto completion = [&](const char* key) {
        const auto& v = j[key];
        if (v.is_string()) return std::vector<io::Message>{{"assistant", v.get<std::string>()}};
        return messages_of(v, key, path, line);
      };
      const auto c = completion("chosen"), r = completion("rejected");
      pr.chosen_text = c.back().content;
      if (!opts.chat) io::jsonl_error(path, line, "chat messages need a chat template (none was given)");
      auto joined = msgs;
      joined.insert(joined.end(), c.begin(), c.end());
      with_chosen = render_conversation(*opts.chat, joined, false);
      joined.resize(msgs.size());
      joined.insert(joined.end(), r.begin(), r.end());
      with_rejected = render_conversation(*opts.chat, joined, false);
      prompt = render_conversation(*opts.chat, msgs, true);
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

std::vector<std::string> PairData::notes(const std::string& path, int max_length) const {
  std::vector<std::string> out;
  auto add = [&](int n, int first, const std::string& what) {
    if (n == 0) return;
    out.push_back(path + ": " + std::to_string(n) + " pair" + (n == 1 ? " " : "s ") + what + " (the first at line " +
           std::to_string(first) + ")");
  };
  add(dropped, first_dropped_line,
      std::string(dropped == 1 ? "is" : "are") + " left out: the prompt alone has dpo.max_length (" +
          std::to_string(max_length) + ") tokens or more");
  add(same, first_same_line, std::string(same == 1 ? "has" : "have") +
                                 " the same chosen and rejected tokens: the loss's gradient is 0 for them, they teach nothing");
  add(cut_same, first_cut_same_line,
      std::string(cut_same == 1 ? "differs" : "differ") + " only after dpo.max_length (" + std::to_string(max_length) +
          ") tokens: cut there, chosen and rejected are the same and teach nothing; raise dpo.max_length");
  return out;
}

}  // namespace mgrl::train
