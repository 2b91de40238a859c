// jinja.cpp: the Jinja2 subset interpreter for chat templates: lexer (whitespace control, trim_blocks,
// lstrip_blocks), parser to a small tree, and a tree-walking evaluator with Python's value semantics.
#include "io/jinja.h"

#include <utf8proc.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/unicode.h"

namespace mgrl::io::jinja {
namespace uc = mgrl::io::unicode;
namespace {

// ---- limits: a hostile template ends with an error, never hangs or exhausts memory ----
constexpr int kMaxDepth = 128;                        // nesting of expressions and blocks while parsing
constexpr int kMaxExprDepth = 256;                    // depth of an expression's tree (chains such as a+b+c... included)
constexpr int kMaxCallDepth = 64;                     // macro calls inside macro calls
constexpr int kMaxEvalDepth = 1500;                   // statements and expressions being evaluated, one inside another
constexpr std::size_t kMaxString = 16u << 20;         // any string, the output included (bytes)
constexpr std::size_t kMaxList = 1u << 20;            // elements of a list made by the template
constexpr std::int64_t kMaxRange = 100000;            // range() length (Jinja's sandbox limit)
constexpr std::int64_t kMaxSteps = 2'000'000;         // evaluation steps (nodes, loop iterations, string bytes / 64)

[[noreturn]] void fail(const std::string& name, int line, const std::string& what) {
  throw UserError(name + ":" + std::to_string(line) + ": " + what);
}

// ---------------------------------------------------------------------------------------------
// Lexer
// ---------------------------------------------------------------------------------------------

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  Tok kind;
  std::string text;
  int line;
  std::int64_t i = 0;
  double f = 0;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.rstrip() of the data before a "-" tag (Unicode whitespace).
std::string rstrip_py(const std::string& s) {
  std::size_t end = s.size();
  while (end > 0) {
    std::size_t b = end - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    std::size_t k = b;
    const char32_t c = uc::utf8_next(s, k);
    if (!uc::is_python_space(c)) break;
    end = b;
  }
  return s.substr(0, end);
}

std::size_t skip_py_space(const std::string& s, std::size_t p) {
  while (p < s.size()) {
    std::size_t k = p;
    const char32_t c = uc::utf8_next(s, k);
    if (!uc::is_python_space(c)) break;
    p = k;
  }
  return p;
}

class Lexer {
 public:
  Lexer(std::string src, const std::string& name) : name_(name) {
    // newlines normalised to \n, one trailing newline dropped (keep_trailing_newline = False)
    src_.reserve(src.size());
    for (std::size_t k = 0; k < src.size(); ++k) {
      if (src[k] == '\r') {
        src_ += '\n';
        if (k + 1 < src.size() && src[k + 1] == '\n') ++k;
      } else {
        src_ += src[k];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    std::size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      std::size_t open = pos;
      char kind = 0;
      while (true) {
        open = src_.find('{', open);
        if (open == std::string::npos || open + 1 >= src_.size()) {
          open = std::string::npos;
          break;
        }
        const char c = src_[open + 1];
        if (c == '{' || c == '%' || c == '#') {
          kind = c;
          break;
        }
        ++open;
      }
      if (open == std::string::npos) {
        emit_data(src_.substr(pos));
        break;
      }
      std::string text = src_.substr(pos, open - pos);
      std::size_t p = open + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (sign) ++p;
      if (sign == '-') {
        text = rstrip_py(text);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks: blocks and comments only
        const std::size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l_pos > 0 || line_starting) {
          bool ws = l_pos < text.size();
          for (std::size_t k = l_pos; k < text.size() && ws; ++k) ws = is_space(text[k]);
          if (ws) text.resize(l_pos);
        }
      }
      line_ += count_nl(src_, pos, open);  // the line of the tag
      emit_data(std::move(text));
      if (kind == '#') {
        std::size_t close = src_.find("#}", p);
        if (close == std::string::npos) fail(name_, line_, "missing end of comment tag");
        line_ += count_nl(src_, open, close);
        const bool minus = close > p && src_[close - 1] == '-';
        const bool plus = close > p && src_[close - 1] == '+';
        pos = close + 2;
        pos = after_end(pos, minus, plus);
        line_starting = pos > 0 && src_[pos - 1] == '\n';
        continue;
      }
      if (kind == '%' && is_raw(p)) {
        pos = lex_raw(p);
        line_starting = pos > 0 && src_[pos - 1] == '\n';
        continue;
      }
      out_.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", line_});
      pos = lex_tag(p, kind);
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    out_.push_back({Tok::End, "", line_});
    return std::move(out_);
  }

 private:
  static int count_nl(const std::string& s, std::size_t b, std::size_t e) {
    return static_cast<int>(std::count(s.begin() + static_cast<std::ptrdiff_t>(b), s.begin() + static_cast<std::ptrdiff_t>(e), '\n'));
  }

  void emit_data(std::string text) {
    if (text.empty()) return;
    out_.push_back({Tok::Data, std::move(text), line_});
  }

  // Position after a block/comment end at pos: "-" strips all whitespace after it, trim_blocks one newline.
  std::size_t after_end(std::size_t pos, bool minus, bool plus, bool block = true) {
    if (minus) {
      const std::size_t q = skip_py_space(src_, pos);
      line_ += count_nl(src_, pos, q);
      return q;
    }
    if (block && !plus && pos < src_.size() && src_[pos] == '\n') {
      ++line_;
      return pos + 1;
    }
    return pos;
  }

  bool is_raw(std::size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  std::size_t lex_raw(std::size_t p) {
    std::size_t close = src_.find("%}", p);
    const bool minus = src_[close - 1] == '-';
    line_ += count_nl(src_, p, close);
    std::size_t body = after_end(close + 2, minus, false);
    // the first {% endraw %} (with optional - / + and spaces)
    std::size_t search = body;
    while (true) {
      const std::size_t e = src_.find("{%", search);
      if (e == std::string::npos) fail(name_, line_, "missing end of raw directive");
      std::size_t q = e + 2;
      const char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = e + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      bool m = false, pl = false;
      if (q < src_.size() && src_[q] == '-') m = true, ++q;
      else if (q < src_.size() && src_[q] == '+') pl = true, ++q;
      if (src_.compare(q, 2, "%}") != 0) {
        search = e + 2;
        continue;
      }
      std::string text = src_.substr(body, e - body);
      if (sign == '-') {
        text = rstrip_py(text);
      } else if (sign != '+') {
        const std::size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l_pos > 0) {
          bool ws = l_pos < text.size();
          for (std::size_t k = l_pos; k < text.size() && ws; ++k) ws = is_space(text[k]);
          if (ws) text.resize(l_pos);
        }
      }
      emit_data(std::move(text));
      line_ += count_nl(src_, body, q);
      return after_end(q + 2, m, pl);
    }
  }

  // Tokens of an expression tag from p to its end; returns the position after the end.
  std::size_t lex_tag(std::size_t p, char kind) {
    std::vector<char> balance;
    while (true) {
      while (p < src_.size() && is_space(src_[p])) {
        if (src_[p] == '\n') ++line_;
        ++p;
      }
      if (p >= src_.size()) fail(name_, line_, kind == '{' ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      if (balance.empty()) {
        if (kind == '%') {
          if (src_.compare(p, 3, "-%}") == 0 || src_.compare(p, 3, "+%}") == 0 || src_.compare(p, 2, "%}") == 0) {
            const bool minus = src_[p] == '-', plus = src_[p] == '+';
            out_.push_back({Tok::BlockEnd, "", line_});
            return after_end(p + (minus || plus ? 3 : 2), minus, plus);
          }
        } else if (src_.compare(p, 3, "-}}") == 0 || src_.compare(p, 2, "}}") == 0) {
          const bool minus = src_[p] == '-';
          out_.push_back({Tok::VarEnd, "", line_});
          return after_end(p + (minus ? 3 : 2), minus, false, false);
        }
      }
      const char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        std::size_t q = p;
        while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
        out_.push_back({Tok::Name, src_.substr(p, q - p), line_});
        p = q;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        p = lex_number(p);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                    "=",  ".",  ",",  ":",  "|",  "(",  ")", "[", "]", "{", "}"};
        std::string op;
        for (const char* o : ops)
          if (src_.compare(p, std::char_traits<char>::length(o), o) == 0) {
            op = o;
            break;
          }
        if (op.empty()) fail(name_, line_, std::string("unexpected character '") + c + "'");
        if (op == "(" || op == "[" || op == "{") balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        if (op == ")" || op == "]" || op == "}") {
          if (balance.empty()) fail(name_, line_, "unexpected '" + op + "'");
          if (balance.back() != op[0]) fail(name_, line_, "unexpected '" + op + "', expected '" + balance.back() + "'");
          balance.pop_back();
        }
        out_.push_back({Tok::Op, op, line_});
        p += op.size();
      }
    }
  }

  std::size_t lex_number(std::size_t p) {
    std::size_t q = p;
    std::string digits;
    const auto run = [&] {
      while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) ||
                                 (src_[q] == '_' && q + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q + 1]))))) {
        if (src_[q] != '_') digits += src_[q];
        ++q;
      }
    };
    run();
    bool is_float = false;
    if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      is_float = true;
      digits += '.';
      ++q;
      run();
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      std::size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
        is_float = true;
        digits += 'e';
        digits += src_.substr(q + 1, r - q - 1);
        q = r;
        run();
      }
    }
    Token t{is_float ? Tok::Float : Tok::Int, src_.substr(p, q - p), line_};
    if (is_float) {
      t.f = std::strtod(digits.c_str(), nullptr);
    } else {
      errno = 0;
      t.i = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) fail(name_, line_, "integer literal too large: " + t.text);
    }
    out_.push_back(std::move(t));
    return q;
  }

  std::size_t lex_string(std::size_t p) {
    const char quote = src_[p];
    std::string v;
    std::size_t q = p + 1;
    const int start_line = line_;
    while (true) {
      if (q >= src_.size()) fail(name_, start_line, "unterminated string");
      const char c = src_[q];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        v += c;
        ++q;
        continue;
      }
      if (q + 1 >= src_.size()) fail(name_, start_line, "unterminated string");
      const char e = src_[q + 1];
      q += 2;
      switch (e) {
        case 'n': v += '\n'; break;
        case 't': v += '\t'; break;
        case 'r': v += '\r'; break;
        case '0': v += '\0'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'v': v += '\v'; break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case '\n': ++line_; break;  // a line continuation
        case 'x': case 'u': case 'U': {
          const std::size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (q + n > src_.size()) fail(name_, line_, "bad \\" + std::string(1, e) + " escape in a string");
          std::uint32_t cp = 0;
          for (std::size_t k = 0; k < n; ++k) {
            const char h = src_[q + k];
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) fail(name_, line_, "bad \\" + std::string(1, e) + " escape in a string");
            cp = cp * 16 + static_cast<std::uint32_t>(d);
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) fail(name_, line_, "bad code point in a string escape");
          uc::utf8_append(v, cp);
          q += n;
          break;
        }
        default:  // Python keeps unknown escapes as they are
          v += '\\';
          v += e;
      }
    }
    out_.push_back({Tok::String, std::move(v), start_line});
    return q + 1;
  }

  std::string src_;
  const std::string& name_;
  int line_ = 1;
  std::vector<Token> out_;
};

// ---------------------------------------------------------------------------------------------
// Tree
// ---------------------------------------------------------------------------------------------

enum class N {
  // expressions
  Const, Name, ListLit, TupleLit, DictLit, Attr, Item, Slice, Call, Filter, Test, Unary, Binary, And, Or, Not,
  CondExpr, Concat,
  // statements
  Body, Data, Print, If, For, Set, SetBlock, Macro, Break, Continue, Generation
};

struct Node {
  N kind;
  int line = 0;
  std::string str;                 // names, operators, filter/test names
  Value value;                     // constants
  std::vector<std::shared_ptr<Node>> kids;
  std::vector<std::pair<std::string, std::shared_ptr<Node>>> kwargs;  // calls/filters/tests; macro defaults
  bool flag = false;               // Test: negated; For: has else
  int depth = 1;                   // expressions: the depth of the tree below
};
using NodeP = std::shared_ptr<Node>;

NodeP make(N kind, int line, std::string str = "") {
  auto n = std::make_shared<Node>();
  n->kind = kind;
  n->line = line;
  n->str = std::move(str);
  return n;
}

}  // namespace

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<NodeP> defaults;  // same length as params, null where none
  NodeP body;
};

namespace {

class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& name) : t_(std::move(toks)), name_(name) {}

  NodeP parse_template() {
    auto body = parse_body({});
    if (peek().kind != Tok::End) fail_here("unexpected '" + peek_block_name() + "'");
    return body;
  }
  bool saw_generation = false;

 private:
  const Token& peek(std::size_t k = 0) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  [[noreturn]] void fail_here(const std::string& what) const { fail(name_, peek().line, what); }
  bool is_op(const char* op, std::size_t k = 0) const { return peek(k).kind == Tok::Op && peek(k).text == op; }
  bool is_name(const char* n, std::size_t k = 0) const { return peek(k).kind == Tok::Name && peek(k).text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail_here(std::string("expected '") + op + "', got " + describe(peek()));
    next();
  }
  void expect_block_end() {
    if (peek().kind != Tok::BlockEnd) fail_here("expected '%}', got " + describe(peek()));
    next();
  }
  std::string expect_name() {
    if (peek().kind != Tok::Name) fail_here("expected a name, got " + describe(peek()));
    return next().text;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::Name: return "'" + t.text + "'";
      case Tok::Op: return "'" + t.text + "'";
      case Tok::String: return "a string";
      case Tok::Int: case Tok::Float: return "a number";
      case Tok::VarEnd: return "'}}'";
      case Tok::BlockEnd: return "'%}'";
      case Tok::End: return "the end of the template";
      default: return "text";
    }
  }
  std::string peek_block_name() const {
    if (peek().kind == Tok::BlockBegin && peek(1).kind == Tok::Name) return peek(1).text;
    return describe(peek());
  }

  // Sets an expression node's depth from its children; a tree deeper than kMaxExprDepth is refused, so that
  // evaluating and freeing it cannot exhaust the stack.
  NodeP D(NodeP n) const {
    int d = 0;
    for (const auto& k : n->kids)
      if (k) d = std::max(d, k->depth);
    for (const auto& kv : n->kwargs)
      if (kv.second) d = std::max(d, kv.second->depth);
    n->depth = d + 1;
    if (n->depth > kMaxExprDepth) fail(name_, n->line, "an expression nested deeper than " + std::to_string(kMaxExprDepth) + " levels");
    return n;
  }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.fail_here("the template nests deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    ~DepthGuard() { --p.depth_; }
  };

  // Statements until a block tag whose name is in `until` (left unread: the caller reads it).
  NodeP parse_body(const std::vector<std::string>& until) {
    DepthGuard g(*this);
    auto body = make(N::Body, peek().line);
    while (true) {
      const Token& tk = peek();
      if (tk.kind == Tok::End) {
        if (!until.empty()) fail_here("unexpected end of template; expected '{% " + until.back() + " %}'");
        return body;
      }
      if (tk.kind == Tok::Data) {
        auto d = make(N::Data, tk.line);
        d->value = Value::string(tk.text);
        body->kids.push_back(d);
        next();
      } else if (tk.kind == Tok::VarBegin) {
        next();
        auto p = make(N::Print, tk.line);
        p->kids.push_back(parse_tuple_or_expr());
        if (peek().kind != Tok::VarEnd) fail_here("expected '}}', got " + describe(peek()));
        next();
        body->kids.push_back(p);
      } else if (tk.kind == Tok::BlockBegin) {
        if (peek(1).kind != Tok::Name) fail(name_, peek(1).line, "expected a statement name after '{%'");
        const std::string& word = peek(1).text;
        if (std::find(until.begin(), until.end(), word) != until.end()) return body;
        next();
        body->kids.push_back(parse_statement());
      } else {
        fail_here("unexpected " + describe(tk));
      }
    }
  }

  // After "{%": a statement.
  NodeP parse_statement() {
    const int line = peek().line;
    const std::string word = next().text;
    if (word == "if") return parse_if(line);
    if (word == "for") return parse_for(line);
    if (word == "set") return parse_set(line);
    if (word == "macro") return parse_macro(line);
    if (word == "break" || word == "continue") {
      if (loop_depth_ == 0) fail(name_, line, "'" + word + "' outside a loop");
      expect_block_end();
      return make(word == "break" ? N::Break : N::Continue, line);
    }
    if (word == "generation") {
      expect_block_end();
      saw_generation = true;
      auto n = make(N::Generation, line);
      n->kids.push_back(parse_body({"endgeneration"}));
      end_tag("endgeneration");
      return n;
    }
    static const char* known_unsupported[] = {"extends", "include", "import", "from", "block", "call", "filter",
                                              "with", "autoescape", "do", "trans"};
    for (const char* u : known_unsupported)
      if (word == u) fail(name_, line, "unsupported Jinja statement '{% " + word + " %}' (mgrl's template subset: docs/sft.md)");
    fail(name_, line, "unknown statement '" + word + "'");
  }

  void end_tag(const char* name) {
    next();  // {%
    if (!is_name(name)) fail_here(std::string("expected '") + name + "'");
    next();
    expect_block_end();
  }

  NodeP parse_if(int line) {
    auto n = make(N::If, line);
    n->kids.push_back(parse_tuple_or_expr());
    expect_block_end();
    n->kids.push_back(parse_body({"elif", "else", "endif"}));
    next();  // {%
    const std::string w = next().text;
    if (w == "elif") {
      n->kids.push_back(parse_if(peek().line));  // the elif chain ends at the shared endif
      return n;
    }
    if (w == "else") {
      expect_block_end();
      n->kids.push_back(parse_body({"endif"}));
      next();
      next();
    }
    expect_block_end();
    return n;
  }

  NodeP parse_for(int line) {
    auto n = make(N::For, line);
    // target: name or names separated by commas
    auto target = make(N::TupleLit, line);
    target->kids.push_back(make(N::Name, line, expect_name()));
    while (is_op(",")) {
      next();
      target->kids.push_back(make(N::Name, line, expect_name()));
    }
    if (!is_name("in")) fail_here("expected 'in' in a for loop");
    next();
    n->kids.push_back(target);
    n->kids.push_back(parse_tuple_or_expr(/*no_cond=*/true));
    NodeP cond;
    if (is_name("if")) {
      next();
      cond = parse_expr();
    }
    if (is_name("recursive")) fail_here("unsupported: recursive for loops");
    expect_block_end();
    ++loop_depth_;
    n->kids.push_back(parse_body({"else", "endfor"}));
    --loop_depth_;
    n->kids.push_back(cond);
    next();
    if (next().text == "else") {
      expect_block_end();
      n->flag = true;
      n->kids.push_back(parse_body({"endfor"}));
      next();
      next();
    }
    expect_block_end();
    return n;
  }

  NodeP parse_set(int line) {
    // set name = expr | set a, b = expr | set ns.attr = expr | set name %}...{% endset
    auto target = make(N::TupleLit, line);
    const std::string first = expect_name();
    if (is_op(".")) {
      next();
      auto attr = make(N::Attr, line, expect_name());
      attr->kids.push_back(make(N::Name, line, first));
      target->kids.push_back(attr);
    } else {
      target->kids.push_back(make(N::Name, line, first));
      while (is_op(",")) {
        next();
        target->kids.push_back(make(N::Name, line, expect_name()));
      }
    }
    if (peek().kind == Tok::BlockEnd) {
      if (target->kids.size() != 1 || target->kids[0]->kind != N::Name) fail_here("a block set takes one name");
      next();
      auto n = make(N::SetBlock, line, first);
      n->kids.push_back(parse_body({"endset"}));
      end_tag("endset");
      return n;
    }
    expect_op("=");
    auto n = make(N::Set, line);
    n->kids.push_back(target);
    n->kids.push_back(parse_tuple_or_expr());
    expect_block_end();
    return n;
  }

  NodeP parse_macro(int line) {
    auto def = std::make_shared<MacroDef>();
    def->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      def->params.push_back(expect_name());
      NodeP d;
      if (is_op("=")) {
        next();
        d = parse_expr();
      } else if (!def->defaults.empty() && def->defaults.back()) {
        fail_here("a macro argument without a default follows one with a default");
      }
      def->defaults.push_back(d);
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    def->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    end_tag("endmacro");
    auto n = make(N::Macro, line, def->name);
    n->value.kind = Value::Kind::Macro;
    n->value.macro = def;
    return n;
  }

  // ---- expressions ----
  NodeP parse_tuple_or_expr(bool no_cond = false) {
    const int line = peek().line;
    NodeP e = no_cond ? parse_or() : parse_expr();
    if (!is_op(",")) return e;
    auto t = make(N::TupleLit, line);
    t->kids.push_back(e);
    while (is_op(",")) {
      next();
      if (peek().kind == Tok::VarEnd || peek().kind == Tok::BlockEnd || is_op(")")) break;
      t->kids.push_back(no_cond ? parse_or() : parse_expr());
    }
    return D(t);
  }

  NodeP parse_expr() {
    DepthGuard g(*this);
    NodeP e = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      auto c = make(N::CondExpr, line);
      c->kids.push_back(parse_or());  // condition
      c->kids.push_back(e);           // value when true
      if (is_name("else")) {
        next();
        c->kids.push_back(parse_expr());
      }
      e = D(c);
    }
    return e;
  }
  NodeP parse_or() {
    NodeP e = parse_and();
    while (is_name("or")) {
      auto n = make(N::Or, next().line);
      n->kids = {e, parse_and()};
      e = D(n);
    }
    return e;
  }
  NodeP parse_and() {
    NodeP e = parse_not();
    while (is_name("and")) {
      auto n = make(N::And, next().line);
      n->kids = {e, parse_not()};
      e = D(n);
    }
    return e;
  }
  NodeP parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      auto n = make(N::Not, next().line);
      n->kids.push_back(parse_not());
      return D(n);
    }
    return parse_compare();
  }
  NodeP parse_compare() {
    NodeP e = parse_math1();
    Node* last_compare_ = nullptr;  // the comparison just parsed, to chain the next one onto
    Node* chain_and_ = nullptr;
    while (true) {
      std::string op;
      if (peek().kind == Tok::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                     peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        op = peek().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        next();
        next();
      } else {
        return e;
      }
      auto n = make(N::Binary, peek().line, op);
      if (e->kind == N::Binary && last_compare_ == e.get()) {
        // a chain a < b < c is (a < b) and (b < c), as in Python
        n->kids = {e->kids[1], parse_math1()};
        auto both = make(N::And, n->line);
        both->kids = {e, D(n)};
        last_compare_ = n.get();
        e = D(both);
        chain_and_ = e.get();
        continue;
      }
      if (e->kind == N::And && chain_and_ == e.get()) {
        n->kids = {last_compare_->kids[1], parse_math1()};
        auto both = make(N::And, n->line);
        both->kids = {e, D(n)};
        last_compare_ = n.get();
        e = D(both);
        chain_and_ = e.get();
        continue;
      }
      n->kids = {e, parse_math1()};
      e = D(n);
      last_compare_ = e.get();
    }
  }
  NodeP parse_math1() {
    NodeP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      auto n = make(N::Binary, peek().line, next().text);
      n->kids = {e, parse_concat()};
      e = D(n);
    }
    return e;
  }
  NodeP parse_concat() {
    NodeP e = parse_math2();
    if (!is_op("~")) return e;
    auto n = make(N::Concat, peek().line);
    n->kids.push_back(e);
    while (is_op("~")) {
      next();
      n->kids.push_back(parse_math2());
    }
    return D(n);
  }
  NodeP parse_math2() {
    NodeP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      auto n = make(N::Binary, peek().line, next().text);
      n->kids = {e, parse_pow()};
      e = D(n);
    }
    return e;
  }
  NodeP parse_pow() {
    NodeP e = parse_unary(true);
    while (is_op("**")) {
      auto n = make(N::Binary, peek().line, next().text);
      n->kids = {e, parse_unary(true)};
      e = D(n);
    }
    return e;
  }
  NodeP parse_unary(bool with_filter) {
    DepthGuard g(*this);
    NodeP e;
    if (is_op("-") || is_op("+")) {
      e = make(N::Unary, peek().line, next().text);
      e->kids.push_back(parse_unary(false));
      e = D(e);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(e);
    if (with_filter) e = parse_filter_expr(e);
    return e;
  }
  NodeP parse_primary() {
    const Token& tk = peek();
    const int line = tk.line;
    if (tk.kind == Tok::Name) {
      next();
      if (tk.text == "true" || tk.text == "True") return constant(Value::boolean(true), line);
      if (tk.text == "false" || tk.text == "False") return constant(Value::boolean(false), line);
      if (tk.text == "none" || tk.text == "None") return constant(Value::none(), line);
      return make(N::Name, line, tk.text);
    }
    if (tk.kind == Tok::String) {
      std::string s = next().text;
      while (peek().kind == Tok::String) s += next().text;  // adjacent literals join, as in Python
      return constant(Value::string(std::move(s)), line);
    }
    if (tk.kind == Tok::Int) return constant(Value::integer(next().i), line);
    if (tk.kind == Tok::Float) return constant(Value::number(next().f), line);
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return make(N::TupleLit, line);
      }
      NodeP e = parse_expr();
      if (is_op(",")) {
        auto t = make(N::TupleLit, line);
        t->kids.push_back(e);
        while (is_op(",")) {
          next();
          if (is_op(")")) break;
          t->kids.push_back(parse_expr());
        }
        e = D(t);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto l = make(N::ListLit, line);
      while (!is_op("]")) {
        l->kids.push_back(parse_expr());
        if (!is_op(",")) break;
        next();
      }
      expect_op("]");
      return D(l);
    }
    if (is_op("{")) {
      next();
      auto d = make(N::DictLit, line);
      while (!is_op("}")) {
        d->kids.push_back(parse_expr());
        expect_op(":");
        d->kids.push_back(parse_expr());
        if (!is_op(",")) break;
        next();
      }
      expect_op("}");
      return D(d);
    }
    fail_here("unexpected " + describe(tk) + " in an expression");
  }
  static NodeP constant(Value v, int line) {
    auto n = make(N::Const, line);
    n->value = std::move(v);
    return n;
  }
  NodeP parse_postfix(NodeP e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        if (peek().kind == Tok::Int) {
          auto n = make(N::Item, line);
          n->kids = {e, constant(Value::integer(next().i), line)};
          e = D(n);
          continue;
        }
        auto n = make(N::Attr, line, expect_name());
        n->kids.push_back(e);
        e = D(n);
      } else if (is_op("[")) {
        e = parse_subscript(e);
      } else if (is_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }
  NodeP parse_subscript(NodeP e) {
    const int line = next().line;  // [
    NodeP parts[3];
    bool slice = false;
    int k = 0;
    while (true) {
      if (is_op(":")) {
        if (k == 2) fail_here("a slice has at most three parts");
        slice = true;
        next();
        ++k;
        continue;
      }
      if (is_op("]")) break;
      if (parts[k]) fail_here("expected ':' or ']'");
      parts[k] = parse_expr();
    }
    next();
    if (!slice) {
      if (!parts[0]) fail(name_, line, "empty subscript");
      auto n = make(N::Item, line);
      n->kids = {e, parts[0]};
      return D(n);
    }
    auto n = make(N::Slice, line);
    n->kids = {e, parts[0], parts[1], parts[2]};
    return D(n);
  }
  // Arguments "(a, b, k=v)" into n->kids (after what is already there) and n->kwargs.
  void parse_args(const NodeP& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Tok::Name && is_op("=", 1)) {
        std::string k = next().text;
        next();
        n->kwargs.emplace_back(std::move(k), parse_expr());
      } else {
        if (!n->kwargs.empty()) fail_here("a positional argument follows a keyword argument");
        if (is_op("*") || is_op("**")) fail_here("unsupported: * and ** arguments");
        n->kids.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }
  NodeP parse_call(NodeP e) {
    auto n = make(N::Call, peek().line);
    n->kids.push_back(e);
    parse_args(n);
    return D(n);
  }
  NodeP parse_filter_expr(NodeP e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        std::string name = expect_name();
        while (is_op(".")) {  // dotted filter names
          next();
          name += "." + expect_name();
        }
        auto n = make(N::Filter, line, name);
        n->kids.push_back(e);
        if (is_op("(")) parse_args(n);
        e = D(n);
      } else if (is_name("is")) {
        const int line = next().line;
        bool neg = false;
        if (is_name("not")) {
          next();
          neg = true;
        }
        std::string name;
        if (peek().kind == Tok::Name) {
          name = next().text;
        } else if (peek().kind == Tok::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                              peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
          name = next().text;
        } else {
          fail_here("expected a test name after 'is'");
        }
        auto n = make(N::Test, line, name);
        n->flag = neg;
        n->kids.push_back(e);
        if (is_op("(")) {
          parse_args(n);
        } else if (peek().kind == Tok::String || peek().kind == Tok::Int || peek().kind == Tok::Float ||
                   (peek().kind == Tok::Name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("is") && !is_name("in") && !is_name("not"))) {
          n->kids.push_back(parse_primary());  // `is sameas x`, `is divisibleby 3`
          n->kids.back() = parse_postfix(n->kids.back());
        }
        e = D(n);
      } else if (is_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  std::size_t pos_ = 0;
  const std::string& name_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

using Kind = Value::Kind;

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "namespace";
    case Kind::Function: return "function";
    case Kind::Macro: return "macro";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0;
    case Kind::String: return !v.s.empty();
    case Kind::List: return !v.list->empty();
    case Kind::Dict: return !v.dict->empty();
    default: return true;
  }
}

// Python's repr of a float ("1.0", "0.1", "1e+16", "inf", "nan").
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s = buf;
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const std::size_t e = s.find('e');
  const int exp = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (std::size_t k = 0; k < e; ++k)
    if (s[k] != '.') digits += s[k];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + m + eb;
  }
  const int decpt = exp + 1;
  if (decpt <= 0) return sign + "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
  if (static_cast<std::size_t>(decpt) >= digits.size())
    return sign + digits + std::string(static_cast<std::size_t>(decpt) - digits.size(), '0') + ".0";
  return sign + digits.substr(0, static_cast<std::size_t>(decpt)) + "." + digits.substr(static_cast<std::size_t>(decpt));
}

std::string str_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

std::string repr(const Value& v);

std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::String: return str_repr(v.s);
    case Kind::List: {
      std::string out = v.b ? "(" : "[";
      for (std::size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      if (v.b && v.list->size() == 1) out += ",";
      return out + (v.b ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = "{";
      for (std::size_t k = 0; k < v.dict->size(); ++k)
        out += (k ? ", " : "") + str_repr((*v.dict)[k].first) + ": " + repr((*v.dict)[k].second);
      return out + "}";
    }
    default: return to_str(v);
  }
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// Python's json.dumps(x, ensure_ascii=False, indent, separators, sort_keys).
struct JsonStyle {
  int indent = -1;  // -1: None
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};

bool json_dump(std::string& out, const Value& v, const JsonStyle& st, int level, std::string* err) {
  if (out.size() > kMaxString) {
    *err = "tojson output is too large";
    return false;
  }
  const auto newline = [&](int lv) {
    if (st.indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(st.indent * lv), ' ');
  };
  switch (v.kind) {
    case Kind::None: out += "null"; return true;
    case Kind::Bool: out += v.b ? "true" : "false"; return true;
    case Kind::Int: out += std::to_string(v.i); return true;
    case Kind::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      return true;
    case Kind::String: json_string(out, v.s); return true;
    case Kind::List: {
      if (v.list->empty()) {
        out += "[]";
        return true;
      }
      out += '[';
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += st.item_sep;
        newline(level + 1);
        if (!json_dump(out, (*v.list)[k], st, level + 1, err)) return false;
      }
      newline(level);
      out += ']';
      return true;
    }
    case Kind::Dict: {
      if (v.dict->empty()) {
        out += "{}";
        return true;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.dict) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k) out += st.item_sep;
        newline(level + 1);
        json_string(out, items[k]->first);
        out += st.key_sep;
        if (!json_dump(out, items[k]->second, st, level + 1, err)) return false;
      }
      newline(level);
      out += '}';
      return true;
    }
    default:
      *err = std::string("Object of type ") + type_name(v) + " is not JSON serializable";
      return false;
  }
}

bool is_number(const Value& v) { return v.kind == Kind::Int || v.kind == Kind::Float || v.kind == Kind::Bool; }
double as_double(const Value& v) {
  return v.kind == Kind::Float ? v.f : v.kind == Kind::Bool ? (v.b ? 1.0 : 0.0) : static_cast<double>(v.i);
}
std::int64_t as_int(const Value& v) { return v.kind == Kind::Bool ? (v.b ? 1 : 0) : v.i; }

bool equal(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return as_double(a) == as_double(b);
    return as_int(a) == as_int(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined: case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::List:
      if (a.list->size() != b.list->size()) return false;
      for (std::size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Kind::Dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& kv : *a.dict) {
        const Value* o = b.find(kv.first);
        if (!o || !equal(kv.second, *o)) return false;
      }
      return true;
    case Kind::Namespace: return a.dict == b.dict;
    case Kind::Function: return a.s == b.s;
    case Kind::Macro: return a.macro == b.macro;
    default: return false;
  }
}

// UTF-8 code point boundaries of s: offsets of each code point, plus s.size().
std::vector<std::size_t> cp_offsets(const std::string& s) {
  std::vector<std::size_t> o;
  o.reserve(s.size() + 1);
  for (std::size_t k = 0; k < s.size();) {
    o.push_back(k);
    k += std::max<std::size_t>(1, uc::utf8_len(static_cast<unsigned char>(s[k])));
    k = std::min(k, s.size());
  }
  o.push_back(s.size());
  return o;
}

std::vector<char32_t> code_points(const std::string& s) {
  std::vector<char32_t> out;
  for (std::size_t k = 0; k < s.size();) out.push_back(uc::utf8_next(s, k));
  return out;
}

std::string case_map(const std::string& s, int how) {  // 0 lower, 1 upper
  std::string out;
  out.reserve(s.size());
  for (std::size_t k = 0; k < s.size();) {
    const char32_t c = uc::utf8_next(s, k);
    const auto m = how ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) : utf8proc_tolower(static_cast<utf8proc_int32_t>(c));
    uc::utf8_append(out, static_cast<char32_t>(m));
  }
  return out;
}

bool is_cased_lower(char32_t c) { return utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) != static_cast<utf8proc_int32_t>(c); }
bool is_cased_upper(char32_t c) { return utf8proc_tolower(static_cast<utf8proc_int32_t>(c)) != static_cast<utf8proc_int32_t>(c); }

}  // namespace

Value Value::make_list(List x) {
  Value v;
  v.kind = Kind::List;
  for (const auto& e : x)
    if (e.kind == Kind::List || e.kind == Kind::Dict) v.nest = std::max(v.nest, e.nest);
  if (++v.nest > kMaxNesting) throw UserError("a list nested deeper than " + std::to_string(kMaxNesting) + " levels");
  v.list = std::make_shared<const List>(std::move(x));
  return v;
}

Value Value::make_dict(Dict x) {
  Value v;
  v.kind = Kind::Dict;
  for (const auto& e : x)
    if (e.second.kind == Kind::List || e.second.kind == Kind::Dict) v.nest = std::max(v.nest, e.second.nest);
  if (++v.nest > kMaxNesting) throw UserError("a dict nested deeper than " + std::to_string(kMaxNesting) + " levels");
  v.dict = std::make_shared<Dict>(std::move(x));
  return v;
}

const Value* Value::find(const std::string& key) const {
  if ((kind != Kind::Dict && kind != Kind::Namespace) || !dict) return nullptr;
  for (const auto& kv : *dict)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

namespace {
Value from_json_at(const nlohmann::ordered_json& j, std::uint32_t depth);
}

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

namespace {
Value from_json_at(const nlohmann::ordered_json& j, std::uint32_t depth) {
  if (depth > Value::kMaxNesting) throw UserError("a JSON value nested deeper than " + std::to_string(Value::kMaxNesting) + " levels");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<std::int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(from_json_at(x, depth + 1));
      return Value::make_list(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json_at(it.value(), depth + 1));
      return Value::make_dict(std::move(d));
    }
    default: return Value::none();
  }
}
}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return float_repr(v.f);
    case Kind::String: return v.s;
    case Kind::List: case Kind::Dict: return repr(v);
    case Kind::Namespace: return "<Namespace>";
    case Kind::Function: return "<function " + v.s + ">";
    case Kind::Macro: return "<Macro '" + v.macro->name + "'>";
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Evaluator
// ---------------------------------------------------------------------------------------------

struct Template::Impl {
  std::string name;
  NodeP root;
  bool generation = false;
};

namespace {

struct BreakSignal {};
struct ContinueSignal {};

class Frame {
 public:
  explicit Frame(Frame* parent) : parent_(parent) {}
  const Value* lookup(const std::string& n) const {
    for (const Frame* f = this; f; f = f->parent_) {
      const auto it = f->vars_.find(n);
      if (it != f->vars_.end()) return &it->second;
    }
    return nullptr;
  }
  void set(const std::string& n, Value v) { vars_[n] = std::move(v); }

 private:
  Frame* parent_;
  std::map<std::string, Value> vars_;
};

class Renderer {
 public:
  Renderer(const Template::Impl& t, Template::Output& out) : t_(t), out_(out), buf_(&out.text) {}

  void run(const Vars& vars) {
    Frame globals(nullptr);
    for (const char* f : {"range", "namespace", "dict", "raise_exception", "strftime_now"}) {
      Value v;
      v.kind = Kind::Function;
      v.s = f;
      globals.set(f, v);
    }
    Frame root(&globals);
    for (const auto& kv : vars) root.set(kv.first, kv.second);
    root_ = &root;
    exec(*t_.root, root);
  }

 private:
  [[noreturn]] void err(const Node& n, const std::string& what) const { fail(t_.name, n.line, what); }

  void step(const Node& n, std::int64_t k = 1) {
    steps_ += k;
    if (steps_ > kMaxSteps) err(n, "the template takes too many steps (a loop that does not end?)");
  }

  void emit(const Node& n, const std::string& s) {
    step(n, static_cast<std::int64_t>(s.size() / 64));
    if (buf_->size() + s.size() > kMaxString) err(n, "the rendered text is larger than 16 MiB");
    *buf_ += s;
  }

  Value check_str(const Node& n, std::string s) {
    if (s.size() > kMaxString) err(n, "a string larger than 16 MiB");
    step(n, static_cast<std::int64_t>(s.size() / 64));
    return Value::string(std::move(s));
  }

  struct EvalDepth {
    Renderer& r;
    EvalDepth(Renderer& renderer, const Node& n) : r(renderer) {
      if (++r.eval_depth_ > kMaxEvalDepth) {
        --r.eval_depth_;
        r.err(n, "the template nests too deeply while rendering (macros calling macros inside deep blocks)");
      }
    }
    ~EvalDepth() { --r.eval_depth_; }
  };

  // ---- statements ----
  void exec(const Node& n, Frame& f) {
    EvalDepth guard(*this, n);
    step(n);
    switch (n.kind) {
      case N::Body:
        for (const auto& k : n.kids) exec(*k, f);
        return;
      case N::Data:
        emit(n, n.value.s);
        return;
      case N::Print: {
        const Value v = eval(*n.kids[0], f);
        emit(n, to_str(v));
        return;
      }
      case N::If: {
        if (truthy(eval(*n.kids[0], f)))
          exec(*n.kids[1], f);
        else if (n.kids.size() > 2)
          exec(*n.kids[2], f);
        return;
      }
      case N::For: exec_for(n, f); return;
      case N::Set: {
        Value v = eval(*n.kids[1], f);
        assign(n, *n.kids[0], std::move(v), f);
        return;
      }
      case N::SetBlock: {
        std::string captured;
        std::string* saved = buf_;
        buf_ = &captured;
        ++capture_depth_;
        exec(*n.kids[0], f);
        --capture_depth_;
        buf_ = saved;
        f.set(n.str, Value::string(std::move(captured)));
        return;
      }
      case N::Macro: {
        f.set(n.str, n.value);
        return;
      }
      case N::Break: throw BreakSignal{};
      case N::Continue: throw ContinueSignal{};
      case N::Generation: {
        if (capture_depth_ > 0) err(n, "unsupported: {% generation %} inside a macro or a block set");
        const std::size_t begin = buf_->size();
        exec(*n.kids[0], f);
        out_.generation.emplace_back(begin, buf_->size());
        return;
      }
      default:
        err(n, "internal: not a statement");
    }
  }

  void assign(const Node& at, const Node& target, Value v, Frame& f) {
    if (target.kids.size() == 1) {
      const Node& t = *target.kids[0];
      if (t.kind == N::Attr) {
        const Value* ns = f.lookup(t.kids[0]->str);
        if (!ns || ns->kind != Kind::Namespace)
          err(at, "cannot assign to '" + t.kids[0]->str + "." + t.str + "': '" + t.kids[0]->str + "' is not a namespace");
        for (auto& kv : *ns->dict)
          if (kv.first == t.str) {
            kv.second = std::move(v);
            return;
          }
        ns->dict->emplace_back(t.str, std::move(v));
        return;
      }
      f.set(t.str, std::move(v));
      return;
    }
    const auto items = iterate(at, v);
    if (items.size() != target.kids.size())
      err(at, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(target.kids.size()) + " names");
    for (std::size_t k = 0; k < items.size(); ++k) f.set(target.kids[k]->str, items[k]);
  }

  void exec_for(const Node& n, Frame& f) {
    const Node& target = *n.kids[0];
    const Value seq = eval(*n.kids[1], f);
    std::vector<Value> items = iterate(n, seq);
    const Node* cond = n.kids[3].get();
    if (cond) {  // the loop filter runs before loop.* is known
      std::vector<Value> kept;
      for (auto& it : items) {
        step(n);
        Frame probe(&f);
        assign(n, target, it, probe);
        if (truthy(eval(*cond, probe))) kept.push_back(std::move(it));
      }
      items.swap(kept);
    }
    const auto len = static_cast<std::int64_t>(items.size());
    for (std::int64_t k = 0; k < len; ++k) {
      step(n);
      Frame body(&f);  // every iteration starts from the enclosing scope (a set inside does not carry over)
      assign(n, target, items[static_cast<std::size_t>(k)], body);
      Dict loop{{"index", Value::integer(k + 1)},
                {"index0", Value::integer(k)},
                {"revindex", Value::integer(len - k)},
                {"revindex0", Value::integer(len - k - 1)},
                {"first", Value::boolean(k == 0)},
                {"last", Value::boolean(k == len - 1)},
                {"length", Value::integer(len)},
                {"depth", Value::integer(1)},
                {"depth0", Value::integer(0)},
                {"previtem", k > 0 ? items[static_cast<std::size_t>(k - 1)] : Value::undefined("loop.previtem")},
                {"nextitem", k + 1 < len ? items[static_cast<std::size_t>(k + 1)] : Value::undefined("loop.nextitem")}};
      body.set("loop", Value::make_dict(std::move(loop)));
      try {
        exec(*n.kids[2], body);
      } catch (const BreakSignal&) {
        break;
      } catch (const ContinueSignal&) {
      }
    }
    if (len == 0 && n.flag) exec(*n.kids[4], f);
  }

  std::vector<Value> iterate(const Node& n, const Value& v) {
    switch (v.kind) {
      case Kind::Undefined: return {};
      case Kind::List: return *v.list;
      case Kind::Dict: {
        std::vector<Value> keys;
        for (const auto& kv : *v.dict) keys.push_back(Value::string(kv.first));
        return keys;
      }
      case Kind::String: {
        std::vector<Value> chars;
        const auto o = cp_offsets(v.s);
        for (std::size_t k = 0; k + 1 < o.size(); ++k) chars.push_back(Value::string(v.s.substr(o[k], o[k + 1] - o[k])));
        return chars;
      }
      default:
        err(n, std::string("'") + type_name(v) + "' object is not iterable");
    }
  }

  // ---- expressions ----
  Value eval(const Node& n, Frame& f) {
    EvalDepth guard(*this, n);
    step(n);
    switch (n.kind) {
      case N::Const: return n.value;
      case N::Name: {
        const Value* v = f.lookup(n.str);
        return v ? *v : Value::undefined(n.str);
      }
      case N::ListLit: case N::TupleLit: {
        List l;
        for (const auto& k : n.kids) l.push_back(eval(*k, f));
        return n.kind == N::TupleLit ? Value::make_tuple(std::move(l)) : Value::make_list(std::move(l));
      }
      case N::DictLit: {
        Dict d;
        for (std::size_t k = 0; k + 1 < n.kids.size(); k += 2) {
          const Value key = eval(*n.kids[k], f);
          if (key.kind != Kind::String) err(n, "dict keys must be strings here");
          Value val = eval(*n.kids[k + 1], f);
          bool found = false;
          for (auto& kv : d)
            if (kv.first == key.s) kv.second = val, found = true;
          if (!found) d.emplace_back(key.s, std::move(val));
        }
        return Value::make_dict(std::move(d));
      }
      case N::Attr: return get_attr(n, eval(*n.kids[0], f), n.str);
      case N::Item: return get_item(n, eval(*n.kids[0], f), eval(*n.kids[1], f));
      case N::Slice: return slice(n, f);
      case N::Call: return call(n, f);
      case N::Filter: return filter(n, f);
      case N::Test: {
        const bool r = test(n, f);
        return Value::boolean(n.flag ? !r : r);
      }
      case N::Unary: {
        const Value v = eval(*n.kids[0], f);
        if (!is_number(v)) err(n, std::string("bad operand type for unary ") + n.str + ": '" + type_name(v) + "'");
        if (n.str == "+") return v.kind == Kind::Bool ? Value::integer(as_int(v)) : v;
        if (v.kind == Kind::Float) return Value::number(-v.f);
        if (as_int(v) == std::numeric_limits<std::int64_t>::min()) err(n, "integer overflow");
        return Value::integer(-as_int(v));
      }
      case N::Binary: return binary(n, n.str, eval(*n.kids[0], f), eval(*n.kids[1], f));
      case N::And: {
        Value a = eval(*n.kids[0], f);
        return truthy(a) ? eval(*n.kids[1], f) : a;
      }
      case N::Or: {
        Value a = eval(*n.kids[0], f);
        return truthy(a) ? a : eval(*n.kids[1], f);
      }
      case N::Not: return Value::boolean(!truthy(eval(*n.kids[0], f)));
      case N::CondExpr: {
        if (truthy(eval(*n.kids[0], f))) return eval(*n.kids[1], f);
        return n.kids.size() > 2 ? eval(*n.kids[2], f) : Value::undefined();
      }
      case N::Concat: {
        std::string s;
        for (const auto& k : n.kids) {
          s += to_str(eval(*k, f));
          if (s.size() > kMaxString) err(n, "a string larger than 16 MiB");
        }
        return check_str(n, std::move(s));
      }
      default:
        err(n, "internal: not an expression");
    }
  }

  [[noreturn]] void undefined_error(const Node& n, const Value& v, const std::string& what) const {
    err(n, (v.s.empty() ? std::string("a value") : "'" + v.s + "'") + " is undefined (" + what + ")");
  }

  Value get_attr(const Node& n, const Value& obj, const std::string& name) {
    if (obj.kind == Kind::Undefined) undefined_error(n, obj, "reading ." + name);
    if (obj.kind == Kind::Dict || obj.kind == Kind::Namespace) {
      if (const Value* v = obj.find(name)) return *v;
    }
    return Value::undefined(name);
  }

  Value get_item(const Node& n, const Value& obj, const Value& key) {
    if (obj.kind == Kind::Undefined) undefined_error(n, obj, "reading an item");
    if (obj.kind == Kind::Dict || obj.kind == Kind::Namespace) {
      if (key.kind == Kind::String)
        if (const Value* v = obj.find(key.s)) return *v;
      return Value::undefined(key.kind == Kind::String ? key.s : "");
    }
    if (obj.kind == Kind::List || obj.kind == Kind::String) {
      if (key.kind != Kind::Int && key.kind != Kind::Bool) {
        if (key.kind == Kind::String) return Value::undefined(key.s);  // attribute-style lookup of a method name
        err(n, std::string("indices must be integers, not ") + type_name(key));
      }
      std::int64_t k = as_int(key);
      if (obj.kind == Kind::List) {
        const auto len = static_cast<std::int64_t>(obj.list->size());
        if (k < 0) k += len;
        if (k < 0 || k >= len) return Value::undefined("index " + std::to_string(as_int(key)));
        return (*obj.list)[static_cast<std::size_t>(k)];
      }
      const auto o = cp_offsets(obj.s);
      const auto len = static_cast<std::int64_t>(o.size()) - 1;
      if (k < 0) k += len;
      if (k < 0 || k >= len) return Value::undefined("index " + std::to_string(as_int(key)));
      return Value::string(obj.s.substr(o[static_cast<std::size_t>(k)], o[static_cast<std::size_t>(k) + 1] - o[static_cast<std::size_t>(k)]));
    }
    err(n, std::string("'") + type_name(obj) + "' object is not subscriptable");
  }

  Value slice(const Node& n, Frame& f) {
    const Value obj = eval(*n.kids[0], f);
    std::optional<std::int64_t> part[3];
    for (int k = 0; k < 3; ++k) {
      if (!n.kids[static_cast<std::size_t>(k) + 1]) continue;
      const Value v = eval(*n.kids[static_cast<std::size_t>(k) + 1], f);
      if (v.kind == Kind::None) continue;
      if (v.kind != Kind::Int && v.kind != Kind::Bool) err(n, "slice indices must be integers or none");
      part[k] = as_int(v);
    }
    if (obj.kind == Kind::Undefined) undefined_error(n, obj, "slicing");
    if (obj.kind != Kind::List && obj.kind != Kind::String) err(n, std::string("'") + type_name(obj) + "' object is not subscriptable");
    const std::int64_t step_v = part[2].value_or(1);
    if (step_v == 0) err(n, "slice step cannot be zero");
    const std::vector<std::size_t> o = obj.kind == Kind::String ? cp_offsets(obj.s) : std::vector<std::size_t>{};
    const std::int64_t len = obj.kind == Kind::String ? static_cast<std::int64_t>(o.size()) - 1 : static_cast<std::int64_t>(obj.list->size());
    // Python's slice.indices
    const auto clamp = [&](std::optional<std::int64_t> x, std::int64_t def) {
      if (!x) return def;
      std::int64_t v = *x;
      if (v < 0) {
        v += len;
        if (v < 0) v = step_v < 0 ? -1 : 0;
      } else if (v >= len) {
        v = step_v < 0 ? len - 1 : len;
      }
      return v;
    };
    const std::int64_t start = clamp(part[0], step_v < 0 ? len - 1 : 0);
    const std::int64_t stop = clamp(part[1], step_v < 0 ? -1 : len);
    std::vector<std::int64_t> idx;
    for (std::int64_t k = start; step_v > 0 ? k < stop : k > stop; k += step_v) {
      idx.push_back(k);
      step(n);
    }
    if (obj.kind == Kind::String) {
      std::string s;
      for (auto k : idx) s += obj.s.substr(o[static_cast<std::size_t>(k)], o[static_cast<std::size_t>(k) + 1] - o[static_cast<std::size_t>(k)]);
      return Value::string(std::move(s));
    }
    List l;
    for (auto k : idx) l.push_back((*obj.list)[static_cast<std::size_t>(k)]);
    return Value::make_list(std::move(l));
  }

  Value binary(const Node& n, const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in" || op == "not in") {
      const bool r = contains(n, b, a);
      return Value::boolean(op == "in" ? r : !r);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      const int c = compare(n, a, b);
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (a.kind == Kind::Undefined) undefined_error(n, a, "operator " + op);
    if (b.kind == Kind::Undefined) undefined_error(n, b, "operator " + op);
    if (op == "+") {
      if (a.kind == Kind::String && b.kind == Kind::String) return check_str(n, a.s + b.s);
      if (a.kind == Kind::List && b.kind == Kind::List) {
        if (a.list->size() + b.list->size() > kMaxList) err(n, "a list longer than the template limit");
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        step(n, static_cast<std::int64_t>(l.size()));
        return Value::make_list(std::move(l));
      }
    }
    if (op == "*") {
      const Value* seq = a.kind == Kind::String || a.kind == Kind::List ? &a : b.kind == Kind::String || b.kind == Kind::List ? &b : nullptr;
      const Value* cnt = seq == &a ? &b : &a;
      if (seq && (cnt->kind == Kind::Int || cnt->kind == Kind::Bool)) {
        const std::int64_t times = std::max<std::int64_t>(0, as_int(*cnt));
        const std::size_t unit = seq->kind == Kind::String ? seq->s.size() : seq->list->size();
        if (unit > 0 && static_cast<double>(unit) * static_cast<double>(times) > static_cast<double>(seq->kind == Kind::String ? kMaxString : kMaxList))
          err(n, "a repetition larger than the template limit");
        if (seq->kind == Kind::String) {
          std::string s;
          for (std::int64_t k = 0; k < times; ++k) s += seq->s;
          return check_str(n, std::move(s));
        }
        List l;
        for (std::int64_t k = 0; k < times; ++k) l.insert(l.end(), seq->list->begin(), seq->list->end());
        step(n, static_cast<std::int64_t>(l.size()));
        return Value::make_list(std::move(l));
      }
    }
    if (!is_number(a) || !is_number(b))
      err(n, "unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    const bool fl = a.kind == Kind::Float || b.kind == Kind::Float;
    if (op == "/") {
      if (as_double(b) == 0) err(n, "division by zero");
      return Value::number(as_double(a) / as_double(b));
    }
    if (fl) {
      const double x = as_double(a), y = as_double(b);
      if (op == "+") return Value::number(x + y);
      if (op == "-") return Value::number(x - y);
      if (op == "*") return Value::number(x * y);
      if (op == "**") return Value::number(std::pow(x, y));
      if (y == 0) err(n, "float division by zero");
      if (op == "//") return Value::number(std::floor(x / y));
      if (op == "%") {
        double r = std::fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value::number(r);
      }
    } else {
      const std::int64_t x = as_int(a), y = as_int(b);
      std::int64_t r = 0;
      if (op == "+") {
        if (__builtin_add_overflow(x, y, &r)) err(n, "integer overflow");
        return Value::integer(r);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(x, y, &r)) err(n, "integer overflow");
        return Value::integer(r);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(x, y, &r)) err(n, "integer overflow");
        return Value::integer(r);
      }
      if (op == "**") {
        if (y < 0) return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
        r = 1;
        for (std::int64_t k = 0; k < y; ++k) {
          if (__builtin_mul_overflow(r, x, &r)) err(n, "integer overflow");
          if (r == 0 || r == 1) break;
          step(n);
        }
        if (r == 1 && x == -1 && (y % 2)) r = -1;
        return Value::integer(r);
      }
      if (y == 0) err(n, "integer division or modulo by zero");
      if (x == std::numeric_limits<std::int64_t>::min() && y == -1) err(n, "integer overflow");
      std::int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::integer(op == "//" ? q : m);
    }
    err(n, "unsupported operator " + op);
  }

  int compare(const Node& n, const Value& a, const Value& b) {
    if (is_number(a) && is_number(b)) {
      if (a.kind == Kind::Float || b.kind == Kind::Float) {
        const double x = as_double(a), y = as_double(b);
        return x < y ? -1 : x > y ? 1 : 0;
      }
      return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b) ? 1 : 0;
    }
    if (a.kind == Kind::String && b.kind == Kind::String) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
    if (a.kind == Kind::List && b.kind == Kind::List) {
      for (std::size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
        if (equal((*a.list)[k], (*b.list)[k])) continue;
        return compare(n, (*a.list)[k], (*b.list)[k]);
      }
      return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
    }
    err(n, std::string("'<' not supported between '") + type_name(a) + "' and '" + type_name(b) + "'");
  }

  bool contains(const Node& n, const Value& hay, const Value& needle) {
    switch (hay.kind) {
      case Kind::Undefined: return false;
      case Kind::String:
        if (needle.kind != Kind::String) err(n, std::string("'in <string>' requires a string, not ") + type_name(needle));
        return hay.s.find(needle.s) != std::string::npos;
      case Kind::List:
        for (const auto& x : *hay.list)
          if (equal(x, needle)) return true;
        return false;
      case Kind::Dict: case Kind::Namespace:
        return needle.kind == Kind::String && hay.find(needle.s) != nullptr;
      default:
        err(n, std::string("argument of type '") + type_name(hay) + "' is not iterable");
    }
  }

  // ---- calls ----
  struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
  };
  Args eval_args(const Node& n, Frame& f, std::size_t first) {
    Args a;
    for (std::size_t k = first; k < n.kids.size(); ++k) a.pos.push_back(eval(*n.kids[k], f));
    for (const auto& kv : n.kwargs) a.kw.emplace_back(kv.first, eval(*kv.second, f));
    return a;
  }
  // Argument `k` by position or keyword, or nullptr.
  static const Value* arg(const Args& a, std::size_t k, const char* name) {
    if (k < a.pos.size()) return &a.pos[k];
    for (const auto& kv : a.kw)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
  void check_args(const Node& n, const Args& a, std::size_t max_pos, std::initializer_list<const char*> names, const std::string& what) {
    if (a.pos.size() > max_pos) err(n, what + ": too many arguments");
    for (const auto& kv : a.kw)
      if (std::find_if(names.begin(), names.end(), [&](const char* x) { return kv.first == x; }) == names.end())
        err(n, what + ": unexpected argument '" + kv.first + "'");
  }
  std::string want_str(const Node& n, const Value* v, const std::string& what) {
    if (!v || v->kind != Kind::String) err(n, what + " must be a string");
    return v->s;
  }

  Value call(const Node& n, Frame& f) {
    const Node& callee = *n.kids[0];
    if (callee.kind == N::Attr) {  // a method call
      const Value obj = eval(*callee.kids[0], f);
      if (obj.kind == Kind::String || obj.kind == Kind::Dict || obj.kind == Kind::List) {
        const Value* member = obj.kind == Kind::Dict ? obj.find(callee.str) : nullptr;
        if (!member || member->kind != Kind::Macro) return method(n, obj, callee.str, eval_args(n, f, 1));
      }
      if (obj.kind == Kind::Undefined) undefined_error(n, obj, "calling ." + callee.str + "()");
      const Value fn = get_attr(callee, obj, callee.str);
      return call_value(n, fn, eval_args(n, f, 1));
    }
    const Value fn = eval(callee, f);
    return call_value(n, fn, eval_args(n, f, 1));
  }

  Value call_value(const Node& n, const Value& fn, const Args& a) {
    if (fn.kind == Kind::Macro) return call_macro(n, *fn.macro, a);
    if (fn.kind != Kind::Function) {
      if (fn.kind == Kind::Undefined) undefined_error(n, fn, "called as a function");
      err(n, std::string("'") + type_name(fn) + "' object is not callable");
    }
    const std::string& name = fn.s;
    if (name == "raise_exception") {
      const Value* m = arg(a, 0, "message");
      throw UserError(t_.name + ":" + std::to_string(n.line) + ": the chat template raised an error: " + (m ? to_str(*m) : std::string()));
    }
    if (name == "range") {
      check_args(n, a, 3, {}, "range()");
      std::int64_t start = 0, stop = 0, stp = 1;
      for (const auto& v : a.pos)
        if (v.kind != Kind::Int && v.kind != Kind::Bool) err(n, "range() takes integers");
      if (a.pos.size() == 1) stop = as_int(a.pos[0]);
      else if (a.pos.size() >= 2) start = as_int(a.pos[0]), stop = as_int(a.pos[1]);
      else err(n, "range() needs an argument");
      if (a.pos.size() == 3) stp = as_int(a.pos[2]);
      if (stp == 0) err(n, "range() step must not be zero");
      const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(stp));
      if (count > static_cast<double>(kMaxRange)) err(n, "range() longer than " + std::to_string(kMaxRange));
      List l;
      for (std::int64_t k = start; stp > 0 ? k < stop : k > stop; k += stp) l.push_back(Value::integer(k));
      step(n, static_cast<std::int64_t>(l.size()));
      return Value::make_list(std::move(l));
    }
    if (name == "namespace" || name == "dict") {
      Dict d;
      if (!a.pos.empty()) {
        if (a.pos.size() > 1 || a.pos[0].kind != Kind::Dict) err(n, name + "() takes one mapping and keyword arguments");
        d = *a.pos[0].dict;
      }
      for (const auto& kv : a.kw) {
        bool found = false;
        for (auto& x : d)
          if (x.first == kv.first) x.second = kv.second, found = true;
        if (!found) d.push_back(kv);
      }
      Value v = Value::make_dict(std::move(d));
      if (name == "namespace") v.kind = Kind::Namespace;
      return v;
    }
    if (name == "strftime_now") {
      const std::string fmt = want_str(n, arg(a, 0, "format"), "strftime_now's format");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const std::size_t len = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value::string(std::string(buf, len));
    }
    err(n, "unsupported function '" + name + "'");
  }

  Value call_macro(const Node& n, const MacroDef& m, const Args& a) {
    if (call_depth_ >= kMaxCallDepth) err(n, "macros call each other deeper than " + std::to_string(kMaxCallDepth) + " levels");
    if (a.pos.size() > m.params.size()) err(n, "macro '" + m.name + "' takes " + std::to_string(m.params.size()) + " arguments");
    Frame local(root_);
    for (std::size_t k = 0; k < m.params.size(); ++k) {
      const Value* v = arg(a, k, m.params[k].c_str());
      if (v) local.set(m.params[k], *v);
      else if (m.defaults[k]) local.set(m.params[k], eval(*m.defaults[k], local));
      else local.set(m.params[k], Value::undefined(m.params[k]));
    }
    for (const auto& kv : a.kw)
      if (std::find(m.params.begin(), m.params.end(), kv.first) == m.params.end())
        err(n, "macro '" + m.name + "' has no argument '" + kv.first + "'");
    std::string captured;
    std::string* saved = buf_;
    buf_ = &captured;
    ++call_depth_;
    ++capture_depth_;
    try {
      exec(*m.body, local);
    } catch (...) {
      buf_ = saved;
      --call_depth_;
      --capture_depth_;
      throw;
    }
    buf_ = saved;
    --call_depth_;
    --capture_depth_;
    return Value::string(std::move(captured));
  }

  // ---- methods of str, dict, list ----
  Value method(const Node& n, const Value& obj, const std::string& name, const Args& a) {
    const std::string what = std::string(type_name(obj)) + "." + name + "()";
    if (obj.kind == Kind::Dict) {
      if (name == "items" || name == "keys" || name == "values") {
        check_args(n, a, 0, {}, what);
        List l;
        for (const auto& kv : *obj.dict) {
          if (name == "items") l.push_back(Value::make_tuple({Value::string(kv.first), kv.second}));
          else if (name == "keys") l.push_back(Value::string(kv.first));
          else l.push_back(kv.second);
        }
        return Value::make_list(std::move(l));
      }
      if (name == "get") {
        check_args(n, a, 2, {}, what);
        if (a.pos.empty()) err(n, what + " needs a key");
        if (a.pos[0].kind == Kind::String)
          if (const Value* v = obj.find(a.pos[0].s)) return *v;
        return a.pos.size() > 1 ? a.pos[1] : Value::none();
      }
      err(n, "unsupported method " + what + " (mgrl's template subset: docs/sft.md)");
    }
    if (obj.kind == Kind::List) {
      if (name == "index" || name == "count") {
        check_args(n, a, 1, {}, what);
        if (a.pos.empty()) err(n, what + " needs an argument");
        std::int64_t c = 0;
        for (std::size_t k = 0; k < obj.list->size(); ++k)
          if (equal((*obj.list)[k], a.pos[0])) {
            if (name == "index") return Value::integer(static_cast<std::int64_t>(k));
            ++c;
          }
        if (name == "index") err(n, "list.index(x): x not in list");
        return Value::integer(c);
      }
      err(n, "unsupported method " + what + " (lists are read-only in chat templates)");
    }
    const std::string& s = obj.s;
    if (name == "startswith" || name == "endswith") {
      check_args(n, a, 1, {}, what);
      if (a.pos.empty()) err(n, what + " needs an argument");
      std::vector<std::string> cands;
      if (a.pos[0].kind == Kind::String) cands.push_back(a.pos[0].s);
      else if (a.pos[0].kind == Kind::List)
        for (const auto& x : *a.pos[0].list) cands.push_back(want_str(n, &x, what + "'s argument"));
      else err(n, what + " takes a string or a tuple of strings");
      for (const auto& c : cands) {
        if (c.size() > s.size()) continue;
        if (name == "startswith" ? s.compare(0, c.size(), c) == 0 : s.compare(s.size() - c.size(), c.size(), c) == 0)
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      check_args(n, a, 1, {}, what);
      const Value* chars = arg(a, 0, "chars");
      return Value::string(py_strip(n, s, chars && chars->kind != Kind::None ? chars : nullptr, name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      check_args(n, a, 2, {"sep", "maxsplit"}, what);
      const Value* sep = arg(a, 0, "sep");
      const Value* maxs = arg(a, 1, "maxsplit");
      std::int64_t maxsplit = maxs ? as_int(*maxs) : -1;
      if (maxs && maxs->kind != Kind::Int) err(n, what + ": maxsplit must be an integer");
      List parts;
      if (!sep || sep->kind == Kind::None) {
        if (name == "rsplit" && maxsplit >= 0) err(n, "unsupported: rsplit() on whitespace with maxsplit");
        std::size_t p = skip_py_space(s, 0);
        while (p < s.size()) {
          if (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) == maxsplit) {
            parts.push_back(Value::string(rstrip_py(s.substr(p))));
            break;
          }
          std::size_t q = p;
          while (q < s.size()) {
            std::size_t k = q;
            if (uc::is_python_space(uc::utf8_next(s, k))) break;
            q = k;
          }
          parts.push_back(Value::string(s.substr(p, q - p)));
          p = skip_py_space(s, q);
        }
      } else {
        const std::string d = want_str(n, sep, what + "'s separator");
        if (d.empty()) err(n, what + ": empty separator");
        if (name == "split") {
          std::size_t p = 0;
          while (true) {
            const std::size_t q = (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) >= maxsplit) ? std::string::npos : s.find(d, p);
            if (q == std::string::npos) {
              parts.push_back(Value::string(s.substr(p)));
              break;
            }
            parts.push_back(Value::string(s.substr(p, q - p)));
            p = q + d.size();
          }
        } else {
          std::vector<std::string> rev;
          std::size_t end = s.size();
          while (true) {
            const bool done = maxsplit >= 0 && static_cast<std::int64_t>(rev.size()) >= maxsplit;
            const std::size_t q = done || end < d.size() ? std::string::npos : s.rfind(d, end - d.size());
            if (q == std::string::npos) {
              rev.push_back(s.substr(0, end));
              break;
            }
            rev.push_back(s.substr(q + d.size(), end - q - d.size()));
            end = q;
          }
          for (auto it = rev.rbegin(); it != rev.rend(); ++it) parts.push_back(Value::string(*it));
        }
      }
      step(n, static_cast<std::int64_t>(parts.size()));
      return Value::make_list(std::move(parts));
    }
    if (name == "upper" || name == "lower") {
      check_args(n, a, 0, {}, what);
      return Value::string(case_map(s, name == "upper"));
    }
    if (name == "title" || name == "capitalize") {
      check_args(n, a, 0, {}, what);
      return Value::string(name == "title" ? title(s) : capitalize(s));
    }
    if (name == "replace") {
      check_args(n, a, 3, {}, what);
      if (a.pos.size() < 2) err(n, what + " needs two arguments");
      return check_str(n, replace(n, s, want_str(n, &a.pos[0], what), want_str(n, &a.pos[1], what),
                                  a.pos.size() > 2 ? as_int(a.pos[2]) : -1));
    }
    if (name == "find" || name == "rfind" || name == "count") {
      check_args(n, a, 1, {}, what);
      const std::string sub = want_str(n, arg(a, 0, "sub"), what + "'s argument");
      if (name == "count") {
        if (sub.empty()) return Value::integer(static_cast<std::int64_t>(cp_offsets(s).size()));
        std::int64_t c = 0;
        for (std::size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++c;
        return Value::integer(c);
      }
      const std::size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
      if (p == std::string::npos) return Value::integer(-1);
      return Value::integer(static_cast<std::int64_t>(cp_offsets(s.substr(0, p)).size()) - 1);
    }
    if (name == "join") {
      check_args(n, a, 1, {}, what);
      if (a.pos.empty()) err(n, what + " needs an argument");
      std::string out;
      const auto items = iterate(n, a.pos[0]);
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k) out += s;
        out += want_str(n, &items[k], what + "'s items");
        if (out.size() > kMaxString) err(n, "a string larger than 16 MiB");
      }
      return check_str(n, std::move(out));
    }
    if (name == "isdigit" || name == "isalpha" || name == "isspace") {
      check_args(n, a, 0, {}, what);
      if (s.empty()) return Value::boolean(false);
      for (char32_t c : code_points(s)) {
        const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
        const bool ok = name == "isspace" ? uc::is_python_space(c)
                        : name == "isdigit" ? cat == UTF8PROC_CATEGORY_ND
                                            : (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO);
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    }
    err(n, "unsupported method " + what + " (mgrl's template subset: docs/sft.md)");
  }

  std::string py_strip(const Node& n, const std::string& s, const Value* chars, bool left, bool right) {
    std::vector<char32_t> set;
    if (chars) {
      if (chars->kind != Kind::String) err(n, "strip's argument must be a string");
      set = code_points(chars->s);
    }
    const auto strip_it = [&](char32_t c) {
      return chars ? std::find(set.begin(), set.end(), c) != set.end() : uc::is_python_space(c);
    };
    const auto o = cp_offsets(s);
    std::size_t b = 0, e = o.size() - 1;
    const auto cp_at = [&](std::size_t k) {
      std::size_t p = o[k];
      return uc::utf8_next(s, p);
    };
    if (left)
      while (b < e && strip_it(cp_at(b))) ++b;
    if (right)
      while (e > b && strip_it(cp_at(e - 1))) --e;
    return s.substr(o[b], o[e] - o[b]);
  }

  // Upper-cases the first character of each word and lower-cases the rest; a word begins at the start and after a
  // character c for which ends_word(c).
  template <class EndsWord>
  static std::string title_case(const std::string& s, EndsWord ends_word) {
    std::string out;
    bool begins = true;
    for (char32_t c : code_points(s)) {
      const auto m = begins ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) : utf8proc_tolower(static_cast<utf8proc_int32_t>(c));
      uc::utf8_append(out, static_cast<char32_t>(m));
      begins = ends_word(c);
    }
    return out;
  }
  // Python's str.title (the .title() method): a word is a run of cased characters.
  static std::string title(const std::string& s) {
    return title_case(s, [](char32_t c) { return !(is_cased_lower(c) || is_cased_upper(c)); });
  }
  // Jinja's |title filter: words begin after a run of whitespace, '-', '(', '{', '[' or '<' (its
  // _word_beginning_split_re) and at the start; every other character is lowered. "<tool_response>r"|title is
  // "<Tool_response>r" (str.title gives "<Tool_Response>R").
  static std::string title_filter(const std::string& s) {
    return title_case(s, [](char32_t c) {
      return uc::is_python_space(c) || c == U'-' || c == U'(' || c == U'{' || c == U'[' || c == U'<';
    });
  }
  static std::string capitalize(const std::string& s) {
    std::string out;
    bool first = true;
    for (char32_t c : code_points(s)) {
      const auto m = first ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) : utf8proc_tolower(static_cast<utf8proc_int32_t>(c));
      uc::utf8_append(out, static_cast<char32_t>(m));
      first = false;
    }
    return out;
  }
  std::string replace(const Node& n, const std::string& s, const std::string& from, const std::string& to, std::int64_t count) {
    std::string out;
    if (from.empty()) {  // Python inserts `to` around every character
      const auto o = cp_offsets(s);
      std::int64_t done = 0;
      for (std::size_t k = 0; k + 1 < o.size(); ++k) {
        if (count < 0 || done < count) out += to, ++done;
        out += s.substr(o[k], o[k + 1] - o[k]);
        if (out.size() > kMaxString) err(n, "a string larger than 16 MiB");
      }
      if (count < 0 || done < count) out += to;
      return out;
    }
    std::size_t p = 0;
    std::int64_t done = 0;
    while (count < 0 || done < count) {
      const std::size_t q = s.find(from, p);
      if (q == std::string::npos) break;
      out.append(s, p, q - p);
      out += to;
      p = q + from.size();
      ++done;
      if (out.size() > kMaxString) err(n, "a string larger than 16 MiB");
    }
    out.append(s, p, std::string::npos);
    return out;
  }

  // ---- filters ----
  Value filter(const Node& n, Frame& f) {
    const Value v = eval(*n.kids[0], f);
    const Args a = eval_args(n, f, 1);
    return apply_filter(n, n.str, v, a, f);
  }

  Value attribute_of(const Node& n, const Value& item, const std::string& path) {
    Value cur = item;
    std::size_t p = 0;
    while (true) {
      const std::size_t q = path.find('.', p);
      const std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
      if (cur.kind == Kind::Undefined) return cur;
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
      if (digits && cur.kind == Kind::List) {
        errno = 0;
        const long long k = std::strtoll(part.c_str(), nullptr, 10);
        cur = errno == ERANGE ? Value::undefined(part) : get_item(n, cur, Value::integer(k));
      }
      else if (cur.kind == Kind::Dict || cur.kind == Kind::Namespace) cur = get_attr(n, cur, part);
      else cur = Value::undefined(part);
      if (q == std::string::npos) return cur;
      p = q + 1;
    }
  }

  Value apply_filter(const Node& n, const std::string& name, const Value& v, const Args& a, Frame& f) {
    const std::string what = "filter '" + name + "'";
    if (name == "safe") return v;
    if (name == "trim") {
      check_args(n, a, 1, {"chars"}, what);
      const Value* chars = arg(a, 0, "chars");
      return Value::string(py_strip(n, to_str(v), chars && chars->kind != Kind::None ? chars : nullptr, true, true));
    }
    if (name == "length" || name == "count") {
      check_args(n, a, 0, {}, what);
      switch (v.kind) {
        case Kind::Undefined: return Value::integer(0);
        case Kind::String: return Value::integer(static_cast<std::int64_t>(cp_offsets(v.s).size()) - 1);
        case Kind::List: return Value::integer(static_cast<std::int64_t>(v.list->size()));
        case Kind::Dict: case Kind::Namespace: return Value::integer(static_cast<std::int64_t>(v.dict->size()));
        default: err(n, std::string("object of type '") + type_name(v) + "' has no len()");
      }
    }
    if (name == "string") return Value::string(to_str(v));
    if (name == "upper" || name == "lower") return Value::string(case_map(to_str(v), name == "upper"));
    if (name == "capitalize") return Value::string(capitalize(to_str(v)));
    if (name == "title") return Value::string(title_filter(to_str(v)));
    if (name == "default" || name == "d") {
      check_args(n, a, 2, {"default_value", "boolean"}, what);
      const Value* def = arg(a, 0, "default_value");
      const Value* boolean = arg(a, 1, "boolean");
      const bool use = v.kind == Kind::Undefined || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (def ? *def : Value::string("")) : v;
    }
    if (name == "tojson") {
      check_args(n, a, 1, {"indent", "ensure_ascii", "separators", "sort_keys"}, what);
      JsonStyle st;
      if (const Value* ind = arg(a, 0, "indent"); ind && ind->kind != Kind::None) {
        if (ind->kind != Kind::Int) err(n, "tojson: indent must be an integer");
        st.indent = static_cast<int>(std::clamp<std::int64_t>(ind->i, 0, 64));
        st.item_sep = ",";
      }
      for (const auto& kv : a.kw) {
        if (kv.first == "sort_keys") st.sort_keys = truthy(kv.second);
        if (kv.first == "ensure_ascii" && truthy(kv.second)) err(n, "unsupported: tojson(ensure_ascii=true)");
        if (kv.first == "separators" && kv.second.kind != Kind::None) {
          if (kv.second.kind != Kind::List || kv.second.list->size() != 2 || (*kv.second.list)[0].kind != Kind::String ||
              (*kv.second.list)[1].kind != Kind::String)
            err(n, "tojson: separators must be two strings");
          st.item_sep = (*kv.second.list)[0].s;
          st.key_sep = (*kv.second.list)[1].s;
        }
      }
      std::string out, e;
      if (!json_dump(out, v, st, 0, &e)) err(n, "tojson: " + e);
      return check_str(n, std::move(out));
    }
    if (name == "join") {
      check_args(n, a, 2, {"d", "attribute"}, what);
      const Value* sep = arg(a, 0, "d");
      const Value* attr = arg(a, 1, "attribute");
      std::string out;
      const auto items = iterate(n, v);
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k && sep) out += to_str(*sep);
        out += to_str(attr ? attribute_of(n, items[k], to_str(*attr)) : items[k]);
        if (out.size() > kMaxString) err(n, "a string larger than 16 MiB");
      }
      return check_str(n, std::move(out));
    }
    if (name == "first" || name == "last") {
      const auto items = iterate(n, v);
      if (items.empty()) return Value::undefined(name);
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return Value::make_list(iterate(n, v));
    if (name == "reverse") {
      if (v.kind == Kind::String) {
        auto cps = code_points(v.s);
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) uc::utf8_append(out, *it);
        return Value::string(out);
      }
      auto items = iterate(n, v);
      std::reverse(items.begin(), items.end());
      return Value::make_list(std::move(items));
    }
    if (name == "items") {
      if (v.kind == Kind::Undefined) return Value::make_list({});
      if (v.kind != Kind::Dict) err(n, "filter 'items' needs a mapping, got " + std::string(type_name(v)));
      List l;
      for (const auto& kv : *v.dict) l.push_back(Value::make_tuple({Value::string(kv.first), kv.second}));
      return Value::make_list(std::move(l));
    }
    if (name == "dictsort") {
      if (v.kind != Kind::Dict) err(n, "filter 'dictsort' needs a mapping");
      check_args(n, a, 0, {}, what);
      List l;
      for (const auto& kv : *v.dict) l.push_back(Value::make_tuple({Value::string(kv.first), kv.second}));
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
        return case_map((*x.list)[0].s, 0) < case_map((*y.list)[0].s, 0);
      });
      return Value::make_list(std::move(l));
    }
    if (name == "int") {
      const Value* def = arg(a, 0, "default");
      const Value dflt = def ? *def : Value::integer(0);
      if (v.kind == Kind::Int) return v;
      if (v.kind == Kind::Bool) return Value::integer(as_int(v));
      // Python's int() is unbounded: a value beyond 64 bits is an error here, not the default (it gave 0 until
      // 2026-11-28, where transformers prints the number).
      const auto beyond = [&](const std::string& what) -> Value {
        err(n, "filter 'int': " + what + " is beyond a 64-bit integer");
      };
      if (v.kind == Kind::Float) {
        if (!std::isfinite(v.f)) return dflt;
        if (std::fabs(v.f) >= 9.2233720368547758e18) beyond(float_repr(v.f));
        return Value::integer(static_cast<std::int64_t>(v.f));
      }
      if (v.kind == Kind::String) {
        const std::string t = py_strip(n, v.s, nullptr, true, true);
        // Python's int(s, 10) and float(s) read decimal only: "0x1f" is the default (strtod reads hex: 31 until
        // 2026-11-28).
        if (t.empty() || t.find_first_of("xX") != std::string::npos) return dflt;
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(t.c_str(), &end, 10);
        if (end && *end == 0 && errno == 0) return Value::integer(x);
        if (end && *end == 0 && errno == ERANGE) beyond(t);
        const double d = std::strtod(t.c_str(), &end);
        if (end && *end == 0 && std::isfinite(d)) {
          if (std::fabs(d) >= 9.2233720368547758e18) beyond(t);
          return Value::integer(static_cast<std::int64_t>(d));
        }
      }
      return dflt;
    }
    if (name == "float") {
      const Value* def = arg(a, 0, "default");
      if (is_number(v)) return Value::number(as_double(v));
      if (v.kind == Kind::String) {
        const std::string t = py_strip(n, v.s, nullptr, true, true);
        char* end = nullptr;
        const double d = t.find_first_of("xX") != std::string::npos ? 0.0 : std::strtod(t.c_str(), &end);
        if (!t.empty() && end && *end == 0) return Value::number(d);
      }
      return def ? *def : Value::number(0.0);
    }
    if (name == "abs") {
      if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
      if (v.kind == Kind::Int || v.kind == Kind::Bool) {
        if (as_int(v) == std::numeric_limits<std::int64_t>::min()) err(n, "integer overflow");
        return Value::integer(std::llabs(as_int(v)));
      }
      err(n, std::string("bad operand type for abs(): '") + type_name(v) + "'");
    }
    if (name == "round") {
      check_args(n, a, 2, {"precision", "method"}, what);
      if (!is_number(v)) err(n, "filter 'round' needs a number");
      const Value* pr = arg(a, 0, "precision");
      const Value* method_v = arg(a, 1, "method");
      const std::string method_s = method_v ? to_str(*method_v) : "common";
      if (method_s != "common" && method_s != "floor" && method_s != "ceil")
        err(n, "filter 'round': method must be 'common', 'ceil' or 'floor'");
      const std::int64_t p = pr ? as_int(*pr) : 0;
      if (method_s == "common") {  // Python's round(): an int stays an int; halves go to the even neighbour of the
                                   // exact binary value (2.5 -> 2.0, 2.675 -> 2.67); until 2026-11-28 half away from 0
        if (v.kind == Kind::Int && p >= 0) return v;
        const double x = as_double(v);
        if (!std::isfinite(x)) return Value::number(x);
        if (p >= 0 && p <= 340) {
          const int len = std::snprintf(nullptr, 0, "%.*f", static_cast<int>(p), x);  // glibc: exact, ties to even
          std::string buf(static_cast<std::size_t>(len) + 1, '\0');
          std::snprintf(buf.data(), buf.size(), "%.*f", static_cast<int>(p), x);
          return Value::number(std::strtod(buf.c_str(), nullptr));
        }
        const double scale = std::pow(10.0, static_cast<double>(-std::max<std::int64_t>(-340, std::min<std::int64_t>(p, 340))));
        const double r = std::nearbyint(x / scale) * scale;  // the default rounding mode: ties to even
        if (v.kind == Kind::Int && std::fabs(r) < 9.2e18) return Value::integer(static_cast<std::int64_t>(r));
        return Value::number(r);
      }
      const double scale = std::pow(10.0, static_cast<double>(p));
      const double x = as_double(v) * scale;
      const double r = method_s == "floor" ? std::floor(x) : std::ceil(x);
      return Value::number(r / scale);
    }
    if (name == "replace") {
      check_args(n, a, 3, {"old", "new", "count"}, what);
      const Value* o = arg(a, 0, "old");
      const Value* nw = arg(a, 1, "new");
      const Value* c = arg(a, 2, "count");
      if (!o || !nw) err(n, "filter 'replace' needs two arguments");
      return check_str(n, replace(n, to_str(v), to_str(*o), to_str(*nw), c && c->kind != Kind::None ? as_int(*c) : -1));
    }
    if (name == "indent") {
      check_args(n, a, 3, {"width", "first", "blank"}, what);
      const Value* w = arg(a, 0, "width");
      const bool first = arg(a, 1, "first") && truthy(*arg(a, 1, "first"));
      const bool blank = arg(a, 2, "blank") && truthy(*arg(a, 2, "blank"));
      const std::string pad = w ? (w->kind == Kind::String ? w->s : std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(as_int(*w), 0, 256)), ' ')) : "    ";
      const std::string s = to_str(v);
      std::string out;
      std::size_t p = 0;
      bool first_line = true;
      while (true) {
        const std::size_t q = s.find('\n', p);
        const std::string line = s.substr(p, q == std::string::npos ? std::string::npos : q - p);
        if ((!first_line || first) && (blank || !line.empty() || q == std::string::npos ? !line.empty() || blank : false)) out += pad;
        out += line;
        if (q == std::string::npos) break;
        out += '\n';
        p = q + 1;
        first_line = false;
        if (out.size() > kMaxString) err(n, "a string larger than 16 MiB");
      }
      return check_str(n, std::move(out));
    }
    if (name == "wordcount") {
      std::int64_t c = 0;
      bool in_word = false;
      for (char32_t ch : code_points(to_str(v))) {
        const bool w = ch == U'_' || utf8proc_category(static_cast<utf8proc_int32_t>(ch)) <= UTF8PROC_CATEGORY_NO;
        if (w && !in_word) ++c;
        in_word = w && utf8proc_category(static_cast<utf8proc_int32_t>(ch)) != UTF8PROC_CATEGORY_CN;
      }
      return Value::integer(c);
    }
    if (name == "e" || name == "escape" || name == "forceescape") {
      std::string out;
      for (char c : to_str(v)) {
        switch (c) {
          case '&': out += "&amp;"; break;
          case '<': out += "&lt;"; break;
          case '>': out += "&gt;"; break;
          case '"': out += "&#34;"; break;
          case '\'': out += "&#39;"; break;
          default: out += c;
        }
      }
      return check_str(n, std::move(out));
    }
    if (name == "attr") {
      const Value* nm = arg(a, 0, "name");
      if (!nm || nm->kind != Kind::String) err(n, "filter 'attr' needs a name");
      if (v.kind == Kind::Dict || v.kind == Kind::Namespace) return get_attr(n, v, nm->s);
      return Value::undefined(nm->s);
    }
    if (name == "unique" || name == "min" || name == "max" || name == "sort") {
      check_args(n, a, 1, {"reverse", "case_sensitive", "attribute"}, what);
      const Value* attr = nullptr;
      bool reverse = false, case_sensitive = false;
      for (const auto& kv : a.kw) {
        if (kv.first == "attribute") attr = &kv.second;
        if (kv.first == "reverse") reverse = truthy(kv.second);
        if (kv.first == "case_sensitive") case_sensitive = truthy(kv.second);
      }
      if (!a.pos.empty()) {
        if (name == "sort") reverse = truthy(a.pos[0]);
        else case_sensitive = truthy(a.pos[0]);
      }
      auto items = iterate(n, v);
      const auto key = [&](const Value& x) {
        Value k = attr ? attribute_of(n, x, to_str(*attr)) : x;
        if (!case_sensitive && k.kind == Kind::String) k.s = case_map(k.s, 0);
        return k;
      };
      if (name == "unique") {
        List out;
        std::vector<Value> seen;
        for (const auto& x : items) {
          const Value k = key(x);
          bool dup = false;
          for (const auto& s : seen) dup = dup || equal(s, k);
          step(n, static_cast<std::int64_t>(seen.size()));
          if (!dup) seen.push_back(k), out.push_back(x);
        }
        return Value::make_list(std::move(out));
      }
      if (name == "sort") {
        step(n, static_cast<std::int64_t>(items.size()) * 20);
        std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
          const int c = compare(n, key(x), key(y));
          return reverse ? c > 0 : c < 0;
        });
        return Value::make_list(std::move(items));
      }
      if (items.empty()) return Value::undefined(name);
      std::size_t best = 0;
      for (std::size_t k = 1; k < items.size(); ++k) {
        const int c = compare(n, key(items[k]), key(items[best]));
        if (name == "min" ? c < 0 : c > 0) best = k;
      }
      return items[best];
    }
    if (name == "sum") {
      check_args(n, a, 2, {"attribute", "start"}, what);
      const Value* attr = arg(a, 0, "attribute");
      const Value* start = arg(a, 1, "start");
      Value total = start ? *start : Value::integer(0);
      for (const auto& x : iterate(n, v)) total = binary(n, "+", total, attr ? attribute_of(n, x, to_str(*attr)) : x);
      return total;
    }
    if (name == "map") {
      auto items = iterate(n, v);
      List out;
      const Value* attr = nullptr;
      const Value* def = nullptr;
      for (const auto& kv : a.kw) {
        if (kv.first == "attribute") attr = &kv.second;
        else if (kv.first == "default") def = &kv.second;
      }
      if (attr) {
        if (!a.pos.empty()) err(n, "filter 'map' takes a filter name or attribute=, not both");
        for (const auto& x : items) {
          Value r = attribute_of(n, x, to_str(*attr));
          out.push_back(r.kind == Kind::Undefined && def ? *def : r);
        }
        return Value::make_list(std::move(out));
      }
      if (a.pos.empty() || a.pos[0].kind != Kind::String) err(n, "filter 'map' needs a filter name or attribute=");
      Args rest;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      rest.kw = a.kw;
      for (const auto& x : items) out.push_back(apply_filter(n, a.pos[0].s, x, rest, f));
      return Value::make_list(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "select" || name == "selectattr";
      std::size_t k = 0;
      std::string attr;
      if (by_attr) {
        if (a.pos.empty() || a.pos[0].kind != Kind::String) err(n, "filter '" + name + "' needs an attribute name");
        attr = a.pos[0].s;
        k = 1;
      }
      if (!a.kw.empty()) err(n, "filter '" + name + "': unexpected keyword argument");
      std::string test_name;
      std::vector<Value> test_args;
      if (k < a.pos.size()) {
        if (a.pos[k].kind != Kind::String) err(n, "filter '" + name + "': the test name must be a string");
        test_name = a.pos[k].s;
        test_args.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k) + 1, a.pos.end());
      }
      List out;
      for (const auto& x : iterate(n, v)) {
        const Value subject = by_attr ? attribute_of(n, x, attr) : x;
        const bool r = test_name.empty() ? truthy(subject) : run_test(n, test_name, subject, test_args);
        if (r == keep_if) out.push_back(x);
        step(n);
      }
      return Value::make_list(std::move(out));
    }
    err(n, "unsupported filter '" + name + "' (mgrl's template subset: docs/sft.md)");
  }

  // ---- tests ----
  bool test(const Node& n, Frame& f) {
    const Value v = eval(*n.kids[0], f);
    const Args a = eval_args(n, f, 1);
    if (!a.kw.empty()) err(n, "test '" + n.str + "': keyword arguments are not supported");
    return run_test(n, n.str, v, a.pos);
  }

  bool run_test(const Node& n, const std::string& name, const Value& v, const std::vector<Value>& a) {
    const auto need = [&](std::size_t k) {
      if (a.size() < k) err(n, "test '" + name + "' needs an argument");
    };
    if (name == "defined") return v.kind != Kind::Undefined;
    if (name == "undefined") return v.kind == Kind::Undefined;
    if (name == "none") return v.kind == Kind::None;
    if (name == "boolean") return v.kind == Kind::Bool;
    if (name == "true") return v.kind == Kind::Bool && v.b;
    if (name == "false") return v.kind == Kind::Bool && !v.b;
    if (name == "integer") return v.kind == Kind::Int;
    if (name == "float") return v.kind == Kind::Float;
    if (name == "number") return is_number(v);
    if (name == "string") return v.kind == Kind::String;
    if (name == "mapping") return v.kind == Kind::Dict;
    if (name == "iterable") return v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.kind == Kind::Undefined;
    if (name == "sequence") return v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.kind == Kind::Undefined;
    if (name == "callable") return v.kind == Kind::Function || v.kind == Kind::Macro;
    if (name == "lower" || name == "upper") {
      if (v.kind != Kind::String) return false;
      bool cased = false;
      for (char32_t c : code_points(v.s)) {
        if (name == "lower" ? is_cased_upper(c) && !is_cased_lower(c) : is_cased_lower(c) && !is_cased_upper(c)) return false;
        cased = cased || is_cased_lower(c) || is_cased_upper(c);
      }
      return cased;
    }
    if (name == "odd" || name == "even") {
      if (v.kind != Kind::Int && v.kind != Kind::Bool) err(n, "test '" + name + "' needs an integer");
      return (as_int(v) % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
      need(1);
      if (!is_number(v) || !is_number(a[0])) err(n, "test 'divisibleby' needs numbers");
      if (as_double(a[0]) == 0) err(n, "divisibleby(0)");
      return std::fmod(as_double(v), as_double(a[0])) == 0;
    }
    if (name == "sameas") {
      need(1);
      if (v.kind != a[0].kind) return false;
      if (v.kind == Kind::None || v.kind == Kind::Undefined) return true;
      if (v.kind == Kind::Bool) return v.b == a[0].b;
      return false;
    }
    if (name == "eq" || name == "equalto" || name == "==") return need(1), equal(v, a[0]);
    if (name == "ne" || name == "!=") return need(1), !equal(v, a[0]);
    if (name == "lt" || name == "lessthan" || name == "<") return need(1), compare(n, v, a[0]) < 0;
    if (name == "le" || name == "<=") return need(1), compare(n, v, a[0]) <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return need(1), compare(n, v, a[0]) > 0;
    if (name == "ge" || name == ">=") return need(1), compare(n, v, a[0]) >= 0;
    if (name == "in") return need(1), contains(n, a[0], v);
    err(n, "unsupported test '" + name + "' (mgrl's template subset: docs/sft.md)");
  }

  const Template::Impl& t_;
  Template::Output& out_;
  std::string* buf_;
  Frame* root_ = nullptr;
  std::int64_t steps_ = 0;
  int call_depth_ = 0;
  int capture_depth_ = 0;
  int eval_depth_ = 0;
};

}  // namespace

Template::Template(const std::string& source, std::string name) {
  auto impl = std::make_shared<Impl>();
  impl->name = std::move(name);
  if (uc::utf8_invalid_at(source) != std::string::npos) throw UserError(impl->name + ": the chat template is not valid UTF-8");
  Lexer lexer(source, impl->name);
  Parser parser(lexer.run(), impl->name);
  impl->root = parser.parse_template();
  impl->generation = parser.saw_generation;
  impl_ = std::move(impl);
}

Template::Output Template::render(const Vars& vars) const {
  Output out;
  Renderer r(*impl_, out);
  try {
    r.run(vars);
  } catch (const UserError& e) {  // a limit of the value type: name the template
    const std::string m = e.what();
    if (m.rfind(impl_->name + ":", 0) == 0) throw;
    throw UserError(impl_->name + ": " + m);
  } catch (const BreakSignal&) {
    throw UserError(impl_->name + ": 'break' outside a loop");
  } catch (const ContinueSignal&) {
    throw UserError(impl_->name + ": 'continue' outside a loop");
  }
  return out;
}

bool Template::marks_generation() const { return impl_->generation; }
const std::string& Template::name() const { return impl_->name; }

}  // namespace mgrl::io::jinja
