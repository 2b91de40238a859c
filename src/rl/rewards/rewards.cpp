// rewards.cpp: reading [[reward]] tables, the built-in reward kinds (answer_match, regex, overlong), the sandboxed
// code_exec reward and the external command reward, and scoring batches of completions.
#include "rl/rewards/rewards.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "rl/rewards/reward_function.h"
#include "rl/rewards/sandbox.h"
#include "rl/rewards/verdict.h"

namespace mgrl::rl {

// ---- pieces ----

namespace {

bool digit_at(const std::string& t, std::size_t i) { return i < t.size() && std::isdigit(static_cast<unsigned char>(t[i])); }
bool alpha_at(const std::string& t, std::size_t i) {
  return i < t.size() && (std::isalpha(static_cast<unsigned char>(t[i])) || static_cast<unsigned char>(t[i]) >= 0x80);
}
// U+2212 MINUS SIGN at i (3 bytes).
bool unicode_minus_at(const std::string& t, std::size_t i) { return t.compare(i, 3, "\xE2\x88\x92") == 0; }

// The length of the number token of NUMBER_GRAMMAR (rewards.h) starting at i without its sign: digits, optionally in
// thousands groups (1-3 digits, then groups of exactly 3 after commas), a decimal part, an exponent; or a leading
// '.' and digits. 0 when none starts there. *integer: no decimal part and no exponent.
std::size_t number_span(const std::string& t, std::size_t i, bool* integer) {
  std::size_t j = i;
  while (digit_at(t, j)) ++j;
  const std::size_t lead = j - i;
  if (lead >= 1 && lead <= 3) {  // thousands groups: ",ddd" not followed by another digit
    std::size_t k = j;
    while (k < t.size() && t[k] == ',' && digit_at(t, k + 1) && digit_at(t, k + 2) && digit_at(t, k + 3) &&
           !digit_at(t, k + 4))
      k += 4;
    j = k;
  }
  *integer = true;
  if (j < t.size() && t[j] == '.' && digit_at(t, j + 1)) {
    j += 1;
    while (digit_at(t, j)) ++j;
    *integer = false;
  }
  if (j == i) return 0;  // no digit before or after a '.'
  if (j < t.size() && (t[j] == 'e' || t[j] == 'E')) {
    std::size_t k = j + 1;
    if (k < t.size() && (t[k] == '+' || t[k] == '-')) ++k;
    if (digit_at(t, k)) {
      while (digit_at(t, k)) ++k;
      j = k;
      *integer = false;
    }
  }
  return j - i;
}

// Whether the '{' at b opens an operand of a LaTeX fraction, root, binomial, power or index ("\\frac{1}{2}",
// "2^{10}"): after '}', '^' or '_', or after one of those commands. (\\boxed{42} and the like hold an answer.)
bool latex_operand(const std::string& t, std::size_t b) {
  if (b == 0) return false;
  const char p = t[b - 1];
  if (p == '}' || p == '^' || p == '_') return true;
  std::size_t k = b;
  while (k > 0 && std::isalpha(static_cast<unsigned char>(t[k - 1]))) --k;
  if (k == b || k == 0 || t[k - 1] != '\\') return false;
  const std::string word = t.substr(k, b - k);
  for (const char* w : {"frac", "dfrac", "tfrac", "cfrac", "sqrt", "binom", "dbinom", "tbinom"})
    if (word == w) return true;
  return false;
}

}  // namespace

std::string last_number(const std::string& text) {
  // The last number token of the text, or "" when the last one is glued to something that makes it part of another
  // expression (a fraction "3/4", a power "2^10", "0x10", "x2", "1.2.3", the operand of a minus "5-3"): taking a
  // piece of such an expression as the answer let wrong completions score (a reward-hacking hunt, 2026-11-29).
  std::string best;
  std::size_t i = 0;
  while (i < text.size()) {
    const bool starts = digit_at(text, i) || (text[i] == '.' && digit_at(text, i + 1));
    if (!starts) {
      ++i;
      continue;
    }
    bool integer = true;
    const std::size_t n = number_span(text, i, &integer);
    // The sign: '-', '+' or U+2212 right before, itself not after a letter, digit or closing bracket (a minus there
    // is an operator).
    std::size_t from = i;
    std::string sign;
    if (i >= 3 && unicode_minus_at(text, i - 3)) from = i - 3, sign = "-";
    else if (i >= 1 && (text[i - 1] == '-' || text[i - 1] == '+')) from = i - 1, sign = text[i - 1] == '-' ? "-" : "";
    bool glued = false;
    if (from < i && from > 0) {
      const char p = text[from - 1];
      if (std::isalnum(static_cast<unsigned char>(p)) || p == ')' || p == ']' || p == '}' || p == '.' || p == '_')
        glued = true;  // a binary operator's operand
    }
    if (from > 0) {
      const char p = text[from - 1];
      if (alpha_at(text, from - 1) || p == '/' || p == '^' || p == '\\' || p == '_' ||
          (p == '.' && from >= 2 && digit_at(text, from - 2)) || (text[i] == '.' && digit_at(text, i - 1)) ||
          (p == '{' && latex_operand(text, from - 1)))
        glued = true;
    }
    const std::size_t end = i + n;
    if (end < text.size()) {
      const char q = text[end];
      if (q == '/' || q == '^' || q == '\\' || q == '_' || ((q == 'x' || q == 'X') && digit_at(text, end + 1)) ||
          (q == '.' && digit_at(text, end + 1)))
        glued = true;
    }
    std::string num;
    for (std::size_t k = i; k < end; ++k)
      if (text[k] != ',') num += text[k];
    best = glued ? std::string() : sign + num;
    i = end;
  }
  return best;
}

std::string last_boxed(const std::string& text) {
  const std::string key = "\\boxed{";
  const std::size_t at = text.rfind(key);
  if (at == std::string::npos) return "";
  int depth = 1;
  std::size_t i = at + key.size();
  const std::size_t begin = i;
  for (; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    else if (text[i] == '}' && --depth == 0) return text.substr(begin, i - begin);
  }
  return "";  // unbalanced
}

std::string code_block(const std::string& text, bool last, bool* found) {
  std::vector<std::string> blocks;
  std::size_t pos = 0;
  while ((pos = text.find("```", pos)) != std::string::npos) {
    const std::size_t eol = text.find('\n', pos + 3);
    if (eol == std::string::npos) break;
    const std::size_t close = text.find("```", eol + 1);
    if (close == std::string::npos) break;
    blocks.push_back(text.substr(eol + 1, close - eol - 1));
    pos = close + 3;
  }
  *found = !blocks.empty();
  if (blocks.empty()) return "";
  return last ? blocks.back() : blocks.front();
}

double overlong_penalty(int len, int max_length, int buffer_length) {
  // DAPO (Yu et al. 2025, eq. 13): 0 up to L_max - L_cache, then linearly down to -1 at L_max, -1 beyond.
  const int soft = max_length - buffer_length;
  if (len <= soft) return 0.0;
  if (len <= max_length) return static_cast<double>(soft - len) / std::max(1, buffer_length);
  return -1.0;
}

namespace {

// A warning printed the first time only (rewards run on many threads and many batches).
void warn_first(std::atomic<bool>& said, const std::string& msg) {
  if (!said.exchange(true)) log::warn(msg);
}
std::atomic<bool> g_missing_column{false}, g_sandbox_failed{false}, g_planner_failed{false}, g_unsupported{false};

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// A compiled PCRE2 pattern (UTF, DOTALL: '.' matches newlines).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                          PCRE2_UTF | PCRE2_DOTALL | PCRE2_MULTILINE, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw UserError(where + "bad regular expression '" + pattern + "' at offset " + std::to_string(off) + ": " +
                      reinterpret_cast<const char*>(msg));
    }
    pcre2_pattern_info(code_, PCRE2_INFO_CAPTURECOUNT, &groups_);
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  std::uint32_t groups() const { return groups_; }
  // Matches (anywhere, or the whole text, or from its start with `start`: Python's re.match); group 1 into *cap when
  // asked.
  bool match(const std::string& text, bool whole, std::string* cap, bool start = false) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    const std::uint32_t opts = whole ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : start ? PCRE2_ANCHORED : 0;
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.c_str()), text.size(), 0, opts, md, nullptr);
    bool ok = rc > 0;
    if (ok && cap) {
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      *cap = rc > 1 && ov[2] != PCRE2_UNSET ? text.substr(ov[2], ov[3] - ov[2]) : "";
    }
    pcre2_match_data_free(md);
    return ok;
  }

 private:
  pcre2_code* code_ = nullptr;
  std::uint32_t groups_ = 0;
};

// A whole string as one number of NUMBER_GRAMMAR (rewards.h), spaces around it allowed: its value, and for an
// integer its digits without sign, commas or leading zeros. strtod's hexadecimal, "inf" and "nan" are not numbers.
struct Number {
  double value = 0;
  bool integer = false;
  bool negative = false;
  std::string digits;  // integer: "0" for zero
};

bool parse_number(const std::string& s, Number* out) {
  const std::string t = trim(s);
  std::size_t i = 0;
  bool negative = false;
  if (unicode_minus_at(t, 0)) i = 3, negative = true;
  else if (!t.empty() && (t[0] == '-' || t[0] == '+')) i = 1, negative = t[0] == '-';
  bool integer = true;
  const std::size_t n = number_span(t, i, &integer);
  if (n == 0 || i + n != t.size()) return false;
  std::string plain;
  for (std::size_t k = i; k < t.size(); ++k)
    if (t[k] != ',') plain += t[k];
  char* end = nullptr;
  out->value = std::strtod(plain.c_str(), &end);
  if (*end != '\0' || !std::isfinite(out->value)) return false;
  if (negative) out->value = -out->value;
  out->integer = integer;
  out->digits.clear();
  if (integer) {
    const std::size_t nz = plain.find_first_not_of('0');
    out->digits = nz == std::string::npos ? "0" : plain.substr(nz);
  }
  out->negative = negative && !(integer && out->digits == "0");  // -0 is 0
  return true;
}

// compare = "number": two integers must be equal (their digits: no rounding through doubles); an answer against an
// integer gold within min(1e-9 x max(1, |gold|), 1e-6) (so that "1234567.5" does not cover two integers, nor 1e-6
// the gold 0); against a non-integer gold within 1e-6 relative. (Until 2026-11-29 every comparison took 1e-6 of
// max(1, |gold|): from 1e6 on an integer one off, or "x.5", scored.)
bool numbers_equal(const Number& got, const Number& want) {
  if (got.integer && want.integer) return got.negative == want.negative && got.digits == want.digits;
  const double d = std::fabs(got.value - want.value);
  if (want.integer) return d <= std::min(1e-9 * std::max(1.0, std::fabs(want.value)), 1e-6);
  return d <= 1e-6 * std::max(std::fabs(got.value), std::fabs(want.value));
}

// The gold answer of a data column: a JSON string, or a number (its JSON text); anything else (null, a boolean, a
// list) has none ("null" as text was once a gold "null" that a completion could match).
bool gold_text(const nlohmann::json& col, std::string* out) {
  if (col.is_string()) *out = col.get<std::string>();
  else if (col.is_number()) *out = col.dump();
  else return false;
  return true;
}

class AnswerMatch : public RewardFunction {
 public:
  explicit AnswerMatch(const io::TableItem& t)
      : extract_(t.get_string("extract")), column_(t.get_string("column")), numbers_(t.get_string("compare") == "number") {
    if (extract_ == "regex") {
      if (t.get_string("pattern").empty()) throw UserError(t.where() + "answer_match with extract = \"regex\" needs a pattern");
      re_ = std::make_unique<Regex>(t.get_string("pattern"), t.where("pattern"));
      if (re_->groups() != 1)
        throw UserError(t.where("pattern") + "the answer_match pattern must have exactly one capture group (it has " +
                        std::to_string(re_->groups()) + ")");
    }
  }
  std::string unusable(const nlohmann::json& row) const override {
    if (!row.is_object() || !row.contains(column_)) return "column '" + column_ + "' is absent";
    const auto& col = row[column_];
    std::string want;
    if (!gold_text(col, &want))
      return "column '" + column_ + "' is " + std::string(col.type_name()) + ", not a string or a number";
    Number v;
    if (numbers_ && !parse_number(want, &v))
      return "column '" + column_ + "' is '" + want.substr(0, 60) + (want.size() > 60 ? "...'" : "'") +
             ", no number (compare = \"number\": extract the final answer into the column, or compare strings)";
    if (!numbers_ && trim(want).empty()) return "column '" + column_ + "' is empty";
    return "";
  }
  std::vector<double> score(const std::vector<RewardSample>& ss, const std::string&, int) const override {
    std::vector<double> out;
    for (const auto& s : ss) {
      std::string got;
      if (extract_ == "last_number") got = last_number(s.completion);
      else if (extract_ == "boxed") got = last_boxed(s.completion);
      else if (!re_->match(s.completion, false, &got)) got.clear();
      if (!s.row || !s.row->contains(column_)) {
        warn_first(g_missing_column, "answer_match: a data line has no column '" + column_ + "': reward 0");
        out.push_back(0.0);
        continue;
      }
      std::string want;
      if (!gold_text((*s.row)[column_], &want)) {  // said at start-up (unusable)
        out.push_back(0.0);
        continue;
      }
      Number a, b;
      bool eq;
      if (numbers_) eq = parse_number(got, &a) && parse_number(want, &b) && numbers_equal(a, b);
      else eq = !trim(got).empty() && trim(got) == trim(want);
      out.push_back(eq ? 1.0 : 0.0);
    }
    return out;
  }

 private:
  std::string extract_, column_;
  bool numbers_;
  std::unique_ptr<Regex> re_;
};

class RegexReward : public RewardFunction {
 public:
  explicit RegexReward(const io::TableItem& t) : whole_(t.get_bool("full_match")), start_(t.get_bool("match_start")) {
    if (t.get_string("pattern").empty()) throw UserError(t.where() + "a regex reward needs a pattern");
    if (whole_ && start_)
      throw UserError(t.where("match_start") + "full_match and match_start are both set: full_match anchors both ends");
    re_ = std::make_unique<Regex>(t.get_string("pattern"), t.where("pattern"));
  }
  std::vector<double> score(const std::vector<RewardSample>& ss, const std::string&, int) const override {
    std::vector<double> out;
    for (const auto& s : ss) out.push_back(re_->match(s.completion, whole_, nullptr, start_) ? 1.0 : 0.0);
    return out;
  }

 private:
  bool whole_, start_;
  std::unique_ptr<Regex> re_;
};

class Overlong : public RewardFunction {
 public:
  explicit Overlong(const io::TableItem& t)
      : max_(static_cast<int>(t.get_int("max_length"))), buffer_(static_cast<int>(t.get_int("buffer_length"))) {
    if (max_ <= 0) throw UserError(t.where("max_length") + "an overlong reward needs max_length > 0");
    if (buffer_ <= 0 || buffer_ > max_)
      throw UserError(t.where("buffer_length") + "an overlong reward needs 0 < buffer_length <= max_length");
  }
  std::vector<double> score(const std::vector<RewardSample>& ss, const std::string&, int) const override {
    std::vector<double> out;
    for (const auto& s : ss) out.push_back(overlong_penalty(s.completion_tokens, max_, buffer_));
    return out;
  }
  // The penalty starts after max_length - buffer_length tokens: a completion can never be that long when the
  // generation stops before (DAPO sets L_max to the generation's limit).
  std::string inert(int max_tokens, const std::string& limit_key) const override {
    if (max_ - buffer_ < max_tokens) return "";
    return "the penalty starts after max_length - buffer_length = " + std::to_string(max_ - buffer_) +
           " tokens, and no completion is longer than " + limit_key + " = " + std::to_string(max_tokens) +
           ": it is 0 for every completion (set max_length to " + limit_key + ")";
  }

 private:
  int max_, buffer_;
};

class CodeExec : public RewardFunction {
 public:
  explicit CodeExec(const io::TableItem& t)
      : last_(t.get_string("block") == "last"), tests_(t.get_string("tests_column")), setup_(t.get_string("setup_column")),
        all_(t.get_string("mode") == "all"), python_(t.get_string("python")) {
    lim_.wall_s = t.get_float("timeout_s") > 0 ? t.get_float("timeout_s") : 10.0;
    lim_.cpu_s = static_cast<int>(t.get_int("cpu_s"));
    lim_.memory_mb = static_cast<long>(t.get_int("memory_mb"));
    lim_.processes = static_cast<int>(t.get_int("processes"));
    lim_.file_mb = static_cast<long>(t.get_int("file_mb"));
    lim_.max_output = static_cast<std::size_t>(t.get_int("max_output_kb")) << 10;
    const bool path = python_.find('/') != std::string::npos;
    bool found = path ? ::access(python_.c_str(), X_OK) == 0 : false;
    for (const char* d : {"/usr/local/bin/", "/usr/bin/", "/bin/"})
      if (!path && ::access((d + python_).c_str(), X_OK) == 0) found = true;
    if (!found) throw UserError(t.where("python") + "code_exec: the interpreter '" + python_ + "' was not found");
    log::warn_once("code_exec sandbox: " + sandbox_support().describe());
  }
  // The plans of a data line's tests (verdict.h), made once per distinct list of tests by mgrl's own planner program
  // (never run with completion code); nullptr when the planner failed.
  std::shared_ptr<const std::vector<TestPlan>> plans(const std::vector<std::string>& tests) const {
    const std::string key = nlohmann::json(tests).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    SandboxLimits lim;
    lim.wall_s = 60;
    lim.cpu_s = 30;
    lim.memory_mb = std::max(1024L, lim_.memory_mb);
    lim.max_output = 64 << 20;
    lim.own_program = true;
    const SandboxResult r = run_sandboxed(python_, planner_program(tests), lim);
    auto p = std::make_shared<std::vector<TestPlan>>();
    if (r.timed_out || r.output_capped || r.setup_failed || r.status != 0 || !parse_plans(r.output, tests.size(), p.get())) {
      warn_first(g_planner_failed, "code_exec: the test planner failed (status " + std::to_string(r.status) +
                                       "): the tests of such a data line count as failed");
      return nullptr;  // not kept: the next completion of the line tries again
    }
    for (std::size_t i = 0; i < p->size(); ++i)
      if ((*p)[i].kind == TestPlan::kUnsupported)
        warn_first(g_unsupported, "code_exec: a test mgrl cannot check without trusting the completion counts as failed "
                                  "(supported: assert EXPR == LITERAL, assert math.isclose(EXPR, NUMBER...)): '" +
                                      tests[i].substr(0, 120) + "': " + (*p)[i].why);
    std::lock_guard<std::mutex> lock(mu_);
    if (plans_.size() > 100000) plans_.clear();  // bounded; a plan is cheap to make again
    plans_[key] = p;
    return p;
  }
  // One fresh sandboxed child per test: the solution, then only the test's expression, whose value mgrl compares
  // with the expected value the child never sees. Every child of a completion shares its timeout_s.
  std::string unusable(const nlohmann::json& row) const override {
    if (!row.is_object() || !row.contains(tests_)) return "column '" + tests_ + "' (tests_column) is absent";
    const auto& t = row[tests_];
    if (!t.is_array()) return "column '" + tests_ + "' is not a list of tests";
    for (const auto& x : t)
      if (x.is_string()) return "";
    return "column '" + tests_ + "' holds no test (strings)";
  }
  double run_one(const RewardSample& s) const {
    bool found = false;
    const std::string code = code_block(s.completion, last_, &found);
    if (!found || !s.row || !s.row->contains(tests_) || !(*s.row)[tests_].is_array()) return 0.0;
    std::vector<std::string> tests;
    for (const auto& t : (*s.row)[tests_])
      if (t.is_string()) tests.push_back(t.get<std::string>());
    if (tests.empty()) return 0.0;
    const std::string setup = s.row->contains(setup_) && (*s.row)[setup_].is_string() ? (*s.row)[setup_].get<std::string>() : "";
    const auto plan = plans(tests);
    if (!plan) return 0.0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(lim_.wall_s);
    std::size_t passed = 0;
    for (std::size_t i = 0; i < tests.size(); ++i) {
      const TestPlan& p = (*plan)[i];
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      bool ok = false;
      if (p.kind != TestPlan::kUnsupported && left > 0) {
        SandboxLimits lim = lim_;
        lim.wall_s = left;
        const SandboxResult r = run_sandboxed(python_, test_program(setup + "\n" + code, p.expr), lim);
        if (r.setup_failed)
          warn_first(g_sandbox_failed, "code_exec: the sandbox could not be set up (status " + std::to_string(r.status) + "): reward 0");
        ok = !r.timed_out && !r.output_capped && !r.setup_failed && r.status == 0 && passes(p, r.output);
      }
      if (ok) ++passed;
      else if (all_) return 0.0;
    }
    const double n = static_cast<double>(passed);
    return all_ ? (passed == tests.size() ? 1.0 : 0.0) : n / static_cast<double>(tests.size());
  }
  double max_seconds(std::size_t samples, int threads) const override {
    // Each completion's tests share timeout_s; a new list of tests is first planned (at most 60 s).
    const std::size_t rounds = (samples + static_cast<std::size_t>(std::max(1, threads)) - 1) /
                               static_cast<std::size_t>(std::max(1, threads));
    return static_cast<double>(rounds) * (lim_.wall_s + 60.0);
  }
  std::vector<double> score(const std::vector<RewardSample>& ss, const std::string&, int threads) const override {
    std::vector<double> out(ss.size(), 0.0);
    std::atomic<std::size_t> next{0};
    auto work = [&] {
      for (std::size_t i = next++; i < ss.size(); i = next++) out[i] = run_one(ss[i]);
    };
    std::vector<std::thread> pool;
    const int n = std::max(1, std::min<int>(threads, static_cast<int>(ss.size())));
    for (int k = 1; k < n; ++k) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    return out;
  }

 private:
  bool last_;
  std::string tests_, setup_;
  bool all_;
  std::string python_;
  SandboxLimits lim_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<const std::vector<TestPlan>>> plans_;
};

class Command : public RewardFunction {
 public:
  Command(const io::TableItem& t, std::string name) : argv_(t.get_strings("command")), name_(std::move(name)) {
    if (argv_.empty()) throw UserError(t.where("command") + "a command reward needs command = [\"program\", \"args\"...]");
    timeout_ = t.get_float("timeout_s") > 0 ? t.get_float("timeout_s") : 600.0;
    null_on_error_ = t.get_string("on_error") == "null";
  }
  std::string who() const {
    std::string s = "reward '" + name_ + "' (command [";
    for (std::size_t i = 0; i < argv_.size(); ++i) s += (i ? ", \"" : "\"") + argv_[i] + "\"";
    return s + "])";
  }
  double max_seconds(std::size_t, int) const override { return timeout_; }  // one run a batch
  // on_error = "null": a batch whose run fails (an exit status, a signal, the timeout, output that is not one number
  // a completion) gets no value from this function (null, as a trl reward function returning None), said on the
  // rank with the count so far; a program that cannot be started at all still ends the run.
  std::vector<double> score(const std::vector<RewardSample>& ss, const std::string& run_dir, int) const override {
    if (!null_on_error_) return run_batch(ss, run_dir);
    try {
      return run_batch(ss, run_dir);
    } catch (const StartError&) {
      throw;
    } catch (const UserError& e) {
      const long n = ++failed_batches_;
      log::warn(std::string(e.what()) + ": its " + std::to_string(ss.size()) + " completions get no value from it " +
                "(on_error = \"null\"; " + std::to_string(n) + " failed batch" + (n == 1 ? "" : "es") + " so far)");
      return std::vector<double>(ss.size(), std::numeric_limits<double>::quiet_NaN());
    }
  }

 private:
  struct StartError : UserError {
    using UserError::UserError;
  };
  std::vector<double> run_batch(const std::vector<RewardSample>& ss, const std::string& run_dir) const {
    std::string input;
    for (const auto& s : ss) {
      nlohmann::json j = s.row && s.row->is_object() ? *s.row : nlohmann::json::object();
      j["prompt"] = s.prompt;
      j["completion"] = s.completion;
      j["completion_tokens"] = s.completion_tokens;
      j["finish_reason"] = s.finish_reason;
      // A completion cut inside a character is not valid UTF-8: its bytes go out as U+FFFD (JSON cannot carry them).
      // U+2028 and U+2029 go out escaped: Python's str.splitlines() (and JavaScript's line readers) split a line at
      // them, so a completion holding one broke a judge's reading of its input (found by the reward-hacking hunt).
      std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      for (std::size_t at = 0; (at = line.find("\xE2\x80", at)) != std::string::npos;) {
        if (at + 2 < line.size() && (line[at + 2] == '\xA8' || line[at + 2] == '\xA9')) {
          line.replace(at, 3, line[at + 2] == '\xA8' ? "\\u2028" : "\\u2029");
          at += 6;
        } else {
          at += 2;
        }
      }
      input += line + "\n";
    }
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
      throw StartError(who() + ": cannot create pipes");
    std::vector<std::string> args = argv_;
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);  // its own process group: a timeout ends what it started too (a wrapper script's children)
      ::signal(SIGPIPE, SIG_DFL);  // mgrl ignores it; the program gets the usual behaviour
      if (!run_dir.empty() && ::chdir(run_dir.c_str()) != 0) {
        const int e = -errno;  // negative: the working directory, not the program (an "exit status 126" until 2026-11-28)
        (void)!::write(err[1], &e, sizeof e);
        ::_exit(126);
      }
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 3);  // the exec-failure channel, closed on a successful exec
      ::fcntl(3, F_SETFD, FD_CLOEXEC);
      ::execvp(cargv[0], cargv.data());
      const int e = errno;
      (void)!::write(3, &e, sizeof e);
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) throw StartError(who() + ": cannot start it (fork failed)");
    int exec_errno = 0;
    if (::read(err[0], &exec_errno, sizeof exec_errno) == static_cast<ssize_t>(sizeof exec_errno)) {
      ::close(err[0]);
      ::close(in[1]);
      ::close(out[0]);
      ::waitpid(pid, nullptr, 0);
      if (exec_errno < 0)
        throw StartError(who() + ": cannot enter its working directory " + run_dir + " (" + std::strerror(-exec_errno) +
                        "): log.dir must exist on every rank's node (a shared file system), or leave it empty");
      throw StartError(who() + ": cannot run it: " + std::strerror(exec_errno));
    }
    ::close(err[0]);
    // Write stdin and read stdout together (no pipe deadlock), until EOF or the timeout.
    ::fcntl(in[1], F_SETFL, O_NONBLOCK);
    std::size_t written = 0;
    std::string output;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
    bool in_open = true, timed_out = false;
    if (input.empty()) {
      ::close(in[1]);
      in_open = false;
    }
    ::signal(SIGPIPE, SIG_IGN);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) {
        timed_out = true;
        break;
      }
      pollfd pf[2] = {{out[0], POLLIN, 0}, {in_open ? in[1] : -1, POLLOUT, 0}};
      if (::poll(pf, 2, static_cast<int>(std::min<long long>(left, 1000))) < 0 && errno != EINTR) break;
      if (in_open && (pf[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
        const ssize_t n = ::write(in[1], input.data() + written, input.size() - written);
        if (n > 0) written += static_cast<std::size_t>(n);
        if (n < 0 && errno != EAGAIN) written = input.size();  // the program closed its stdin
        if (written == input.size()) {
          ::close(in[1]);
          in_open = false;
        }
      }
      if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[65536];
        const ssize_t n = ::read(out[0], buf, sizeof buf);
        if (n <= 0) break;
        output.append(buf, static_cast<std::size_t>(n));
      }
    }
    if (in_open) ::close(in[1]);
    ::close(out[0]);
    // A program that closed its output but goes on running is waited for until the timeout too (the rank blocked in
    // waitpid until 2026-11-29), then killed with its group.
    int st = 0;
    bool reaped = false;
    while (!timed_out) {
      const pid_t w = ::waitpid(pid, &st, WNOHANG);
      if (w == pid || (w < 0 && errno != EINTR)) {
        reaped = w == pid;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (timed_out) {
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
    }
    if (!reaped) ::waitpid(pid, &st, 0);
    if (timed_out) throw UserError(who() + ": did not finish within " + std::to_string(static_cast<int>(timeout_)) + " s (timeout_s)");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      throw UserError(who() + ": " + (WIFEXITED(st) ? "exited with status " + std::to_string(WEXITSTATUS(st))
                                                    : "was killed by signal " + std::to_string(WTERMSIG(st))));
    std::vector<double> values;
    std::size_t pos = 0, line = 0;
    while (pos < output.size()) {
      std::size_t nl = output.find('\n', pos);
      if (nl == std::string::npos) nl = output.size();
      const std::string text = trim(output.substr(pos, nl - pos));
      ++line;
      pos = nl + 1;
      if (text.empty()) continue;
      // No value for this completion (trl's reward function returning None): null, None or nan.
      std::string lower;
      for (const char ch : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (lower == "null" || lower == "none" || lower == "nan") {
        values.push_back(std::numeric_limits<double>::quiet_NaN());
        continue;
      }
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (*end != '\0' || !std::isfinite(v))
        throw UserError(who() + ": output line " + std::to_string(line) + " is not a number (nor null for no value): '" +
                        text.substr(0, 60) + "'");
      values.push_back(v);
    }
    if (values.size() != ss.size())
      throw UserError(who() + ": printed " + std::to_string(values.size()) + " numbers for " + std::to_string(ss.size()) +
                      " completions");
    return values;
  }

  std::vector<std::string> argv_;
  std::string name_;
  double timeout_ = 600;
  bool null_on_error_ = false;
  mutable std::atomic<long> failed_batches_{0};
};

// Keys that apply to each kind (beside kind, name, weight).
const std::vector<std::string>& keys_of(const std::string& kind) {
  static const std::map<std::string, std::vector<std::string>> keys{
      {"answer_match", {"extract", "pattern", "column", "compare"}},
      {"regex", {"pattern", "full_match", "match_start"}},
      {"overlong", {"max_length", "buffer_length"}},
      {"code_exec", {"block", "tests_column", "setup_column", "mode", "python", "timeout_s", "cpu_s", "memory_mb",
                     "processes", "file_mb", "max_output_kb"}},
      {"command", {"command", "timeout_s", "on_error"}}};
  return keys.at(kind);
}

}  // namespace

Rewards::Rewards() = default;
Rewards::~Rewards() = default;
Rewards::Rewards(Rewards&&) noexcept = default;
Rewards& Rewards::operator=(Rewards&&) noexcept = default;

Rewards Rewards::from_config(const io::Config& cfg) {
  Rewards r;
  for (const auto& t : cfg.tables("reward")) {
    if (!t.has("kind")) throw UserError(t.where() + "a [[reward]] table needs a kind (answer_match, regex, overlong, code_exec or command)");
    const std::string kind = t.get_string("kind");
    const auto& allowed = keys_of(kind);
    for (const auto& [key, line] : t.lines)
      if (key != "kind" && key != "name" && key != "weight" && std::find(allowed.begin(), allowed.end(), key) == allowed.end())
        throw UserError(t.where(key) + "key 'reward[]." + key + "' does not apply to a reward of kind " + kind);
    std::string name = t.get_string("name").empty() ? kind : t.get_string("name");
    if (!t.has("name"))
      for (int k = 2; std::find(r.names_.begin(), r.names_.end(), name) != r.names_.end(); ++k) name = kind + "_" + std::to_string(k);
    if (std::find(r.names_.begin(), r.names_.end(), name) != r.names_.end())
      throw UserError(t.where("name") + "two rewards are named '" + name + "'");
    std::unique_ptr<RewardFunction> f;
    if (kind == "answer_match") f = std::make_unique<AnswerMatch>(t);
    else if (kind == "regex") f = std::make_unique<RegexReward>(t);
    else if (kind == "overlong") f = std::make_unique<Overlong>(t);
    else if (kind == "code_exec") f = std::make_unique<CodeExec>(t);
    else f = std::make_unique<Command>(t, name);
    r.fns_.push_back(std::move(f));
    r.names_.push_back(name);
    r.kinds_.push_back(kind);
    r.weights_.push_back(t.get_float("weight"));
    r.wheres_.push_back(t.where(kind == "overlong" ? "max_length" : ""));
  }
  return r;
}

std::vector<std::vector<double>> Rewards::score(const std::vector<RewardSample>& samples, const std::string& run_dir,
                                                int threads) const {
  std::vector<std::vector<double>> out(samples.size(), std::vector<double>(fns_.size(), 0.0));
  // Nothing to score (a rank without held-out prompts, stepping along with a sharded base): no program is started
  // (a judge may refuse an empty batch; it would end the job on that rank only).
  if (samples.empty()) return out;
  for (std::size_t f = 0; f < fns_.size(); ++f) {
    const auto v = fns_[f]->score(samples, run_dir, threads);
    for (std::size_t i = 0; i < samples.size(); ++i) out[i][f] = v[i];
  }
  return out;
}

int Rewards::accuracy_index(const std::string& named) const {
  if (!named.empty()) {
    const auto it = std::find(names_.begin(), names_.end(), named);
    if (it == names_.end()) throw UserError("eval.accuracy_reward: no reward is named '" + named + "'");
    return static_cast<int>(it - names_.begin());
  }
  for (std::size_t f = 0; f < kinds_.size(); ++f)
    if (kinds_[f] == "answer_match" || kinds_[f] == "code_exec") return static_cast<int>(f);
  return -1;
}

std::vector<std::string> Rewards::check_data(const std::vector<const nlohmann::json*>& rows,
                                             const std::vector<std::int64_t>& lines, const std::string& path) const {
  std::vector<std::string> notes;
  for (std::size_t f = 0; f < fns_.size(); ++f) {
    std::size_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::string why = fns_[f]->unusable(*rows[i]);
      if (why.empty()) continue;
      if (bad++ == 0) first = path + ":" + std::to_string(lines[i]) + ": " + why;
    }
    if (bad == 0) continue;
    const std::string what = "reward '" + names_[f] + "' (" + kinds_[f] + ")";
    if (bad == rows.size())
      throw UserError(first + ": no line of " + path + " can earn " + what + " anything, whatever the completion");
    notes.push_back(path + ": " + std::to_string(bad) + " of " + std::to_string(rows.size()) + " lines can earn " + what +
                    " nothing, whatever the completion (the first, " + first + ")");
  }
  return notes;
}

std::vector<std::string> Rewards::check_lengths(int max_tokens, const std::string& limit_key) const {
  std::vector<std::string> notes;
  std::size_t live = 0;
  for (std::size_t f = 0; f < fns_.size(); ++f) {
    if (weights_[f] == 0.0) continue;
    const std::string why = fns_[f]->inert(max_tokens, limit_key);
    if (why.empty()) {
      ++live;
      continue;
    }
    notes.push_back(wheres_[f] + "reward '" + names_[f] + "' (" + kinds_[f] + "): " + why);
  }
  if (live == 0 && !notes.empty())
    throw UserError(notes.front() + "; it is the only [[reward]] of weight != 0, so nothing could be learned");
  return notes;
}

double Rewards::max_seconds(std::size_t samples, int threads) const {
  double s = 0;
  for (const auto& f : fns_) s += f->max_seconds(samples, threads);
  return s;
}

double Rewards::total(const std::vector<double>& values) const {
  double s = 0;
  bool any = false;
  for (std::size_t f = 0; f < values.size() && f < weights_.size(); ++f) {
    if (std::isnan(values[f])) continue;  // no value from this function: nansum, as trl
    s += weights_[f] * values[f];
    any = true;
  }
  return any || values.empty() ? s : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace mgrl::rl
