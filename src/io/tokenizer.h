// tokenizer.h: Hugging Face tokenizer.json (BPE: byte-level as in GPT-2 / Llama-3 / Qwen2, and
// SentencePiece-style with byte fallback as in Llama-2 / Mistral), tokenizer_config.json facts (special tokens,
// the chat template's text: io/chat_template.h renders it), and the built-in chat formats (ChatML, Llama-3) used
// only when a user names one.
//
// Encoding and decoding follow the Hugging Face `tokenizers` library (tests compare ids and strings with
// it on fixtures in tests/data/tokenizers). Supported tokenizer.json components:
//   model          BPE (vocab, merges as "a b" or [a, b], unk_token, fuse_unk, byte_fallback, ignore_merges)
//   normalizer     Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip
//   pre_tokenizer  Sequence, Split (all behaviours, invert), ByteLevel, Metaspace, Digits
//   post_processor TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence
//   decoder        ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence
//   added_tokens   special or not, single_word, lstrip, rstrip, normalized
// Anything else is a UserError naming the file and the component. `truncation` and `padding` are ignored
// (as transformers does for single texts). Regex classes use PCRE2's Unicode tables (Unicode 14 with
// Debian 12's PCRE2 10.42): characters assigned in later Unicode versions may be split differently from
// the library, which knows Unicode 16. A Tokenizer is cheap to copy (shared, immutable) and its const
// methods may be called from several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mgrl::io {

struct Message {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

// The built-in formats, for models without a chat template (train.chat_format / generate.chat_format name one;
// `auto` always means the model's own template, io/chat_template.h). How a conversation becomes text:
//   ChatML  <|im_start|>{role}\n{content}<|im_end|>\n ...; generation prompt <|im_start|>assistant\n
//           (Qwen's templates; Qwen2/2.5 templates also insert a default system message when the
//           conversation has none: this does not, give one explicitly if wanted)
//   Llama3  <|begin_of_text|> then <|start_header_id|>{role}<|end_header_id|>\n\n{trimmed content}<|eot_id|>
//           ...; generation prompt <|start_header_id|>assistant<|end_header_id|>\n\n (Llama-3 instruct)
//   None    the contents one after the other, nothing added (base models)
enum class ChatFormat { None, ChatML, Llama3 };

// "none", "chatml", "llama3" (UserError otherwise).
ChatFormat chat_format_from_name(const std::string& name);
const char* chat_format_name(ChatFormat fmt);

// The conversation as text in the given format. The Llama3 text starts with <|begin_of_text|>: encode it
// with add_special_tokens = false (Tokenizer::encode_chat does).
std::string apply_chat(const std::vector<Message>& messages, ChatFormat fmt, bool add_generation_prompt);

// A Jinja chat template that renders as apply_chat does (ChatML, Llama3: what `mgrl export` writes as the model's
// chat_template.jinja when a run trained with a built-in format, so that transformers' apply_chat_template gives the
// trained format); "" for None, whose text depends on the tokenizer's post-processor, which no template adds.
std::string builtin_chat_template(ChatFormat fmt);

class Tokenizer {
 public:
  // dir/tokenizer.json, with dir/tokenizer_config.json (and dir/chat_template.jinja) when present.
  static Tokenizer from_dir(const std::string& dir);
  // A tokenizer.json; tokenizer_config.json (and chat_template.jinja) next to it are read when present.
  static Tokenizer from_file(const std::string& path);

  // Token ids of text (valid UTF-8, else UserError). add_special_tokens: let the post-processor add
  // BOS/EOS as the tokenizer.json says (special tokens written in the text are always recognised).
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens = true) const;
  // Text of ids. Ids that are no token are skipped (as in Hugging Face); skip_special_tokens drops
  // special added tokens.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  // apply_chat then encode: without post-processor specials for ChatML and Llama3 (the text carries
  // them, as transformers' apply_chat_template(tokenize=True) does), with them for None.
  std::vector<int32_t> encode_chat(const std::vector<Message>& messages, ChatFormat fmt,
                                   bool add_generation_prompt) const;

  // From tokenizer_config.json (bos_token, eos_token, pad_token). Without that file, bos_id is the
  // first special token the post-processor puts in front of a text, if any, and eos_id/pad_id are empty.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  // 1 + the largest id of the model vocabulary and the added tokens.
  int32_t vocab_size() const;
  std::optional<int32_t> token_to_id(const std::string& token) const;
  // The token string decoding uses; as in Hugging Face, an added token with "normalized": true reads back
  // in its normalized form (under Llama-2's normalizer "<x>" reads back as "▁<x>").
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;  // a special added token

  // The chat template of tokenizer_config.json ("chat_template": a string, or the list entry named "default") or
  // else of chat_template.jinja; "" when none. origin: where it was read ("dir/tokenizer_config.json
  // (chat_template)", "dir/chat_template.jinja"), for error messages.
  const std::string& chat_template() const;
  const std::string& chat_template_origin() const;
  // bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token of tokenizer_config.json (string
  // or {"content": ...} form) that are set: the variables transformers gives a chat template.
  const std::vector<std::pair<std::string, std::string>>& special_token_strings() const;
  // [begin, end) byte offsets in text of each token of ids = encode(text, false), found by matching every token's
  // surface form (its bytes; SentencePiece's ▁ as a space) along the text; an unknown token covers one character,
  // or the run up to where the next token matches (fuse_unk). UserError when a token cannot be placed (a
  // normalizer that rewrites the text).
  std::vector<std::pair<size_t, size_t>> token_offsets(const std::vector<int32_t>& ids, const std::string& text) const;
  const std::string& path() const;  // the tokenizer.json read

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace mgrl::io
