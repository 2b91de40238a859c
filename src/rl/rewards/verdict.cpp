// verdict.cpp: the code_exec test planner and per-test child programs (Python text), and the trusted side's reading
// and comparison of the values children report.
#include "rl/rewards/verdict.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace mgrl::rl {
namespace {

using nlohmann::json;

// Tagged JSON of a plain Python value; anything else (a subclass, a user class) raises. Shared by the planner and the
// children; in a child it runs after completion code and is not trusted: mgrl checks what it wrote.
constexpr const char* kEncoder = R"PY(
def _enc(x, depth=0):
    if depth > 100:
        raise ValueError('nested too deep')
    t = type(x)
    if x is None or t is bool or t is str:
        return x
    if t is int:
        return {'int': str(x)}
    if t is float:
        return {'float': repr(x)}
    if t is list or t is tuple or t is set or t is frozenset:
        return {t.__name__: [_enc(v, depth + 1) for v in x]}
    if t is dict:
        return {'dict': [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in x.items()]}
    raise TypeError('not a plain value: %r' % (t,))
)PY";

constexpr const char* kPlanner = R"PY(
SAFE = {'set': set, 'frozenset': frozenset, 'tuple': tuple, 'list': list, 'dict': dict, 'float': float, 'int': int,
        'str': str, 'sorted': sorted}

def lit(n):
    try:
        return ast.literal_eval(n)
    except Exception:
        pass
    if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in SAFE and not n.keywords
            and len(n.args) <= 1):
        return SAFE[n.func.id](*[lit(a) for a in n.args])
    raise ValueError('not a literal')

def number(v):
    if type(v) not in (int, float, bool) or not math.isfinite(v):
        raise ValueError('not a finite number')
    return float(v)

def src(text, n):
    s = ast.get_source_segment(text, n)
    return '(\n%s\n)' % (s if s is not None else ast.unparse(n))

def plan(text):
    try:
        mod = ast.parse(text, mode='exec')
    except Exception:
        return {'kind': 'unsupported', 'why': 'not valid Python'}
    if len(mod.body) != 1 or not isinstance(mod.body[0], ast.Assert):
        return {'kind': 'unsupported', 'why': 'not a single assert statement'}
    t = mod.body[0].test
    if isinstance(t, ast.Compare):
        if len(t.ops) != 1 or not isinstance(t.ops[0], ast.Eq):
            return {'kind': 'unsupported', 'why': 'a comparison other than one =='}
        for expr, value in ((t.left, t.comparators[0]), (t.comparators[0], t.left)):
            try:
                want = _enc(lit(value))
            except Exception:
                continue
            return {'kind': 'equal', 'expr': src(text, expr), 'want': want}
        return {'kind': 'unsupported', 'why': 'neither side of == is a literal'}
    f = t.func if isinstance(t, ast.Call) else None
    if f is not None and ((isinstance(f, ast.Attribute) and f.attr == 'isclose' and isinstance(f.value, ast.Name)
                           and f.value.id == 'math') or (isinstance(f, ast.Name) and f.id == 'isclose')):
        try:
            kw = {k.arg: number(lit(k.value)) for k in t.keywords}
            if len(t.args) == 2 and not set(kw) - {'rel_tol', 'abs_tol'}:
                for expr, value in ((t.args[0], t.args[1]), (t.args[1], t.args[0])):
                    try:
                        want = number(lit(value))
                    except Exception:
                        continue
                    return {'kind': 'isclose', 'expr': src(text, expr), 'want': _enc(want),
                            'rel_tol': kw.get('rel_tol', 1e-9), 'abs_tol': kw.get('abs_tol', 0.0)}
        except Exception:
            pass
        return {'kind': 'unsupported', 'why': 'math.isclose without a literal number and literal tolerances'}
    return {'kind': 'unsupported', 'why': 'asserts a truth value, which a completion could report without computing it'}

def safe_plan(text):
    try:
        return plan(text)
    except Exception as e:
        return {'kind': 'unsupported', 'why': 'cannot be planned (%s)' % type(e).__name__}

sys.stdout.write(json.dumps([safe_plan(t) for t in TESTS]))
)PY";

constexpr const char* kChild = R"PY(
def _mgrl_run():
    out = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    g = {'__name__': '__main__'}
    exec(compile(CODE, 'solution.py', 'exec'), g)
    data = json.dumps(_enc(eval(compile(EXPR, 'test.py', 'eval'), g))).encode()
    while data:
        data = data[os.write(out, data):]
    os._exit(0)

try:
    _mgrl_run()
except BaseException:
    os._exit(1)
)PY";

// A number of a tagged value: an exact integer (decimal digits, normalised) or a double.
struct Num {
  bool is_int = false;
  std::string digits;  // is_int: "-12", "0"
  double d = 0;
};

bool int_digits(const std::string& s, std::string* out) {
  std::size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
  if (i == s.size()) return false;
  for (std::size_t k = i; k < s.size(); ++k)
    if (s[k] < '0' || s[k] > '9') return false;
  while (i + 1 < s.size() && s[i] == '0') ++i;
  *out = s.substr(i);
  if (neg && *out != "0") *out = "-" + *out;
  return true;
}

enum class Tag { kBad, kNone, kBool, kInt, kFloat, kStr, kList, kTuple, kSet, kDict };

Tag tag_of(const json& v) {
  if (v.is_null()) return Tag::kNone;
  if (v.is_boolean()) return Tag::kBool;
  if (v.is_string()) return Tag::kStr;
  if (!v.is_object() || v.size() != 1) return Tag::kBad;
  const std::string key = v.begin().key();
  const json& x = v.begin().value();
  if (key == "int") return x.is_string() ? Tag::kInt : Tag::kBad;
  if (key == "float") return x.is_string() ? Tag::kFloat : Tag::kBad;
  if (!x.is_array()) return Tag::kBad;
  if (key == "list") return Tag::kList;
  if (key == "tuple") return Tag::kTuple;
  if (key == "set" || key == "frozenset") return Tag::kSet;  // set() == frozenset() in Python
  if (key == "dict") {
    for (const auto& kv : x)
      if (!kv.is_array() || kv.size() != 2) return Tag::kBad;
    return Tag::kDict;
  }
  return Tag::kBad;
}

bool num_of(const json& v, Tag t, Num* n) {
  if (t == Tag::kBool) {
    n->is_int = true;
    n->digits = v.get<bool>() ? "1" : "0";
    return true;
  }
  const std::string s = v.begin().value().get<std::string>();
  if (t == Tag::kInt) {
    n->is_int = true;
    return int_digits(s, &n->digits);
  }
  if (s.empty()) return false;
  char* end = nullptr;
  n->d = std::strtod(s.c_str(), &end);
  return *end == '\0';
}

bool num_equal(const Num& a, const Num& b) {
  if (a.is_int && b.is_int) return a.digits == b.digits;
  if (!a.is_int && !b.is_int) return a.d == b.d;
  const Num& i = a.is_int ? a : b;
  const double f = a.is_int ? b.d : a.d;
  if (!std::isfinite(f) || f != std::floor(f)) return false;
  char buf[400];
  std::snprintf(buf, sizeof buf, "%.0f", f);  // exact for an integral double
  std::string fd;
  return int_digits(buf, &fd) && fd == i.digits;
}

bool is_number(Tag t) { return t == Tag::kBool || t == Tag::kInt || t == Tag::kFloat; }

// Every element of `a` has an equal one in `b`, and the other way round; with equal sizes and `b` free of equal
// pairs (built by Python), that is Python's set and dict equality.
template <typename Eq>
bool same_members(const json& a, const json& b, Eq eq) {
  if (a.size() != b.size()) return false;
  auto covered = [&](const json& x, const json& y) {
    for (const auto& e : x) {
      bool hit = false;
      for (const auto& f : y)
        if (eq(e, f)) {
          hit = true;
          break;
        }
      if (!hit) return false;
    }
    return true;
  };
  return covered(a, b) && covered(b, a);
}

}  // namespace

std::string py_literal(const std::string& s) {
  return json(s).dump(-1, ' ', true, json::error_handler_t::replace);  // an ASCII JSON string is a Python str
}

std::string planner_program(const std::vector<std::string>& tests) {
  json t = tests;
  return "import ast, json, math, sys\nTESTS = json.loads(" + py_literal(t.dump(-1, ' ', true, json::error_handler_t::replace)) +
         ")\n" + kEncoder + kPlanner;
}

bool parse_plans(const std::string& output, std::size_t n, std::vector<TestPlan>* plans) {
  json j;
  if (!parse_report(output, &j) || !j.is_array() || j.size() != n) return false;
  plans->clear();
  for (const auto& p : j) {
    TestPlan tp;
    if (!p.is_object() || !p.contains("kind") || !p["kind"].is_string()) return false;
    const std::string kind = p["kind"].get<std::string>();
    if (kind == "unsupported") {
      tp.why = p.value("why", std::string());
    } else {
      if (!p.contains("expr") || !p["expr"].is_string() || !p.contains("want")) return false;
      tp.expr = p["expr"].get<std::string>();
      tp.want = p["want"];
      if (kind == "equal") {
        tp.kind = TestPlan::kEqual;
      } else if (kind == "isclose") {
        tp.kind = TestPlan::kIsClose;
        if (!p.contains("rel_tol") || !p["rel_tol"].is_number() || !p.contains("abs_tol") || !p["abs_tol"].is_number())
          return false;
        tp.rel_tol = p["rel_tol"].get<double>();
        tp.abs_tol = p["abs_tol"].get<double>();
      } else {
        return false;
      }
    }
    plans->push_back(std::move(tp));
  }
  return true;
}

std::string test_program(const std::string& code, const std::string& expr) {
  return "import os, json\nCODE = " + py_literal(code) + "\nEXPR = " + py_literal(expr) + "\n" + kEncoder + kChild;
}

bool parse_report(const std::string& bytes, json* value) {
  try {
    const json::parser_callback_t limit = [](int depth, json::parse_event_t, json&) {
      if (depth > 512) throw std::runtime_error("nested too deep");
      return true;
    };
    *value = json::parse(bytes, limit);  // one document; anything after it is an error
    return true;
  } catch (...) {
    return false;
  }
}

bool py_equal(const json& a, const json& b) {
  const Tag ta = tag_of(a), tb = tag_of(b);
  if (ta == Tag::kBad || tb == Tag::kBad) return false;
  if (is_number(ta) && is_number(tb)) {
    Num x, y;
    return num_of(a, ta, &x) && num_of(b, tb, &y) && num_equal(x, y);
  }
  if (ta != tb) return false;
  switch (ta) {
    case Tag::kNone:
      return true;
    case Tag::kStr:
      return a.get<std::string>() == b.get<std::string>();
    case Tag::kList:
    case Tag::kTuple: {
      const json& x = a.begin().value();
      const json& y = b.begin().value();
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!py_equal(x[i], y[i])) return false;
      return true;
    }
    case Tag::kSet:
      return same_members(a.begin().value(), b.begin().value(), [](const json& e, const json& f) { return py_equal(e, f); });
    case Tag::kDict:
      return same_members(a.begin().value(), b.begin().value(),
                          [](const json& e, const json& f) { return py_equal(e[0], f[0]) && py_equal(e[1], f[1]); });
    default:
      return false;
  }
}

bool passes(const TestPlan& plan, const std::string& report) {
  json got;
  if (plan.kind == TestPlan::kUnsupported || !parse_report(report, &got)) return false;
  if (plan.kind == TestPlan::kEqual) return py_equal(got, plan.want);
  // math.isclose(got, want, rel_tol, abs_tol) on numbers.
  const Tag tg = tag_of(got), tw = tag_of(plan.want);
  Num a, b;
  if (!is_number(tg) || !is_number(tw) || !num_of(got, tg, &a) || !num_of(plan.want, tw, &b)) return false;
  const double x = a.is_int ? std::strtod(a.digits.c_str(), nullptr) : a.d;
  const double y = b.is_int ? std::strtod(b.digits.c_str(), nullptr) : b.d;
  if (x == y) return true;
  if (std::isinf(x) || std::isinf(y) || std::isnan(x) || std::isnan(y)) return false;
  const double diff = std::fabs(y - x);
  return diff <= std::fabs(plan.rel_tol * y) || diff <= std::fabs(plan.rel_tol * x) || diff <= plan.abs_tol;
}

}  // namespace mgrl::rl
