// chat_template.h: how a conversation ({"messages": [...]}) becomes text, token ids and an assistant mask, the
// one path SFT, GRPO, generate, score and `mgrl render` use. The model's own Jinja chat template is rendered as
// transformers' apply_chat_template renders it (io/jinja.h); the built-in formats (io/tokenizer.h ChatFormat) only
// when the configuration names one.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "io/tokenizer.h"

namespace mgrl::io {

struct ChatOptions {
  // "auto": the model's chat template (chat.template when set, else the tokenizer's); "chatml", "llama3",
  // "none": the built-in formats.
  std::string format = "auto";
  std::string template_path;            // a .jinja file used instead of the tokenizer's template ("": none)
  std::string template_kwargs = "{}";   // a JSON object: extra template variables (e.g. {"enable_thinking": false})
  std::string kwargs_key = "chat.template_kwargs";  // named in messages about template_kwargs
  std::string format_key = "train.chat_format";      // named in messages about format
};

struct RenderedChat {
  std::string text;
  std::vector<std::int32_t> tokens;
  // Per token: 1 when it belongs to an assistant turn that is trained (see ChatTemplate::render).
  std::vector<std::uint8_t> mask;
  // [begin, end) byte ranges of text that are assistant turns.
  std::vector<std::pair<std::size_t, std::size_t>> spans;
};

// What a data line may give its conversation beside the messages, as trl's columns do: "tools" (a list of tool
// definitions, or that list as a JSON string: the template's `tools`) and "chat_template_kwargs" (an object of
// template variables for this line, over chat.template_kwargs). Null when the line has none.
struct ChatExtras {
  nlohmann::ordered_json tools, kwargs;
  // Read from a data line (UserError "what" for a malformed column: the caller adds file and line).
  static ChatExtras of(const nlohmann::ordered_json& row);
};

class ChatTemplate {
 public:
  // Reads the template (UserError naming the file and line for a template mgrl cannot interpret, or naming
  // template_kwargs when it is not a JSON object). A model without a template is fine until a conversation
  // must be rendered with format "auto".
  ChatTemplate(const Tokenizer& tok, const ChatOptions& opts);

  // The conversation as text. messages: a JSON array of objects with a string "role" (any other fields, such as
  // "content" or "reasoning_content", reach the template as they are).
  std::string text(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                   const ChatExtras& extras = {}) const;
  // The text's token ids: encoded as transformers' apply_chat_template(tokenize=True) does (no special tokens
  // added: the template writes them); the built-in format "none" adds them as the tokenizer's post-processor says.
  std::vector<std::int32_t> encode(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                   const ChatExtras& extras = {}) const;
  // Text, ids and the assistant mask. When the template marks assistant text with {% generation %}, those
  // spans (transformers' return_assistant_tokens_mask); otherwise, for each assistant message i, the text that
  // rendering messages[:i+1] adds to messages[:i] with the generation prompt, when both renderings are prefixes
  // of the whole (a turn the template renders differently once later turns follow, such as Qwen3 dropping earlier
  // reasoning, is context, not trained). A token overlapping a span is 1, as in transformers.
  RenderedChat render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                      const ChatExtras& extras = {}) const;

  // "the chat template of <origin>", "chat.template <path>" or "the built-in <name> format", for messages.
  std::string describe() const;
  // Whether `auto` found a template (false: rendering a conversation is an error).
  bool has_template() const;
  // Whether a built-in format (chatml, llama3, none) was named instead of the model's template.
  bool builtin() const;

  // A {"messages": [...]} value checked: a non-empty array of objects each with a string "role" and a string
  // "content" (null or absent in an assistant message with "tool_calls", as trl's tool-calling data has it)
  // (UserError "what" otherwise: the caller adds file and line).
  static void check_messages(const nlohmann::ordered_json& messages);

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace mgrl::io
