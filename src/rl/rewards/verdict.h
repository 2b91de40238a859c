// verdict.h: how code_exec decides that a test passed without trusting the completion (docs/rewards.md). A planner
// (mgrl's own Python, never run with completion code) splits each test `assert EXPR == LITERAL` into the expression
// and the expected value; a fresh sandboxed child per test runs the solution, evaluates only EXPR and reports its
// value as tagged JSON; mgrl parses that report and compares it with the expected value itself, with Python's
// equality on plain values. The child never sees the expected value, so all it can do is report a value.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mgrl::rl {

// One test as the planner understood it.
struct TestPlan {
  enum Kind { kUnsupported, kEqual, kIsClose } kind = kUnsupported;
  std::string expr;        // Python expression the child evaluates (kEqual, kIsClose)
  nlohmann::json want;     // expected value, tagged (kEqual); a number, tagged (kIsClose)
  double rel_tol = 1e-9, abs_tol = 0.0;  // kIsClose
  std::string why;         // kUnsupported: the reason
};

// The planner: a Python program that prints one JSON plan per test (reads nothing, runs no test).
std::string planner_program(const std::vector<std::string>& tests);
// Its output read back; false when it is not a plan for `n` tests.
bool parse_plans(const std::string& output, std::size_t n, std::vector<TestPlan>* plans);

// The child of one test: runs `code` (setup + solution) with its output sent to /dev/null, evaluates `expr` and
// writes the tagged JSON of its value, alone, to its standard output.
std::string test_program(const std::string& code, const std::string& expr);

// Tagged JSON of a Python value: None, bool and str as JSON; {"int": "decimal"}, {"float": "repr"}, {"list": [...]},
// {"tuple": [...]}, {"set": [...]}, {"frozenset": [...]}, {"dict": [[key, value], ...]}.
// A child's report parsed strictly (one JSON document, nesting at most 512); false on anything malformed.
bool parse_report(const std::string& bytes, nlohmann::json* value);
// Python's == on two tagged values (1 == 1.0 == True, [1] != (1,), dicts and sets unordered, nan never equal);
// false when either is not a well-formed tagged value.
bool py_equal(const nlohmann::json& a, const nlohmann::json& b);
// Whether a child's report passes the test.
bool passes(const TestPlan& plan, const std::string& report);

// A Python string literal of any text (invalid UTF-8 replaced).
std::string py_literal(const std::string& s);

}  // namespace mgrl::rl
