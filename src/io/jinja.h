// jinja.h: a small interpreter for the subset of Jinja2 that chat templates use, configured as transformers
// configures it for apply_chat_template (trim_blocks, lstrip_blocks, no autoescape, loop controls, the
// {% generation %} tag, raise_exception / strftime_now / namespace / dict / range as globals).
//
// Supported (docs/sft.md "Chat templates" lists it for users):
//   tags        {{ }}, {% %}, {# #}, whitespace control - and +, {% raw %}
//   statements  if/elif/else, for (tuple targets, `if` filter, else, loop.index/index0/revindex/revindex0/
//               first/last/length/previtem/nextitem), break/continue, set (names, tuples, ns.attr, block set),
//               macro (positional and keyword arguments, defaults), generation
//   expressions literals (strings, ints, floats, true/false/none, lists, tuples, dicts), and/or/not, in/not in,
//               == != < <= > >=, + - * / // % **, ~, inline if/else, attribute and item access, slices with
//               negative and step, calls with keyword arguments
//   filters     abs attr capitalize count d default dictsort e escape first float indent int items join last
//               length list lower map max min reject rejectattr replace reverse round safe select selectattr
//               sort string sum title tojson trim unique upper wordcount
//   tests       boolean callable defined divisibleby eq equalto even false float ge gt in integer iterable le
//               lower lt mapping ne none number odd sameas sequence string true undefined upper == != < <= > >=
//   methods     str: startswith endswith strip lstrip rstrip split rsplit upper lower title capitalize replace
//               find rfind count join isdigit isalpha isspace; dict: items keys values get
// Anything else (extends, include, import, call blocks, filter blocks, recursive loops, unknown filters/tests/
// methods) is a UserError naming the template and line when the template is parsed or the construct is reached.
// Limits keep hostile templates finite: nesting depth, macro recursion, output and string sizes, work steps.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mgrl::io::jinja {

struct Value;
struct MacroDef;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, string keys (as JSON objects)

struct Value {
  enum class Kind : std::uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function, Macro };
  Kind kind = Kind::Undefined;
  bool b = false;                        // Bool: the value; List: a tuple (printed as (a, b))
  std::int64_t i = 0;
  double f = 0;
  std::string s;                         // String; Function: its name; Undefined: the name that was looked up
  std::shared_ptr<const List> list;      // List (immutable, as in transformers' sandbox)
  std::shared_ptr<Dict> dict;            // Dict (not changed once made) and Namespace (changed by set ns.x)
  std::shared_ptr<const MacroDef> macro;
  std::uint32_t nest = 0;                // List/Dict: 1 + the deepest nesting of an element

  static Value undefined(std::string name = "") { Value v; v.s = std::move(name); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(std::int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
  // Lists and dicts nest at most kMaxNesting deep (UserError beyond): printing, comparing and freeing them recurse.
  static constexpr std::uint32_t kMaxNesting = 512;
  static Value make_list(List x);
  static Value make_tuple(List x) { Value v = make_list(std::move(x)); v.b = true; return v; }
  static Value make_dict(Dict x);

  bool is_undefined() const { return kind == Kind::Undefined; }
  // The member of a Dict/Namespace, or nullptr.
  const Value* find(const std::string& key) const;
};

// A JSON value as the template sees it (objects keep their order: the order of the input file, as Python's json gives
// transformers; a nlohmann::json passed here arrives sorted by key).
Value from_json(const nlohmann::ordered_json& j);
// Python's str() of a value, as {{ }} prints it.
std::string to_str(const Value& v);

// Variables a template is rendered with, by name.
using Vars = std::vector<std::pair<std::string, Value>>;

class Template {
 public:
  // Parses source. `name` (a file, or "file (key)") starts every error message: "name:line: what". Syntax
  // errors and unsupported constructs found by parsing are UserErrors here.
  Template(const std::string& source, std::string name);

  struct Output {
    std::string text;
    // [begin, end) byte ranges of text produced inside {% generation %} ... {% endgeneration %}
    std::vector<std::pair<std::size_t, std::size_t>> generation;
  };
  // Renders with the given variables. Runtime errors (raise_exception, an undefined attribute, an unsupported
  // filter reached, a limit passed) are UserErrors naming the template and line.
  Output render(const Vars& vars) const;
  // Whether the template has {% generation %} blocks.
  bool marks_generation() const;
  const std::string& name() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace mgrl::io::jinja
