// unicode.h: UTF-8 helpers, Unicode normalization forms (utf8proc), character classes and a PCRE2
// regex that reads tokenizer.json patterns (Oniguruma syntax) the way the Hugging Face library does.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mgrl::io::unicode {

// Length of the UTF-8 sequence that starts with byte b (1 for bytes that cannot start one).
size_t utf8_len(unsigned char b);
// Byte offset of the first invalid UTF-8 sequence in s, or std::string_view::npos when s is valid.
size_t utf8_invalid_at(std::string_view s);
// The code point at s[i] (s valid UTF-8); advances i past it.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t cp);
// Bytes to text as Rust's String::from_utf8_lossy does: every maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
// s (valid UTF-8) in the given normalization form.
std::string normalize(std::string_view s, NormalForm form);

bool is_white_space(char32_t c);   // Unicode White_Space (Rust char::is_whitespace, regex-crate \s)
bool is_python_space(char32_t c);  // Python str.isspace (what Jinja's `trim` strips)
bool is_numeric(char32_t c);       // general category Nd, Nl or No (Rust char::is_numeric)
bool is_word_char(char32_t c);     // regex-crate \w: Alphabetic, M, Nd, Pc, Join_Control

// A compiled regular expression (PCRE2, UTF + UCP). Patterns are read as Oniguruma (Ruby syntax) reads them in
// the Hugging Face tokenizers library: its \s, \w, \h, \b, POSIX brackets, script properties (Script, not
// Script_Extensions), line anchors, (?m), nested classes and class intersections (&&) are translated
// (unicode.cpp); tests/data/tokenizers/regex_onig.json holds the library's own matches. Thread-safe.
class Regex {
 public:
  // Throws std::invalid_argument with PCRE2's message and the offset when the pattern is bad.
  explicit Regex(const std::string& pattern);
  // A regex matching s literally.
  static Regex literal(const std::string& s);

  // Non-overlapping matches [begin, end) from left to right; after an empty match the search
  // moves on by one character. s must be valid UTF-8.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;
  const std::string& pattern() const { return pattern_; }

  struct Code;  // the compiled PCRE2 code (opaque)

 private:
  std::string pattern_;
  std::shared_ptr<const Code> code_;
};

}  // namespace mgrl::io::unicode
