// chat_template.cpp: conversations to text, ids and assistant masks through the model's Jinja template (or a
// built-in format), with transformers' template variables and mask rule.
#include "io/chat_template.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "io/jinja.h"
#include "io/jsonl.h"

namespace mgrl::io {

struct ChatTemplate::Impl {
  Tokenizer tok;
  bool builtin = false;
  ChatFormat format = ChatFormat::None;
  std::optional<jinja::Template> tmpl;
  std::string origin;       // where the template came from
  jinja::Vars base;         // special tokens and template kwargs
  std::string none_reason;  // why there is no template (format auto)

  explicit Impl(Tokenizer t) : tok(std::move(t)) {}

  std::vector<Message> plain(const nlohmann::ordered_json& messages) const {
    std::vector<Message> out;
    for (const auto& m : messages) {
      if (m.contains("tool_calls"))
        throw UserError("the built-in " + std::string(chat_format_name(format)) + " format has no tool calls: render "
                        "tool-calling data with the model's chat template (chat_format = \"auto\")");
      out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    return out;
  }

  // What the template sees of the messages: keys whose value is null dropped, and a reasoning field copied
  // under "thinking" and "reasoning_content" (transformers 5's _normalize_chat_messages and
  // _alias_reasoning_fields).
  static jinja::Value template_messages(const nlohmann::ordered_json& messages) {
    jinja::List out;
    for (const auto& m : messages) {
      jinja::Dict d;
      for (auto it = m.begin(); it != m.end(); ++it)
        if (!it.value().is_null()) d.emplace_back(it.key(), jinja::from_json(it.value()));
      std::optional<jinja::Value> reasoning;
      for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
        for (const auto& kv : d)
          if (kv.first == key) {
            reasoning = kv.second;
            break;
          }
        if (reasoning) break;
      }
      if (reasoning) {
        jinja::Dict aliased{{"thinking", *reasoning}};
        for (auto& kv : d) {
          if (kv.first == "thinking") aliased[0].second = kv.second;
          else if (kv.first != "reasoning_content") aliased.push_back(kv);
        }
        aliased.emplace_back("reasoning_content", *reasoning);
        d = std::move(aliased);
      }
      out.push_back(jinja::Value::make_dict(std::move(d)));
    }
    return jinja::Value::make_list(std::move(out));
  }

  jinja::Template::Output run(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                              const ChatExtras& extras) const {
    if (builtin) {
      if (!extras.tools.is_null() || !extras.kwargs.is_null())
        throw UserError("the built-in " + std::string(chat_format_name(format)) + " format takes no \"tools\" and no "
                        "\"chat_template_kwargs\": render this line with the model's chat template (chat_format = "
                        "\"auto\")");
      return {apply_chat(plain(messages), format, add_generation_prompt), {}};
    }
    if (!tmpl) throw UserError(none_reason);
    jinja::Vars vars{{"messages", template_messages(messages)},
                     {"tools", extras.tools.is_null() ? jinja::Value::none() : jinja::from_json(extras.tools)},
                     {"documents", jinja::Value::none()},
                     {"add_generation_prompt", jinja::Value::boolean(add_generation_prompt)}};
    // The line's own keyword arguments first: they override chat.template_kwargs and the special tokens.
    if (extras.kwargs.is_object())
      for (auto it = extras.kwargs.begin(); it != extras.kwargs.end(); ++it) vars.emplace_back(it.key(), jinja::from_json(it.value()));
    for (const auto& b : base) {
      bool given = false;
      for (const auto& v : vars) given = given || v.first == b.first;
      if (!given) vars.push_back(b);
    }
    return tmpl->render(vars);
  }
};

ChatTemplate::ChatTemplate(const Tokenizer& tok, const ChatOptions& opts) {
  auto impl = std::make_shared<Impl>(tok);
  if (opts.format != "auto") {
    if (!opts.template_path.empty())
      throw UserError("chat.template (" + opts.template_path + ") is set, but " + opts.format_key + " names the built-in '" +
                      opts.format + "' format: set " + opts.format_key + " = \"auto\" to use the template");
    // A built-in format has no variables to set: kwargs were accepted unread (not even parsed) until 2026-11-28.
    nlohmann::ordered_json kwargs;
    try {
      kwargs = nlohmann::ordered_json::parse(opts.template_kwargs.empty() ? std::string("{}") : opts.template_kwargs);
    } catch (const nlohmann::ordered_json::exception&) {
      kwargs = nullptr;  // not even JSON: refused below all the same
    }
    if (!(kwargs.is_object() && kwargs.empty()))
      throw UserError("chat.template_kwargs is set, but " + opts.format_key + " names the built-in '" + opts.format +
                      "' format, which takes no template variables: set " + opts.format_key +
                      " = \"auto\" to render with the model's template");
    impl->builtin = true;
    impl->format = chat_format_from_name(opts.format);
    impl_ = std::move(impl);
    return;
  }
  std::string source;
  if (!opts.template_path.empty()) {
    check_regular_input(opts.template_path, "the chat template (chat.template)");
    std::ifstream f(opts.template_path, std::ios::binary);
    if (!f) throw UserError(opts.template_path + ": cannot open the chat template (chat.template)");
    std::ostringstream ss;
    ss << f.rdbuf();
    source = ss.str();
    impl->origin = opts.template_path;
  } else {
    source = tok.chat_template();
    impl->origin = tok.chat_template_origin();
  }
  if (impl->origin.empty()) {
    impl->none_reason = tok.path() + ": the tokenizer has no chat template (no \"chat_template\" in tokenizer_config.json, "
                        "no chat_template.jinja): set chat.template to a .jinja file, or name a built-in format "
                        "(chatml, llama3 or none) with train.chat_format / generate.chat_format";
  } else {
    impl->tmpl.emplace(source, impl->origin);
  }
  for (const auto& kv : tok.special_token_strings()) impl->base.emplace_back(kv.first, jinja::Value::string(kv.second));
  nlohmann::ordered_json kwargs;
  try {
    kwargs = nlohmann::ordered_json::parse(opts.template_kwargs.empty() ? std::string("{}") : opts.template_kwargs);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw UserError(opts.kwargs_key + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!kwargs.is_object()) throw UserError(opts.kwargs_key + ": must be a JSON object such as {\"enable_thinking\": false}");
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
    const std::string& k = it.key();
    if (k == "messages" || k == "add_generation_prompt" || k == "tools" || k == "documents")
      throw UserError(opts.kwargs_key + ": '" + k + "' is set by mgrl, not a template keyword");
    bool replaced = false;  // keyword arguments override the special tokens, as in transformers
    for (auto& b : impl->base)
      if (b.first == k) b.second = jinja::from_json(it.value()), replaced = true;
    if (!replaced) impl->base.emplace_back(k, jinja::from_json(it.value()));
  }
  impl_ = std::move(impl);
}

ChatExtras ChatExtras::of(const nlohmann::ordered_json& row) {
  ChatExtras e;
  if (row.contains("tools") && !row["tools"].is_null()) {
    e.tools = row["tools"];
    if (e.tools.is_string()) {  // trl reads a JSON string too
      try {
        e.tools = nlohmann::ordered_json::parse(row["tools"].get<std::string>());
      } catch (const nlohmann::ordered_json::exception&) {
        throw UserError("\"tools\" is a string that is not JSON");
      }
    }
    if (!e.tools.is_array()) throw UserError("\"tools\" must be a list of tool definitions");
  }
  if (row.contains("chat_template_kwargs") && !row["chat_template_kwargs"].is_null()) {
    e.kwargs = row["chat_template_kwargs"];
    if (!e.kwargs.is_object()) throw UserError("\"chat_template_kwargs\" must be an object");
    for (const char* k : {"messages", "add_generation_prompt", "tools", "documents"})
      if (e.kwargs.contains(k))
        throw UserError(std::string("\"chat_template_kwargs\": '") + k + "' is set by mgrl, not a template keyword");
  }
  return e;
}

std::string ChatTemplate::text(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const ChatExtras& extras) const {
  return impl_->run(messages, add_generation_prompt, extras).text;
}

std::vector<std::int32_t> ChatTemplate::encode(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                               const ChatExtras& extras) const {
  const bool specials = impl_->builtin && impl_->format == ChatFormat::None;
  return impl_->tok.encode(text(messages, add_generation_prompt, extras), specials);
}

RenderedChat ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                  const ChatExtras& extras) const {
  const Impl& im = *impl_;
  RenderedChat r;
  auto out = im.run(messages, add_generation_prompt, extras);
  r.text = std::move(out.text);
  if (!im.builtin && im.tmpl->marks_generation()) {
    r.spans = std::move(out.generation);
  } else {
    for (std::size_t i = 0; i < messages.size(); ++i) {
      if (messages[i].value("role", "") != "assistant") continue;
      const nlohmann::ordered_json before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
      const nlohmann::ordered_json upto(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      std::string p, q;
      try {
        p = im.run(before, true, extras).text;
        q = im.run(upto, false, extras).text;
      } catch (const UserError& e) {
        throw UserError("finding assistant message " + std::to_string(i + 1) + " by rendering the messages before it: " +
                        e.what() + " (a template that marks assistant text with {% generation %} needs no such rendering)");
      }
      if (q.size() > p.size() && q.compare(0, p.size(), p) == 0 && r.text.compare(0, q.size(), q) == 0)
        r.spans.emplace_back(p.size(), q.size());
    }
  }
  // ids and their offsets: the text encoded without added specials (what the offsets can place); the built-in
  // "none" format then gets the post-processor's specials around it, outside every span
  std::vector<std::int32_t> plain = im.tok.encode(r.text, false);
  const auto offsets = im.tok.token_offsets(plain, r.text);
  std::vector<std::uint8_t> mask(plain.size(), 0);
  std::size_t k = 0;  // transformers' rule: a token overlapping a span is 1
  for (std::size_t t = 0; t < offsets.size(); ++t) {
    while (k < r.spans.size() && offsets[t].first >= r.spans[k].second) ++k;
    if (k == r.spans.size()) break;
    if (offsets[t].second > r.spans[k].first) mask[t] = 1;
  }
  if (im.builtin && im.format == ChatFormat::None) {
    r.tokens = im.tok.encode(r.text, true);
    std::size_t at = 0;
    while (at + plain.size() <= r.tokens.size() &&
           !std::equal(plain.begin(), plain.end(), r.tokens.begin() + static_cast<std::ptrdiff_t>(at)))
      ++at;
    if (at + plain.size() > r.tokens.size()) at = 0;  // not expected: the post-processor only adds tokens around
    r.mask.assign(r.tokens.size(), 0);
    for (std::size_t t = 0; t < mask.size() && at + t < r.mask.size(); ++t) r.mask[at + t] = mask[t];
  } else {
    r.tokens = std::move(plain);
    r.mask = std::move(mask);
  }
  return r;
}

std::string ChatTemplate::describe() const {
  if (impl_->builtin) return std::string("the built-in ") + chat_format_name(impl_->format) + " format";
  if (!impl_->tmpl) return "no chat template";
  return "the chat template of " + impl_->origin;
}

bool ChatTemplate::has_template() const { return impl_->builtin || impl_->tmpl.has_value(); }
bool ChatTemplate::builtin() const { return impl_->builtin; }

void ChatTemplate::check_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array() || messages.empty()) throw UserError("\"messages\" must be a non-empty array");
  for (const auto& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw UserError("each message needs string \"role\" and \"content\"");
    const bool content = m.contains("content") && m["content"].is_string();
    const bool tool_call = m["role"] == "assistant" && m.contains("tool_calls") &&
                           (!m.contains("content") || m["content"].is_null() || m["content"].is_string());
    if (!content && !tool_call) throw UserError("each message needs string \"role\" and \"content\"");
  }
}

}  // namespace mgrl::io
