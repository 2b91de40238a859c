// unicode.cpp: UTF-8 helpers, normalization forms (utf8proc), character classes, PCRE2 regex.
#include "io/unicode.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>

#include "core/error.h"

namespace mgrl::io::unicode {

size_t utf8_len(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 1;
}

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when invalid; *valid_prefix receives how many bytes
// form the maximal valid prefix of an invalid sequence (at least 1).
size_t utf8_seq_at(std::string_view s, size_t i, size_t* valid_prefix) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *valid_prefix = 1;
  if (b0 < 0x80) return 1;
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 2;
  } else if (b0 == 0xED) {
    need = 2, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else if (b0 == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return 0;
    *valid_prefix = k + 1;
  }
  return need + 1;
}

}  // namespace

size_t utf8_invalid_at(std::string_view s) {
  size_t i = 0, prefix = 0;
  while (i < s.size()) {
    const size_t n = utf8_seq_at(s, i, &prefix);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

char32_t utf8_next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const size_t n = utf8_len(b0);
  char32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0, prefix = 0;
  while (i < bytes.size()) {
    const size_t n = utf8_seq_at(bytes, i, &prefix);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal valid prefix (or the single bad byte)
      i += prefix;
    }
  }
  return out;
}

std::string normalize(std::string_view s, NormalForm form) {
  if (s.empty()) return {};
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::NFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::NFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::NFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::NFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &dst,
                   static_cast<utf8proc_option_t>(options));
  if (n < 0) throw UserError(std::string("Unicode normalization failed: ") + utf8proc_errmsg(n));
  std::string out(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_python_space(char32_t c) { return is_white_space(c) || (c >= 0x1C && c <= 0x1F); }

bool is_numeric(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

// ---- Regex ----

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// ---- Oniguruma (Ruby syntax, as the tokenizers library compiles tokenizer.json patterns) to PCRE2 ----
//
// PCRE2 (UTF + UCP) reads most of Oniguruma's syntax alike. What differs, and is rewritten here:
//   \s \w \h \b \B  Oniguruma's Unicode classes (\s = White_Space; \w = Alphabetic, M, Nd, Pc; \h = hex digit; \b
//                   at changes of that \w), as explicit classes and lookarounds;
//   ^ $             always at line starts and ends (Ruby): (?m:^) (?m:$);
//   (?m) (?-m)      Ruby's m is "dot matches newline": PCRE2's s;
//   \p{Script}      Oniguruma's script property is Script, PCRE2's is Script_Extensions: \p{sc:Script};
//   \uHHHH          \x{HHHH};
//   classes         nested classes [a[bc]], intersections [a-z&&[^aeiou]], negated shorthands in classes [^\S\n]
//                   and POSIX brackets [[:alpha:]] (Oniguruma's Unicode definitions).
// Classes PCRE2 can hold as they are become one PCRE2 class; the others become lookahead groups that match one
// character: A && B -> (?:(?=A)B), a negated set X -> (?:(?!X)(?s:.)).

// Unicode White_Space, as a PCRE2 class body.
constexpr const char* kSpaceClass =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
// Oniguruma's word characters; outside a class its \w (and \p{Word}) also has six Latin-1 number forms (\W leaves
// them out: their complement), inside a class not.
constexpr const char* kWordClass = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
constexpr const char* kWordEscapeExtra = "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
constexpr const char* kHexClass = "0-9A-Fa-f";

bool is_script_name(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, bool> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(name);
  if (it != known.end()) return it->second;
  const std::string probe = "\\p{sc:" + name + "}";
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(probe.data()), probe.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &off, nullptr);
  pcre2_code_free(code);
  return known[name] = code != nullptr;
}

// One set expression of a bracket class: the intersection of operands, each a union of plain PCRE2 class text
// and nested sets; the whole possibly negated.
struct ClassSet {
  struct Union {
    std::string plain;            // PCRE2 class body text (ranges, escapes, properties)
    std::vector<ClassSet> nested;  // nested sets, negated ones included
  };
  bool negated = false;
  std::vector<Union> operands;  // intersected (one when there is no &&)
};

class OnigTranslator {
 public:
  explicit OnigTranslator(const std::string& p) : p_(p) {}

  std::string run() {
    std::string out;
    while (i_ < p_.size()) {
      const char c = p_[i_];
      if (c == '\\' && i_ + 1 < p_.size()) {
        out += escape_outside();
      } else if (c == '[') {
        ++i_;
        out += emit(parse_class());
      } else if (c == '^') {
        ++i_;
        out += "(?m:^)";
      } else if (c == '$') {
        ++i_;
        out += "(?m:$)";
      } else if (c == '(' && i_ + 1 < p_.size() && p_[i_ + 1] == '?') {
        out += option_group();
      } else {
        out += c;
        ++i_;
      }
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(what + " at offset " + std::to_string(i_));
  }

  // \p{Name}, \P{Name}, \p{^Name} at i_ (the backslash): the PCRE2 form; *negate receives whether it is negated.
  std::string property(bool in_class) {
    const bool upper = p_[i_ + 1] == 'P';
    i_ += 2;
    if (i_ >= p_.size() || p_[i_] != '{') return upper ? "\\P" : "\\p";  // PCRE2 reports the error
    const size_t close = p_.find('}', i_);
    if (close == std::string::npos) fail("unterminated \\p{");
    std::string name = p_.substr(i_ + 1, close - i_ - 1);
    i_ = close + 1;
    bool negate = upper;
    if (!name.empty() && name[0] == '^') {
      negate = !negate;
      name.erase(0, 1);
    }
    std::string lower;
    for (const char ch : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    std::string body;
    if (lower == "word") {
      body = std::string(kWordClass) + (in_class ? "" : kWordEscapeExtra);
      return negate ? "[^" + body + "]" : "[" + body + "]";
    }
    if (lower == "alpha") name = "Alphabetic";
    const std::string pcre_name = is_script_name(name) ? "sc:" + name : name;
    return std::string(negate ? "\\P{" : "\\p{") + pcre_name + "}";
  }

  // \uHHHH at i_: \x{HHHH}
  std::string unicode_escape() {
    if (i_ + 6 > p_.size()) fail("\\u needs four hex digits");
    const std::string hex = p_.substr(i_ + 2, 4);
    for (const char ch : hex)
      if (!std::isxdigit(static_cast<unsigned char>(ch))) fail("\\u needs four hex digits");
    i_ += 6;
    return "\\x{" + hex + "}";
  }

  std::string escape_outside() {
    const char e = p_[i_ + 1];
    const std::string word = std::string(kWordClass) + kWordEscapeExtra;
    switch (e) {
      case 's':
      case 'S':
        i_ += 2;
        return std::string(e == 's' ? "[" : "[^") + kSpaceClass + "]";
      case 'w':
      case 'W':
        i_ += 2;
        return std::string(e == 'w' ? "[" : "[^") + word + "]";
      case 'h':
      case 'H':
        i_ += 2;
        return std::string(e == 'h' ? "[" : "[^") + kHexClass + "]";
      case 'b':
      case 'B': {
        i_ += 2;
        const std::string w = "[" + word + "]";
        return e == 'b' ? "(?:(?<=" + w + ")(?!" + w + ")|(?<!" + w + ")(?=" + w + "))"
                        : "(?:(?<=" + w + ")(?=" + w + ")|(?<!" + w + ")(?!" + w + "))";
      }
      case 'p':
      case 'P':
        return property(false);
      case 'u':
        return unicode_escape();
      default:
        i_ += 2;
        return std::string{'\\', e};
    }
  }

  // (?imx-imx) or (?imx-imx: at i_: Ruby's m becomes PCRE2's s; other groups are copied.
  std::string option_group() {
    size_t k = i_ + 2;
    std::string flags;
    while (k < p_.size() && (p_[k] == 'i' || p_[k] == 'm' || p_[k] == 'x' || p_[k] == '-')) flags += p_[k++];
    if (flags.empty() || k >= p_.size() || (p_[k] != ')' && p_[k] != ':')) {
      i_ += 2;
      return "(?";
    }
    for (char& f : flags)
      if (f == 'm') f = 's';
    const std::string out = "(?" + flags + p_[k];
    i_ = k + 1;
    return out;
  }

  // A bracket class; i_ is just past its '['. Leaves i_ past the closing ']'.
  ClassSet parse_class() {
    ClassSet set;
    set.operands.emplace_back();
    if (i_ < p_.size() && p_[i_] == '^') {
      set.negated = true;
      ++i_;
    }
    bool first = true;
    for (;;) {
      if (i_ >= p_.size()) fail("unterminated character class");
      const char c = p_[i_];
      ClassSet::Union& u = set.operands.back();
      if (c == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      if (c == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        posix_bracket(u);
      } else if (c == '[') {
        ++i_;
        u.nested.push_back(parse_class());
      } else if (c == '&' && i_ + 1 < p_.size() && p_[i_ + 1] == '&') {
        i_ += 2;
        set.operands.emplace_back();
      } else if (c == '\\' && i_ + 1 < p_.size()) {
        escape_in_class(u);
      } else {
        if (c == ']') u.plain += '\\';  // a literal ']' first in the class: escaped, as it may be merged into another
        u.plain += c;
        ++i_;
      }
    }
    return set;
  }

  static ClassSet negated_plain(const std::string& body) {
    ClassSet s;
    s.negated = true;
    s.operands.emplace_back();
    s.operands.back().plain = body;
    return s;
  }

  void escape_in_class(ClassSet::Union& u) {
    const char e = p_[i_ + 1];
    switch (e) {
      case 's':
      case 'w':
      case 'h':
      case 'S':
      case 'W':
      case 'H': {  // the class's body; the upper-case one as a negated nested set
        const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(e)));
        const char* body = lower == 's' ? kSpaceClass : lower == 'w' ? kWordClass : kHexClass;
        if (e == lower)
          u.plain += body;
        else
          u.nested.push_back(negated_plain(body));
        i_ += 2;
        return;
      }
      case 'p':
      case 'P': {
        const std::string prop = property(true);
        if (prop[0] == '[') {  // \p{Word}: a class of its own
          const bool neg = prop[1] == '^';
          ClassSet s;
          s.negated = neg;
          s.operands.emplace_back();
          s.operands.back().plain = prop.substr(neg ? 2 : 1, prop.size() - (neg ? 3 : 2));
          u.nested.push_back(std::move(s));
        } else {
          u.plain += prop;
        }
        return;
      }
      case 'u':
        u.plain += unicode_escape();
        return;
      default:
        u.plain += '\\';
        u.plain += e;
        i_ += 2;
        return;
    }
  }

  // [:name:] or [:^name:] at i_, with Oniguruma's Unicode definitions.
  void posix_bracket(ClassSet::Union& u) {
    const size_t end = p_.find(":]", i_ + 2);
    if (end == std::string::npos) {  // not a POSIX bracket: a nested class starting with ':'
      ++i_;
      u.nested.push_back(parse_class());
      return;
    }
    std::string name = p_.substr(i_ + 2, end - i_ - 2);
    i_ = end + 2;
    bool negate = false;
    if (!name.empty() && name[0] == '^') {
      negate = true;
      name.erase(0, 1);
    }
    std::string body;
    if (name == "alpha") {
      body = "\\p{Alphabetic}";
    } else if (name == "alnum") {
      body = "\\p{Alphabetic}\\p{Nd}";
    } else if (name == "word") {
      body = kWordClass;
    } else if (name == "space") {
      body = kSpaceClass;
    } else if (name == "digit") {
      body = "\\p{Nd}";
    } else if (name == "xdigit") {
      body = kHexClass;
    } else if (name == "upper") {
      body = "\\p{Uppercase}";
    } else if (name == "lower") {
      body = "\\p{Lowercase}";
    } else if (name == "punct") {
      body = "\\p{P}\\p{S}";
    } else {  // blank, cntrl, graph, print, ascii: PCRE2's own
      u.plain += "[:" + std::string(negate ? "^" : "") + name + ":]";
      return;
    }
    if (negate)
      u.nested.push_back(negated_plain(body));
    else
      u.plain += body;
  }

  // The set's PCRE2 class body when one PCRE2 class can hold it (no intersection, no negated nested set).
  static bool flat_body(const ClassSet& s, std::string* body) {
    if (s.operands.size() != 1) return false;
    std::string b = s.operands[0].plain;
    for (const ClassSet& n : s.operands[0].nested) {
      std::string nb;
      if (n.negated || !flat_body(n, &nb)) return false;
      b += nb;
    }
    *body = b;
    return true;
  }

  // A PCRE2 atom matching one character of the set.
  static std::string emit(const ClassSet& s) {
    std::string body;
    if (flat_body(s, &body)) return std::string(s.negated ? "[^" : "[") + body + "]";
    std::string positive;
    for (size_t k = 0; k < s.operands.size(); ++k) {
      const ClassSet::Union& u = s.operands[k];
      std::vector<std::string> alts;
      std::string plain = u.plain;
      for (const ClassSet& n : u.nested) {
        std::string nb;
        if (!n.negated && flat_body(n, &nb))
          plain += nb;
        else
          alts.push_back(emit(n));
      }
      if (!plain.empty()) alts.insert(alts.begin(), "[" + plain + "]");
      std::string atom;
      if (alts.empty()) {
        atom = "(?!)";  // an empty set matches nothing
      } else if (alts.size() == 1) {
        atom = alts[0];
      } else {
        atom = "(?:" + alts[0];
        for (size_t a = 1; a < alts.size(); ++a) atom += "|" + alts[a];
        atom += ")";
      }
      positive += k + 1 < s.operands.size() ? "(?=" + atom + ")" : atom;
    }
    if (s.operands.size() > 1) positive = "(?:" + positive + ")";
    return s.negated ? "(?:(?!" + positive + ")(?s:.))" : positive;
  }

  const std::string& p_;
  size_t i_ = 0;
};

std::string onig_to_pcre2(const std::string& p) { return OnigTranslator(p).run(); }

std::shared_ptr<const Regex::Code> compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw std::invalid_argument(std::string(reinterpret_cast<const char*>(msg)) + " at offset " +
                                std::to_string(err_off));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: without JIT the interpreter runs
  auto c = std::make_shared<Regex::Code>();
  c->code = code;
  return c;
}

}  // namespace

Regex::Regex(const std::string& pattern) : pattern_(pattern), code_(compile(onig_to_pcre2(pattern))) {}

Regex Regex::literal(const std::string& s) {
  std::string p;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) p += '\\';  // escaping any ASCII non-alphanumeric is literal in PCRE2
    p += c;
  }
  return Regex(p);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> out;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    int rc = pcre2_match(code_->code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // deep backtracking: the interpreter keeps its stack on the heap
      rc = pcre2_match(code_->code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw UserError("regex /" + pattern_ + "/ failed on a text of " + std::to_string(s.size()) +
                      " bytes: " + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      pos = e;
    } else {
      if (b >= s.size()) break;
      pos = b + utf8_len(static_cast<unsigned char>(s[b]));
    }
  }
  return out;
}

bool is_word_char(char32_t c) {
  static const Regex word("\\A[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]");
  std::string s;
  utf8_append(s, c);
  return !word.find_all(s).empty();
}

}  // namespace mgrl::io::unicode
