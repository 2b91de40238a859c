// tokenizer.cpp: tokenizer.json (normalizer, pre-tokenizer, BPE model, post-processor, decoder, added
// tokens), tokenizer_config.json facts and the chat formats. The pipeline and its edge cases follow the
// Hugging Face `tokenizers` library; tests/unit/test_tokenizer.cpp checks it against that library.
#include "io/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "io/jsonl.h"
#include "io/unicode.h"

namespace mgrl::io {
namespace {

using json = nlohmann::json;
namespace uc = unicode;
using Span = std::pair<size_t, size_t>;

// ---------------------------------------------------------------------------------------------
// Reading JSON, with errors that name the file
// ---------------------------------------------------------------------------------------------

struct Ctx {
  std::string path;
  [[noreturn]] void fail(const std::string& what) const { throw UserError(path + ": " + what); }
  [[noreturn]] void unsupported(const std::string& kind, const std::string& type, const std::string& supported) const {
    fail("unsupported " + kind + " '" + type + "' (mgrl supports " + supported + ")");
  }
};

// Present at all: a directory or FIFO in a file's place is then refused by read_text, not taken for no file.
bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path) {
  check_regular_input(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json(const std::string& path) {
  const std::string text = read_text(path);
  const auto nul = text.find('\0');
  if (nul != std::string::npos)
    throw UserError(path + ": a NUL byte at offset " + std::to_string(nul) + " (not a text file, or a damaged one?)");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers beyond double's range
    throw UserError(path + ": invalid JSON: " + json_error_text(e));
  }
}

std::string type_of(const json& j, const Ctx& ctx, const std::string& what) {
  if (!j.is_object()) ctx.fail(what + " is not a JSON object");
  const auto it = j.find("type");
  if (it == j.end() || !it->is_string()) ctx.fail(what + " has no \"type\"");
  return it->get<std::string>();
}

bool get_bool(const json& j, const char* key, bool def, const Ctx& ctx, const std::string& what) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) ctx.fail(what + ": \"" + key + "\" must be true or false");
  return it->get<bool>();
}

std::string get_string(const json& j, const char* key, const Ctx& ctx, const std::string& what) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) ctx.fail(what + ": \"" + key + "\" must be a string");
  return it->get<std::string>();
}

int64_t get_int(const json& j, const char* key, const Ctx& ctx, const std::string& what) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) ctx.fail(what + ": \"" + key + "\" must be an integer");
  return it->get<int64_t>();
}

int32_t to_id(const json& v, const Ctx& ctx, const std::string& what) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
    ctx.fail(what + ": token id must be an integer in [0, 2^31)");
  return static_cast<int32_t>(v.get<int64_t>());
}

// A {"String": s} or {"Regex": r} pattern, as a regex.
uc::Regex get_pattern(const json& j, const Ctx& ctx, const std::string& what) {
  const auto it = j.find("pattern");
  if (it == j.end() || !it->is_object() || it->size() != 1)
    ctx.fail(what + ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
  try {
    if (it->contains("String") && (*it)["String"].is_string())
      return uc::Regex::literal((*it)["String"].get<std::string>());
    if (it->contains("Regex") && (*it)["Regex"].is_string()) return uc::Regex((*it)["Regex"].get<std::string>());
  } catch (const std::invalid_argument& e) {
    ctx.fail(what + ": bad regex " + it->dump() + ": " + e.what());
  }
  ctx.fail(what + ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
}

// A single character given as a string (Metaspace replacement, Strip content).
std::string get_char(const json& j, const char* key, const Ctx& ctx, const std::string& what) {
  const std::string s = get_string(j, key, ctx, what);
  if (s.empty() || uc::utf8_invalid_at(s) != std::string::npos ||
      uc::utf8_len(static_cast<unsigned char>(s[0])) != s.size())
    ctx.fail(what + ": \"" + key + "\" must be one character");
  return s;
}

std::string replace_all(const std::string& s, const uc::Regex& re, const std::string& content) {
  const auto matches = re.find_all(s);
  if (matches.empty()) return s;
  std::string out;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    out.append(s, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(s, prev, std::string::npos);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Splitting a piece of text by a pattern (tokenizers' NormalizedString::split)
// ---------------------------------------------------------------------------------------------

// A piece of text between pre-tokenization steps. at_origin: it starts where the input text starts
// (what Metaspace's prepend_scheme "first" asks).
struct Piece {
  std::string text;
  bool at_origin;
};

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& s, const Ctx& ctx) {
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  ctx.unsupported("Split behavior", s, "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

// The spans to keep, from the matches of a pattern in a text of n bytes.
std::vector<Span> split_spans(size_t n, const std::vector<Span>& matches, Behavior behavior, bool invert) {
  std::vector<std::pair<Span, bool>> parts;  // covers [0, n): (span, is_match)
  size_t prev = 0;
  for (const auto& m : matches) {
    if (prev != m.first) parts.push_back({{prev, m.first}, false});
    parts.push_back({m, true});
    prev = m.second;
  }
  if (prev != n) parts.push_back({{prev, n}, false});
  if (invert)
    for (auto& p : parts) p.second = !p.second;

  std::vector<Span> out;
  bool prev_match = false;
  switch (behavior) {
    case Behavior::Isolated:
      for (const auto& p : parts) out.push_back(p.first);
      break;
    case Behavior::Removed:
      for (const auto& p : parts)
        if (!p.second) out.push_back(p.first);
      break;
    case Behavior::MergedWithPrevious:
      for (const auto& [span, is_match] : parts) {
        if (is_match && !prev_match && !out.empty())
          out.back().second = span.second;
        else
          out.push_back(span);
        prev_match = is_match;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->second && !prev_match && !out.empty())
          out.back().first = it->first.first;
        else
          out.push_back(it->first);
        prev_match = it->second;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::Contiguous:
      for (const auto& [span, is_match] : parts) {
        if (is_match == prev_match && !out.empty())
          out.back().second = span.second;
        else
          out.push_back(span);
        prev_match = is_match;
      }
      break;
  }
  return out;
}

using Finder = std::function<std::vector<Span>(std::string_view)>;

void split_pieces(std::vector<Piece>& pieces, const Finder& find, Behavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (const auto& p : pieces) {
    for (const auto& [b, e] : split_spans(p.text.size(), find(p.text), behavior, invert))
      if (e > b) out.push_back({p.text.substr(b, e - b), p.at_origin && b == 0});
  }
  pieces.swap(out);
}

// ---------------------------------------------------------------------------------------------
// GPT-2's byte <-> character table (ByteLevel)
// ---------------------------------------------------------------------------------------------

struct ByteTable {
  std::array<std::string, 256> to_char;           // byte -> UTF-8 of its character
  std::unordered_map<char32_t, uint8_t> to_byte;  // character -> byte
  ByteTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      uc::utf8_append(to_char[b], cp);
      to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

// ---------------------------------------------------------------------------------------------
// Normalizers
// ---------------------------------------------------------------------------------------------

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string s) const = 0;
  // normalize(s), and *at_origin cleared when the result's first character no longer starts at the first character
  // of s (the library's alignments; Metaspace's prepend_scheme "first" asks for original offset 0): when leading
  // characters are stripped, removed, or several replaced by one (the library aligns a replacement with the last
  // character it replaces).
  virtual std::string normalize_at(std::string s, bool* /*at_origin*/) const { return normalize(std::move(s)); }
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::string normalize(std::string s) const override {
    for (const auto& p : parts_) s = p->normalize(std::move(s));
    return s;
  }
  std::string normalize_at(std::string s, bool* at_origin) const override {
    for (const auto& p : parts_) s = p->normalize_at(std::move(s), at_origin);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class FormNormalizer : public Normalizer {
 public:
  explicit FormNormalizer(uc::NormalForm form) : form_(form) {}
  std::string normalize(std::string s) const override { return uc::normalize(s, form_); }

 private:
  uc::NormalForm form_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  std::string normalize(std::string s) const override { return s.empty() ? s : prepend_ + s; }

 private:
  std::string prepend_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(uc::Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string s) const override { return replace_all(s, pattern_, content_); }
  std::string normalize_at(std::string s, bool* at_origin) const override {
    const auto matches = pattern_.find_all(s);
    if (!matches.empty() && matches[0].first == 0 && matches[0].second > 0) {
      const std::string_view m = std::string_view(s).substr(0, matches[0].second);
      const bool one_char = uc::utf8_len(static_cast<unsigned char>(m[0])) == m.size();
      if (content_.empty() ? matches[0].second < s.size() : !one_char) *at_origin = false;
    }
    return replace_all(s, pattern_, content_);
  }

 private:
  uc::Regex pattern_;
  std::string content_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t i = b;
        if (!uc::is_white_space(uc::utf8_next(s, i))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t start = e - 1;
        while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!uc::is_white_space(uc::utf8_next(s, i))) break;
        e = start;
      }
    }
    return s.substr(b, e - b);
  }
  std::string normalize_at(std::string s, bool* at_origin) const override {
    std::string out = normalize(s);
    if (left_ && !out.empty() && out.size() < s.size() && s.compare(0, out.size(), out) != 0) *at_origin = false;
    return out;
  }

 private:
  bool left_, right_;
};

std::unique_ptr<Normalizer> make_normalizer(const json& j, const Ctx& ctx) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, ctx, "normalizer");
  const std::string what = "normalizer " + type;
  if (type == "Sequence") {
    const auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) ctx.fail(what + ": \"normalizers\" must be a list");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& p : *it) parts.push_back(make_normalizer(p, ctx));
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "NFC") return std::make_unique<FormNormalizer>(uc::NormalForm::NFC);
  if (type == "NFD") return std::make_unique<FormNormalizer>(uc::NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(uc::NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(uc::NormalForm::NFKD);
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(get_string(j, "prepend", ctx, what));
  if (type == "Replace")
    return std::make_unique<ReplaceNormalizer>(get_pattern(j, ctx, what), get_string(j, "content", ctx, what));
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(get_bool(j, "strip_left", true, ctx, what),
                                             get_bool(j, "strip_right", true, ctx, what));
  ctx.unsupported("normalizer", type, "Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip");
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers: each turns every piece into zero or more pieces
// ---------------------------------------------------------------------------------------------

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(uc::Regex pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void apply(std::vector<Piece>& pieces) const override {
    split_pieces(
        pieces, [this](std::string_view s) { return pattern_.find_all(s); }, behavior_, invert_);
  }

 private:
  uc::Regex pattern_;
  Behavior behavior_;
  bool invert_;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void apply(std::vector<Piece>& pieces) const override {
    const auto numeric_chars = [](std::string_view s) {  // every numeric character is its own match
      std::vector<Span> m;
      for (size_t i = 0; i < s.size();) {
        const size_t b = i;
        if (uc::is_numeric(uc::utf8_next(s, i))) m.emplace_back(b, i);
      }
      return m;
    };
    split_pieces(pieces, numeric_chars, individual_ ? Behavior::Isolated : Behavior::Contiguous, false);
  }

 private:
  bool individual_;
};

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is true.
const uc::Regex& gpt2_regex() {
  static const uc::Regex re(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  return re;
}

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void apply(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_)
      for (auto& p : pieces)
        if (p.text[0] != ' ') p.text.insert(0, 1, ' ');
    if (use_regex_)
      split_pieces(
          pieces, [](std::string_view s) { return gpt2_regex().find_all(s); }, Behavior::Isolated, false);
    const auto& table = byte_table();
    for (auto& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (const char c : p.text) mapped += table.to_char[static_cast<unsigned char>(c)];
      p.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_, use_regex_;
};

enum class PrependScheme { Always, First, Never };

PrependScheme metaspace_scheme(const json& j, const Ctx& ctx, const std::string& what) {
  const auto it = j.find("prepend_scheme");
  if (it != j.end() && !it->is_null()) {
    const std::string s = it->is_string() ? it->get<std::string>() : "";
    if (s == "always") return PrependScheme::Always;
    if (s == "first") return PrependScheme::First;
    if (s == "never") return PrependScheme::Never;
    ctx.fail(what + ": \"prepend_scheme\" must be \"always\", \"first\" or \"never\"");
  }
  // files written before prepend_scheme existed say add_prefix_space
  return get_bool(j, "add_prefix_space", true, ctx, what) ? PrependScheme::Always : PrependScheme::Never;
}

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)),
        scheme_(scheme),
        split_(split),
        literal_(uc::Regex::literal(replacement_)) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (auto& p : pieces) {
      std::string t;
      t.reserve(p.text.size() + replacement_.size());
      for (const char c : p.text) {
        if (c == ' ')
          t += replacement_;
        else
          t += c;
      }
      const bool starts = t.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && p.at_origin)))
        t.insert(0, replacement_);
      p.text.swap(t);
    }
    if (split_)
      split_pieces(
          pieces, [this](std::string_view s) { return literal_.find_all(s); }, Behavior::MergedWithNext, false);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  uc::Regex literal_;
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const Ctx& ctx) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, ctx, "pre_tokenizer");
  const std::string what = "pre_tokenizer " + type;
  if (type == "Sequence") {
    const auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) ctx.fail(what + ": \"pretokenizers\" must be a list");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& p : *it) parts.push_back(make_pre_tokenizer(p, ctx));
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "Split")
    return std::make_unique<SplitPreTokenizer>(get_pattern(j, ctx, what),
                                               parse_behavior(get_string(j, "behavior", ctx, what), ctx),
                                               get_bool(j, "invert", false, ctx, what));
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPreTokenizer>(get_bool(j, "add_prefix_space", true, ctx, what),
                                                   get_bool(j, "use_regex", true, ctx, what));
  if (type == "Metaspace")
    return std::make_unique<MetaspacePreTokenizer>(
        get_char(j, "replacement", ctx, what), metaspace_scheme(j, ctx, what), get_bool(j, "split", true, ctx, what));
  if (type == "Digits") return std::make_unique<DigitsPreTokenizer>(get_bool(j, "individual_digits", false, ctx, what));
  ctx.unsupported("pre_tokenizer", type, "Sequence, Split, ByteLevel, Metaspace, Digits");
}

// ---------------------------------------------------------------------------------------------
// BPE model
// ---------------------------------------------------------------------------------------------

class Bpe {
 public:
  void load(const json& j, const Ctx& ctx);
  void tokenize(const std::string& s, std::vector<int32_t>& out) const;
  std::optional<int32_t> token_to_id(const std::string& t) const {
    const auto it = vocab_.find(t);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* id_to_token(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= by_id_.size() || !has_id_[id]) return nullptr;
    return &by_id_[id];
  }
  int32_t max_id() const { return static_cast<int32_t>(by_id_.size()) - 1; }
  size_t size() const { return vocab_.size(); }  // entries of the vocab (the library's get_vocab_size)
  std::optional<int32_t> unk_id() const { return unk_id_; }

 private:
  struct Merge {
    int32_t rank, new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* merge_of(int32_t a, int32_t b) const {
    const auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> by_id_;
  std::vector<char> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> tokens, -1 where absent
};

void Bpe::load(const json& j, const Ctx& ctx) {
  const std::string what = "model BPE";
  const auto d = j.find("dropout");
  if (d != j.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0.0))
    ctx.fail("unsupported model BPE with dropout (encoding would be random)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = j.find(key);
    if (it != j.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      ctx.fail(std::string("unsupported model BPE with ") + key + " (mgrl supports BPE without it)");
  }
  fuse_unk_ = get_bool(j, "fuse_unk", false, ctx, what);
  byte_fallback_ = get_bool(j, "byte_fallback", false, ctx, what);
  ignore_merges_ = get_bool(j, "ignore_merges", false, ctx, what);

  const auto v = j.find("vocab");
  if (v == j.end() || !v->is_object()) ctx.fail(what + ": \"vocab\" must be an object of token: id");
  vocab_.reserve(v->size());
  for (const auto& [tok, id] : v->items()) {
    const int32_t i = to_id(id, ctx, what + " vocab entry '" + tok + "'");
    vocab_[tok] = i;
    if (static_cast<size_t>(i) >= by_id_.size()) {
      by_id_.resize(i + 1);
      has_id_.resize(i + 1, 0);
    }
    by_id_[i] = tok;
    has_id_[i] = 1;
  }

  const auto m = j.find("merges");
  if (m == j.end() || !m->is_array()) ctx.fail(what + ": \"merges\" must be a list");
  merges_.reserve(m->size());
  int32_t rank = 0;
  for (const auto& e : *m) {
    std::string a, b;
    if (e.is_string()) {  // "a b"
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        ctx.fail(what + ": merge " + std::to_string(rank + 1) + " \"" + s +
                 "\" is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // [a, b]
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      ctx.fail(what + ": merge " + std::to_string(rank + 1) + " is neither \"a b\" nor [a, b]");
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b), inew = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || inew == vocab_.end())
      ctx.fail(what + ": merge " + std::to_string(rank + 1) + " (" + a + " " + b + ") uses a token not in the vocab");
    merges_[pair_key(ia->second, ib->second)] = Merge{rank, inew->second};  // a repeated pair: the last one wins
    ++rank;
  }

  const auto unk = j.find("unk_token");
  if (unk != j.end() && !unk->is_null()) {
    if (!unk->is_string()) ctx.fail(what + ": \"unk_token\" must be a string");
    const auto it = vocab_.find(unk->get<std::string>());
    if (it == vocab_.end()) ctx.fail(what + ": unk_token '" + unk->get<std::string>() + "' is not in the vocab");
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto it = vocab_.find(name);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

void Bpe::tokenize(const std::string& s, std::vector<int32_t>& out) const {
  if (s.empty()) return;
  if (ignore_merges_) {
    const auto it = vocab_.find(s);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int prev, next;
    size_t len;  // bytes; 0 once merged into its left neighbour
  };
  std::vector<Symbol> sym;
  sym.reserve(s.size());
  const auto add = [&sym](int32_t id, size_t len) {
    const int n = static_cast<int>(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, len});
  };
  bool unk_pending = false;  // an unknown stretch waiting to be added (fused when fuse_unk)
  size_t unk_len = 0;
  std::string ch;
  for (size_t i = 0; i < s.size();) {
    const size_t n = std::min(uc::utf8_len(static_cast<unsigned char>(s[i])), s.size() - i);
    ch.assign(s, i, n);
    i += n;
    const auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      if (unk_pending) add(*unk_id_, unk_len);
      unk_pending = false;
      add(it->second, n);
      continue;
    }
    if (byte_fallback_ &&
        std::all_of(ch.begin(), ch.end(), [this](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; })) {
      for (const char c : ch) add(byte_ids_[static_cast<unsigned char>(c)], 1);
      continue;
    }
    if (unk_id_) {
      if (unk_pending && fuse_unk_) {
        unk_len += n;
      } else {
        if (unk_pending) add(*unk_id_, unk_len);
        unk_pending = true;
        unk_len = n;
      }
    }
    // without an unk token the character is dropped, as in Hugging Face
  }
  if (unk_pending) add(*unk_id_, unk_len);

  // Merge the lowest-ranked pair first (the leftmost on ties) until no pair has a merge.
  struct Cand {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand> queue;
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (const Merge* m = merge_of(sym[k].id, sym[k + 1].id)) queue.push({m->rank, static_cast<int>(k), m->new_id});
  while (!queue.empty()) {
    const Cand top = queue.top();
    queue.pop();
    Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int right_pos = cur.next;
    const Symbol right = sym[right_pos];
    const Merge* m = merge_of(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    sym[right_pos].len = 0;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const Merge* pm = merge_of(sym[cur.prev].id, cur.id)) queue.push({pm->rank, cur.prev, pm->new_id});
    if (cur.next >= 0)
      if (const Merge* nm = merge_of(cur.id, sym[cur.next].id)) queue.push({nm->rank, top.pos, nm->new_id});
  }
  for (const auto& x : sym)
    if (x.len != 0) out.push_back(x.id);
}

// ---------------------------------------------------------------------------------------------
// Post-processors (they only act when special tokens are asked for)
// ---------------------------------------------------------------------------------------------

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;
  // The special tokens put in front of a text (for bos_id without tokenizer_config.json).
  virtual std::vector<int32_t> prefix() const = 0;
};

// TemplateProcessing's "single", and Roberta/Bert (cls $A sep) written as one.
class TemplatePostProcessor : public PostProcessor {
 public:
  struct Item {
    bool is_sequence;
    std::vector<int32_t> ids;
  };
  explicit TemplatePostProcessor(std::vector<Item> items) : items_(std::move(items)) {}
  void process(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& it : items_) {
      if (it.is_sequence)
        out.insert(out.end(), ids.begin(), ids.end());
      else
        out.insert(out.end(), it.ids.begin(), it.ids.end());
    }
    ids.swap(out);
  }
  std::vector<int32_t> prefix() const override {
    std::vector<int32_t> p;
    for (const auto& it : items_) {
      if (it.is_sequence) break;
      p.insert(p.end(), it.ids.begin(), it.ids.end());
    }
    return p;
  }

 private:
  std::vector<Item> items_;
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts_) p->process(ids);
  }
  std::vector<int32_t> prefix() const override {
    std::vector<int32_t> p;
    for (auto it = parts_.rbegin(); it != parts_.rend(); ++it) {  // the last one ends up outermost
      const auto q = (*it)->prefix();
      p.insert(p.end(), q.begin(), q.end());
    }
    return p;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

class NoOpPostProcessor : public PostProcessor {  // ByteLevel: offsets only
 public:
  void process(std::vector<int32_t>&) const override {}
  std::vector<int32_t> prefix() const override { return {}; }
};

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const Ctx& ctx) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, ctx, "post_processor");
  const std::string what = "post_processor " + type;
  if (type == "Sequence") {
    const auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) ctx.fail(what + ": \"processors\" must be a list");
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (const auto& p : *it) parts.push_back(make_post_processor(p, ctx));
    return std::make_unique<SequencePostProcessor>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<NoOpPostProcessor>();
  if (type == "TemplateProcessing") {
    const auto single = j.find("single");
    const auto specials = j.find("special_tokens");
    if (single == j.end() || !single->is_array()) ctx.fail(what + ": \"single\" must be a list");
    std::vector<TemplatePostProcessor::Item> items;
    for (const auto& piece : *single) {
      if (piece.contains("Sequence")) {
        const json& seq = piece["Sequence"];
        if (!seq.contains("id") || seq["id"] != "A") ctx.fail(what + ": the single template may only use sequence A");
        items.push_back({true, {}});
      } else if (piece.contains("SpecialToken")) {
        const json& sp = piece["SpecialToken"];
        const std::string name = get_string(sp, "id", ctx, what);
        if (specials == j.end() || !specials->contains(name) || !(*specials)[name].contains("ids") ||
            !(*specials)[name]["ids"].is_array())
          ctx.fail(what + ": special token '" + name + "' has no entry in \"special_tokens\"");
        std::vector<int32_t> ids;
        for (const auto& id : (*specials)[name]["ids"]) ids.push_back(to_id(id, ctx, what));
        items.push_back({false, std::move(ids)});
      } else {
        ctx.fail(what + ": template piece " + piece.dump() + " is neither Sequence nor SpecialToken");
      }
    }
    return std::make_unique<TemplatePostProcessor>(std::move(items));
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const auto id_of = [&](const char* key) {
      const auto it = j.find(key);
      if (it == j.end() || !it->is_array() || it->size() != 2) ctx.fail(what + ": \"" + key + "\" must be [token, id]");
      return to_id((*it)[1], ctx, what);
    };
    return std::make_unique<TemplatePostProcessor>(
        std::vector<TemplatePostProcessor::Item>{{false, {id_of("cls")}}, {true, {}}, {false, {id_of("sep")}}});
  }
  ctx.unsupported("post_processor", type, "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence");
}

// ---------------------------------------------------------------------------------------------
// Decoders: each maps the list of token strings to a new list; the result is their concatenation
// ---------------------------------------------------------------------------------------------

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    const auto& table = byte_table();
    std::string bytes;
    for (const auto& t : tokens) {
      // a token whose characters all map to bytes gives those bytes; any other (an added token such
      // as "<|im_end|>" with a space in it) is taken as it is
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        const auto it = table.to_byte.find(uc::utf8_next(t, i));
        if (it == table.to_byte.end())
          all = false;
        else
          mapped += static_cast<char>(it->second);
      }
      bytes += all ? mapped : t;
    }
    tokens.assign(1, uc::utf8_lossy(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(uc::Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = replace_all(t, pattern_, content_);
  }

 private:
  uc::Regex pattern_;
  std::string content_;
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;  // bytes of consecutive <0xNN> tokens
    const auto flush = [&] {
      if (pending.empty()) return;
      if (uc::utf8_invalid_at(pending) == std::string::npos) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (auto& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
        if (hi >= 0 && lo >= 0)
          byte = hi * 16 + lo;
        else if (t[3] == '+' && lo >= 0)  // Rust's from_str_radix takes a leading '+'
          byte = lo;
      }
      if (byte >= 0) {
        pending += static_cast<char>(byte);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<Span> chars;  // byte span of each character
      for (size_t i = 0; i < t.size();) {
        const size_t b = i;
        uc::utf8_next(t, i);
        chars.emplace_back(b, i);
      }
      const auto is_content = [&](size_t k) {
        return t.compare(chars[k].first, chars[k].second - chars[k].first, content_) == 0;
      };
      size_t first = 0;
      while (first < std::min(start_, chars.size()) && is_content(first)) ++first;
      size_t last = chars.size();
      for (size_t k = 0; k < stop_ && last > first && is_content(last - 1); ++k) --last;
      if (first >= last)
        t.clear();
      else
        t = t.substr(chars[first].first, chars[last - 1].second - chars[first].first);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      // in the first token the replacement is dropped (it was the prepended space), elsewhere a space
      const std::string with = (i == 0 && scheme_ != PrependScheme::Never) ? "" : " ";
      std::string out;
      const std::string& t = tokens[i];
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, replacement_.size(), replacement_) == 0) {
          out += with;
          p += replacement_.size();
        } else {
          out += t[p++];
        }
      }
      tokens[i].swap(out);
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

std::unique_ptr<Decoder> make_decoder(const json& j, const Ctx& ctx) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, ctx, "decoder");
  const std::string what = "decoder " + type;
  if (type == "Sequence") {
    const auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) ctx.fail(what + ": \"decoders\" must be a list");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& p : *it) parts.push_back(make_decoder(p, ctx));
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace")
    return std::make_unique<ReplaceDecoder>(get_pattern(j, ctx, what), get_string(j, "content", ctx, what));
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const int64_t start = get_int(j, "start", ctx, what), stop = get_int(j, "stop", ctx, what);
    if (start < 0 || stop < 0) ctx.fail(what + ": \"start\" and \"stop\" must not be negative");
    return std::make_unique<StripDecoder>(get_char(j, "content", ctx, what), static_cast<size_t>(start),
                                          static_cast<size_t>(stop));
  }
  if (type == "Metaspace")
    return std::make_unique<MetaspaceDecoder>(get_char(j, "replacement", ctx, what), metaspace_scheme(j, ctx, what));
  ctx.unsupported("decoder", type, "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence");
}

// ---------------------------------------------------------------------------------------------
// Added tokens: found in the text before the model runs
// ---------------------------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id;
  bool single_word, lstrip, rstrip, normalized, special;
  // What decoding (and id_to_token) gives: the normalized content for a normalized token whose content
  // the normalizer changes (so that the decoder can undo it), else the content. As in tokenizers >= 0.22.
  std::string decode_form;
};

// Leftmost-longest, non-overlapping matching of a set of strings (as aho-corasick's LeftmostLongest).
class TokenTrie {
 public:
  struct Match {
    size_t begin, end, index;
  };
  void add(const std::string& s, size_t index) {
    if (s.empty()) return;
    int node = 0;
    for (const char c : s) {
      const auto uc = static_cast<unsigned char>(c);
      int next = -1;
      for (const auto& [byte, child] : nodes_[node].children)
        if (byte == uc) next = child;
      if (next < 0) {
        next = static_cast<int>(nodes_.size());
        nodes_[node].children.emplace_back(uc, next);
        nodes_.emplace_back();
      }
      node = next;
    }
    nodes_[node].index = static_cast<long>(index);
    first_[static_cast<unsigned char>(s[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  std::optional<Match> find(std::string_view s, size_t from) const {
    for (size_t b = from; b < s.size(); ++b) {
      if (!first_[static_cast<unsigned char>(s[b])]) continue;
      int node = 0;
      std::optional<Match> best;
      for (size_t k = b; k < s.size(); ++k) {
        int next = -1;
        for (const auto& [byte, child] : nodes_[node].children)
          if (byte == static_cast<unsigned char>(s[k])) next = child;
        if (next < 0) break;
        node = next;
        if (nodes_[node].index >= 0) best = Match{b, k + 1, static_cast<size_t>(nodes_[node].index)};
      }
      if (best) return best;
    }
    return std::nullopt;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> children;
    long index = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
  bool empty_ = true;
};

// Byte offset where the run of white space that ends s begins.
size_t white_space_run_start(std::string_view s) {
  size_t start = s.size();
  while (start > 0) {
    size_t b = start - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    size_t i = b;
    if (!uc::is_white_space(uc::utf8_next(s, i))) break;
    start = b;
  }
  return start;
}

// Bytes of the run of white space that starts s.
size_t white_space_run_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t k = i;
    if (!uc::is_white_space(uc::utf8_next(s, k))) break;
    i = k;
  }
  return i;
}

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t b = s.size() - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return uc::is_word_char(uc::utf8_next(s, b));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return uc::is_word_char(uc::utf8_next(s, i));
}

// A stretch of text on its way through the pipeline; id >= 0 once an added token was found there.
struct Split {
  std::string text;
  bool at_origin;
  int32_t id;
};

std::optional<std::string> config_token(const json& cfg, const char* key, const std::string& path) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  throw UserError(path + ": \"" + key + "\" must be a string or an object with \"content\"");
}

std::string python_strip(const std::string& s) {
  size_t b = 0;
  while (b < s.size()) {
    size_t i = b;
    if (!uc::is_python_space(uc::utf8_next(s, i))) break;
    b = i;
  }
  size_t e = s.size();
  while (e > b) {
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!uc::is_python_space(uc::utf8_next(s, i))) break;
    e = start;
  }
  return s.substr(b, e - b);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string path;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  Bpe model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;

  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_set<std::string> special_contents;
  TokenTrie raw_trie, normalized_trie;  // tokens matched in the input / in the normalized text

  std::optional<int32_t> bos, eos, pad;
  std::vector<std::pair<std::string, std::string>> special_strings;  // bos_token, eos_token, ... as written
  std::string chat_template, chat_template_origin;
  bool byte_level = false;  // model tokens are byte-level strings (a ByteLevel pre-tokenizer or decoder)
  // A ByteLevel or RobertaProcessing post-processor with trim_offsets (the tokenizers library's default): a token's
  // offsets leave out its leading and trailing spaces (Ġ), except the one add_prefix_space put before the first.
  bool trim_offsets = false, trim_prefix_space = false;
  int32_t vocab_size = 0;

  void load(const std::string& json_path);
  void load_config(const std::string& dir);
  std::vector<Split> extract(std::vector<Split> splits, const TokenTrie& trie, bool normalize) const;
  std::optional<int32_t> lookup(const std::string& token) const {
    const auto it = added_by_content.find(token);
    if (it != added_by_content.end()) return it->second;
    return model.token_to_id(token);
  }
  const std::string* token_of(int32_t id) const {
    const auto it = added_by_id.find(id);
    if (it != added_by_id.end()) return &added[it->second].decode_form;
    return model.id_to_token(id);
  }
};

void Tokenizer::Impl::load(const std::string& json_path) {
  path = json_path;
  const Ctx ctx{json_path};
  const json j = read_json(json_path);
  if (!j.is_object()) ctx.fail("not a tokenizer.json (the top level is not a JSON object)");
  if (!j.contains("model")) ctx.fail("not a tokenizer.json (no \"model\")");

  const json& m = j["model"];
  std::string model_type;
  if (m.is_object() && m.contains("type") && m["type"].is_string())
    model_type = m["type"].get<std::string>();
  else if (m.is_object() && m.contains("merges"))
    model_type = "BPE";  // old files leave the type out
  else
    ctx.fail("model has no \"type\"");
  if (model_type != "BPE") ctx.unsupported("model type", model_type, "BPE");
  model.load(m, ctx);

  const std::function<bool(const json&)> has_byte_level = [&](const json& x) {
    if (x.is_object()) {
      if (x.value("type", json()) == "ByteLevel") return true;
      for (const auto& kv : x.items())
        if (has_byte_level(kv.value())) return true;
    } else if (x.is_array()) {
      for (const auto& y : x)
        if (has_byte_level(y)) return true;
    }
    return false;
  };
  byte_level = has_byte_level(j.value("pre_tokenizer", json())) || has_byte_level(j.value("decoder", json()));
  normalizer = make_normalizer(j.value("normalizer", json()), ctx);
  pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", json()), ctx);
  post_processor = make_post_processor(j.value("post_processor", json()), ctx);
  {
    const std::function<void(const json&)> scan = [&](const json& pp) {
      if (!pp.is_object()) return;
      const std::string type = pp.value("type", std::string());
      if (type == "Sequence" && pp.contains("processors") && pp["processors"].is_array())
        for (const auto& part : pp["processors"]) scan(part);
      if ((type == "ByteLevel" || type == "RobertaProcessing") && pp.value("trim_offsets", true)) {
        trim_offsets = true;
        trim_prefix_space = pp.value("add_prefix_space", true);
      }
    };
    scan(j.value("post_processor", json()));
  }
  decoder = make_decoder(j.value("decoder", json()), ctx);

  // Ids as the tokenizers library gives them when it reads the file (it warns when they differ from the file's): a
  // content the model's vocab has keeps the vocab's id; the others get the ids after the vocab's entries, in the
  // order of the list. A content listed twice keeps its first id and takes the later properties.
  vocab_size = model.max_id() + 1;
  auto next_id = static_cast<int32_t>(model.size());
  const json at = j.value("added_tokens", json::array());
  if (!at.is_array()) ctx.fail("\"added_tokens\" must be a list");
  for (const auto& t : at) {
    const std::string what = "added token " + t.dump();
    AddedToken a{get_string(t, "content", ctx, what),          to_id(t.value("id", json()), ctx, what),
                 get_bool(t, "single_word", false, ctx, what), get_bool(t, "lstrip", false, ctx, what),
                 get_bool(t, "rstrip", false, ctx, what),      get_bool(t, "normalized", true, ctx, what),
                 get_bool(t, "special", false, ctx, what),     ""};
    if (a.content.empty()) continue;
    a.decode_form = a.normalized && normalizer ? normalizer->normalize(a.content) : a.content;
    if (a.special) special_contents.insert(a.content);
    const auto known = added_by_content.find(a.content);
    if (known != added_by_content.end()) {
      a.id = known->second;
      added[added_by_id.at(a.id)] = std::move(a);
      continue;
    }
    const auto in_vocab = model.token_to_id(a.content);
    a.id = in_vocab ? *in_vocab : next_id++;
    added_by_content[a.content] = a.id;
    added_by_id[a.id] = added.size();
    vocab_size = std::max(vocab_size, a.id + 1);
    added.push_back(std::move(a));
  }
  // special tokens first, then the others (the order of the library; only ties could tell)
  for (const bool special : {true, false}) {
    for (size_t k = 0; k < added.size(); ++k) {
      const AddedToken& a = added[k];
      if (a.special != special) continue;
      if (a.normalized)
        normalized_trie.add(a.decode_form, k);
      else
        raw_trie.add(a.content, k);
    }
  }
}

void Tokenizer::Impl::load_config(const std::string& dir) {
  const std::string cfg_path = dir + "/tokenizer_config.json";
  const bool have_cfg = file_exists(cfg_path);
  json cfg = json::object();
  if (have_cfg) {
    cfg = read_json(cfg_path);
    if (!cfg.is_object()) throw UserError(cfg_path + ": the top level is not a JSON object");
  }
  const auto id_of = [&](const char* key) -> std::optional<int32_t> {
    const auto tok = config_token(cfg, key, cfg_path);
    if (!tok) return std::nullopt;
    const auto id = lookup(*tok);
    if (!id) throw UserError(cfg_path + ": " + key + " '" + *tok + "' is not a token of " + path);
    return id;
  };
  // transformers passes these to chat templates as variables (its special_tokens_map)
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
    if (const auto t = config_token(cfg, key, cfg_path)) special_strings.emplace_back(key, *t);
  if (have_cfg) {
    bos = id_of("bos_token");
    eos = id_of("eos_token");
    pad = id_of("pad_token");
  } else if (post_processor) {
    const auto p = post_processor->prefix();
    if (!p.empty()) bos = p.front();
  }

  const auto ct = cfg.find("chat_template");
  if (ct != cfg.end() && ct->is_string()) {
    chat_template = ct->get<std::string>();
    chat_template_origin = cfg_path + " (chat_template)";
  } else if (ct != cfg.end() && ct->is_array()) {  // [{"name": "default", "template": ...}, ...]
    for (const auto& t : *ct)
      if (t.is_object() && t.contains("name") && t["name"].is_string() && t["name"].get<std::string>() == "default" &&
          t.contains("template") && t["template"].is_string()) {
        chat_template = t["template"].get<std::string>();
        chat_template_origin = cfg_path + " (chat_template \"default\")";
      }
  } else if (ct != cfg.end() && !ct->is_null()) {
    // A number, object or boolean read as "no chat template" until 2026-11-28: every chat line then failed naming the
    // data, not this file.
    throw UserError(cfg_path + ": \"chat_template\" must be a string or a list of {\"name\", \"template\"} objects, "
                    "not " + std::string(ct->type_name()));
  }
  // transformers: "If independent chat template file(s) exist, they take priority over template entries in the
  // tokenizer config" (until 2026-11-29 the tokenizer_config.json entry won here).
  if (file_exists(dir + "/chat_template.jinja")) {
    chat_template = read_text(dir + "/chat_template.jinja");
    chat_template_origin = dir + "/chat_template.jinja";
  }
}

// Splits every piece without a token at the added tokens of trie (normalizing it first when asked).
std::vector<Split> Tokenizer::Impl::extract(std::vector<Split> splits, const TokenTrie& trie, bool normalize) const {
  std::vector<Split> out;
  out.reserve(splits.size());
  for (auto& sp : splits) {
    if (sp.id >= 0) {
      out.push_back(std::move(sp));
      continue;
    }
    bool at_origin = sp.at_origin;
    const std::string s =
        normalize && normalizer ? normalizer->normalize_at(std::move(sp.text), &at_origin) : std::move(sp.text);
    const auto push = [&](size_t b, size_t e, int32_t id) {
      if (e > b) out.push_back({s.substr(b, e - b), at_origin && b == 0, id});
    };
    size_t start_offset = 0, from = 0;
    while (!trie.empty()) {
      const auto m = trie.find(s, from);
      if (!m) break;
      from = m->end;
      const AddedToken& tok = added[m->index];
      size_t start = m->begin, stop = m->end;
      if (tok.single_word) {
        const bool start_space = start == 0 || !ends_with_word(std::string_view(s).substr(0, start));
        const bool stop_space = stop == s.size() || !starts_with_word(std::string_view(s).substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (tok.lstrip) start = std::max(white_space_run_start(std::string_view(s).substr(0, start)), start_offset);
      if (tok.rstrip) stop += white_space_run_len(std::string_view(s).substr(stop));
      if (start_offset < start) push(start_offset, start, -1);
      push(start, stop, tok.id);
      start_offset = stop;
    }
    if (start_offset < s.size()) push(start_offset, s.size(), -1);
  }
  return out;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->load(path);
  const size_t slash = path.find_last_of('/');
  impl->load_config(slash == std::string::npos ? "." : path.substr(0, slash));
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  if (!file_exists(path)) {
    if (file_exists(dir + "/tokenizer.model"))
      throw UserError(dir +
                      ": no tokenizer.json, only tokenizer.model (SentencePiece files are not supported; "
                      "convert with transformers: AutoTokenizer.from_pretrained(dir).save_pretrained(dir))");
    throw UserError(dir + ": no tokenizer.json");
  }
  return from_file(path);
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  const size_t bad = uc::utf8_invalid_at(text);
  if (bad != std::string::npos) throw UserError("text to encode is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  std::vector<Split> splits;
  if (!text.empty()) splits.push_back({text, true, -1});
  splits = im.extract(std::move(splits), im.raw_trie, false);
  splits = im.extract(std::move(splits), im.normalized_trie, true);

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<Piece> pieces;
  for (auto& sp : splits) {
    if (sp.id >= 0) {
      ids.push_back(sp.id);
      continue;
    }
    pieces.assign(1, Piece{std::move(sp.text), sp.at_origin});
    if (im.pre_tokenizer) im.pre_tokenizer->apply(pieces);
    for (const auto& p : pieces) im.model.tokenize(p.text, ids);
  }
  if (add_special_tokens && im.post_processor) im.post_processor->process(ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const std::string* t = im.token_of(id);
    if (t == nullptr) continue;
    if (skip_special_tokens && im.special_contents.count(*t)) continue;
    tokens.push_back(*t);
  }
  std::string out;
  if (im.decoder) {
    im.decoder->decode_chain(tokens);
    for (const auto& t : tokens) out += t;
  } else {
    for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode_chat(const std::vector<Message>& messages, ChatFormat fmt,
                                            bool add_generation_prompt) const {
  return encode(apply_chat(messages, fmt, add_generation_prompt), fmt == ChatFormat::None);
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }
int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::token_to_id(const std::string& token) const { return impl_->lookup(token); }
std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* t = impl_->token_of(id);
  if (t == nullptr) return std::nullopt;
  return *t;
}
bool Tokenizer::is_special(int32_t id) const {
  const auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::string& Tokenizer::chat_template_origin() const { return impl_->chat_template_origin; }
const std::vector<std::pair<std::string, std::string>>& Tokenizer::special_token_strings() const {
  return impl_->special_strings;
}

std::vector<std::pair<size_t, size_t>> Tokenizer::token_offsets(const std::vector<int32_t>& ids,
                                                                const std::string& text) const {
  const Impl& im = *impl_;
  const auto& table = byte_table();
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(ids.size());
  size_t p = 0;
  const auto fail = [&](size_t k) {
    throw UserError(im.path + ": cannot map token " + std::to_string(k) + " (id " + std::to_string(ids[k]) +
                    ") back to the text at byte " + std::to_string(p) +
                    " (the tokenizer's normalizer changes this text), so its assistant mask is unknown");
  };
  // the surface of token k ("" for one that has none)
  const auto surface_of = [&](size_t k, bool* added) {
    std::string surface;
    const auto a = im.added_by_id.find(ids[k]);
    if (a != im.added_by_id.end()) {
      surface = im.added[a->second].content;
      *added = true;
    } else if (const std::string* t = im.model.id_to_token(ids[k])) {
      const std::string& s = *t;
      int byte = -1;
      if (s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' && hex_digit(s[3]) >= 0 && hex_digit(s[4]) >= 0)
        byte = hex_digit(s[3]) * 16 + hex_digit(s[4]);
      if (byte >= 0) {
        surface.assign(1, static_cast<char>(byte));
      } else if (im.byte_level) {
        bool all = true;
        for (size_t i = 0; i < s.size() && all;) {
          const auto it = table.to_byte.find(uc::utf8_next(s, i));
          if (it == table.to_byte.end()) all = false;
          else surface += static_cast<char>(it->second);
        }
        if (!all) surface = s;
      } else {
        for (size_t i = 0; i < s.size();) {  // SentencePiece's word-boundary mark is a space
          if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
            surface += ' ';
            i += 3;
          } else {
            surface += s[i++];
          }
        }
      }
    }
    return surface;
  };
  for (size_t k = 0; k < ids.size(); ++k) {
    bool added = false;
    const std::string surface = surface_of(k, &added);
    if (ids[k] == im.model.unk_id() && text.compare(p, surface.size(), surface) != 0) {
      // the unknown token stands for one character, or (fuse_unk) a run of them: up to where the next token's
      // surface matches
      size_t q = p < text.size() ? p + std::max<size_t>(1, uc::utf8_len(static_cast<unsigned char>(text[p]))) : p;
      if (k + 1 < ids.size() && ids[k + 1] == im.model.unk_id()) {
        // unknown tokens one after the other (no fuse_unk): one character each
      } else if (k + 1 < ids.size()) {
        bool next_added = false;
        const std::string next = surface_of(k + 1, &next_added);
        while (q < text.size() && !next.empty() && text.compare(q, next.size(), next) != 0 &&
               !(next[0] == ' ' && text.compare(q, next.size() - 1, next, 1) == 0))
          q += std::max<size_t>(1, uc::utf8_len(static_cast<unsigned char>(text[q])));
      } else {
        q = text.size();
      }
      q = std::min(q, text.size());
      out.emplace_back(p, q);
      p = q;
      continue;
    }
    if (text.compare(p, surface.size(), surface) == 0) {
      out.emplace_back(p, p + surface.size());
      p += surface.size();
      continue;
    }
    // a space the normalizer or pre-tokenizer prepended (SentencePiece layouts) is not in the text
    if (!surface.empty() && surface[0] == ' ' && text.compare(p, surface.size() - 1, surface, 1) == 0) {
      out.emplace_back(p, p + surface.size() - 1);
      p += surface.size() - 1;
      continue;
    }
    // whitespace an added token strips (lstrip/rstrip) belongs to it
    size_t q = p;
    while (q < text.size() && uc::is_white_space(static_cast<unsigned char>(text[q]))) ++q;
    if (q > p && !surface.empty() && text.compare(q, surface.size(), surface) == 0) {
      if (added) {
        out.emplace_back(p, q + surface.size());
      } else {
        if (!out.empty()) out.back().second = q;
        out.emplace_back(q, q + surface.size());
      }
      p = q + surface.size();
      continue;
    }
    fail(k);
  }
  // trim_offsets (tokenizers' ByteLevel::process_offsets): the spaces a byte-level token begins or ends with are not
  // part of its offsets, so a token " <" next to an assistant span's end does not overlap it (transformers' mask).
  if (im.trim_offsets && im.byte_level) {
    static const std::string kSpace = "\xC4\xA0";  // Ġ, the byte-level form of ' '
    for (size_t k = 0; k < ids.size(); ++k) {
      if (im.added_by_id.count(ids[k])) continue;
      const std::string* t = im.model.id_to_token(ids[k]);
      if (!t) continue;
      size_t lead = 0, trail = 0;
      while ((lead + 1) * 2 <= t->size() && t->compare(lead * 2, 2, kSpace) == 0) ++lead;
      while ((trail + 1) * 2 <= t->size() && t->compare(t->size() - (trail + 1) * 2, 2, kSpace) == 0) ++trail;
      auto& [b, e] = out[k];
      if (lead > 0 && !((k == 0 || b == 0) && im.trim_prefix_space && lead == 1)) b = std::min(b + lead, e);
      if (trail > 0 && e >= trail) e = std::max(e - trail, b);
    }
  }
  return out;
}
const std::string& Tokenizer::path() const { return impl_->path; }

// ---------------------------------------------------------------------------------------------
// Chat formats
// ---------------------------------------------------------------------------------------------

ChatFormat chat_format_from_name(const std::string& name) {
  if (name == "none") return ChatFormat::None;
  if (name == "chatml") return ChatFormat::ChatML;
  if (name == "llama3") return ChatFormat::Llama3;
  throw UserError("unknown chat format '" + name + "' (one of none, chatml, llama3)");
}

const char* chat_format_name(ChatFormat fmt) {
  switch (fmt) {
    case ChatFormat::None:
      return "none";
    case ChatFormat::ChatML:
      return "chatml";
    case ChatFormat::Llama3:
      return "llama3";
  }
  return "?";
}

std::string builtin_chat_template(ChatFormat fmt) {
  switch (fmt) {
    case ChatFormat::None:
      return "";
    case ChatFormat::ChatML:
      return "{%- for message in messages %}\n"
             "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
             "{%- endfor %}\n"
             "{%- if add_generation_prompt %}\n"
             "{{- '<|im_start|>assistant\\n' }}\n"
             "{%- endif %}\n";
    case ChatFormat::Llama3:
      return "{%- if messages | length > 0 %}{{- '<|begin_of_text|>' }}{%- endif %}\n"
             "{%- for message in messages %}\n"
             "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
             "'<|eot_id|>' }}\n"
             "{%- endfor %}\n"
             "{%- if add_generation_prompt %}\n"
             "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
             "{%- endif %}\n";
  }
  return "";
}

std::string apply_chat(const std::vector<Message>& messages, ChatFormat fmt, bool add_generation_prompt) {
  std::string out;
  switch (fmt) {
    case ChatFormat::None:
      for (const auto& m : messages) out += m.content;
      break;
    case ChatFormat::ChatML:
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::Llama3:
      if (!messages.empty()) out += "<|begin_of_text|>";
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + python_strip(m.content) + "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
  }
  return out;
}

}  // namespace mgrl::io
