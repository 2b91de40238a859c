// config.cpp: reading, checking and printing configurations against a Schema.
#include "io/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.h"
#include "io/unicode.h"

namespace mgrl::io {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::String: return "a string";
    case ValueType::Int: return "an integer";
    case ValueType::Float: return "a number";
    case ValueType::Bool: return "a boolean (true or false)";
    case ValueType::StringList: return "a list of strings";
  }
  return "?";
}

namespace {

// The key whose value waives a required key (the "unless KEY" entry of its required_modes), or "".
std::string waiver(const KeySpec& ks) {
  for (const auto& m : ks.required_modes)
    if (m.rfind("unless ", 0) == 0) return m.substr(7);
  return "";
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// A TOML basic string. Control characters other than tab may not appear raw in one (a value given as "\u0001"
// in a file, or a carriage return on the command line, must still read back from the effective configuration).
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string format_double(double v) {
  char buf[64];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stays a TOML float
  return s;
}

std::string to_toml_literal(const Value& v) {
  struct Visitor {
    std::string operator()(const std::string& s) const { return quote(s); }
    std::string operator()(std::int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return format_double(d); }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(const std::vector<std::string>& l) const {
      std::string out = "[";
      for (std::size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + quote(l[i]);
      return out + "]";
    }
  };
  return std::visit(Visitor{}, v);
}

std::vector<std::string> key_names(const Schema& schema) {
  std::vector<std::string> names;
  for (const auto& k : schema) names.push_back(k.name);
  return names;
}

const KeySpec* find_key(const Schema& schema, const std::string& name) {
  for (const auto& k : schema)
    if (k.name == name) return &k;
  return nullptr;
}

std::string unknown_key_message(const Schema& schema, const std::string& name) {
  std::string msg = "unknown key '" + name + "'";
  const std::string near = closest(name, key_names(schema));
  if (!near.empty()) msg += " (did you mean '" + near + "'?)";
  else msg += " (mgrl help-config lists every key)";
  return msg;
}

// Converts a TOML node to a Value of the spec's type; std::nullopt when the type is wrong.
std::optional<Value> from_node(const KeySpec& ks, const toml::node& n) {
  switch (ks.type) {
    case ValueType::String:
      if (auto s = n.as_string()) return Value(s->get());
      break;
    case ValueType::Int:
      if (auto i = n.as_integer()) return Value(static_cast<std::int64_t>(i->get()));
      break;
    case ValueType::Float:
      if (auto f = n.as_floating_point()) return Value(f->get());
      if (auto i = n.as_integer()) return Value(static_cast<double>(i->get()));
      break;
    case ValueType::Bool:
      if (auto b = n.as_boolean()) return Value(b->get());
      break;
    case ValueType::StringList:
      if (auto a = n.as_array()) {
        std::vector<std::string> out;
        for (const auto& el : *a) {
          auto s = el.as_string();
          if (!s) return std::nullopt;
          out.push_back(s->get());
        }
        return Value(std::move(out));
      }
      break;
  }
  return std::nullopt;
}

const char* node_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

// Parses a command-line value for a key of the given type; std::nullopt when it does not fit.
std::optional<Value> from_text(const KeySpec& ks, const std::string& text) {
  switch (ks.type) {
    case ValueType::String:
      if (text.size() >= 2 && text.front() == '"' && text.back() == '"') {
        try {
          auto parsed = toml::parse("v = " + text);
          if (auto s = parsed["v"].as_string()) return Value(s->get());
        } catch (const toml::parse_error&) {  // "a"b" is no TOML string: a wrong value, not a crash
        }
        return std::nullopt;
      }
      return Value(text);
    case ValueType::Int: {
      if (text.empty()) return std::nullopt;
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (*end != '\0' || errno == ERANGE) return std::nullopt;
      return Value(static_cast<std::int64_t>(v));
    }
    case ValueType::Float: {
      if (text.empty()) return std::nullopt;
      char* end = nullptr;
      errno = 0;
      const double v = std::strtod(text.c_str(), &end);
      if (*end != '\0' || errno == ERANGE || !std::isfinite(v)) return std::nullopt;
      return Value(v);
    }
    case ValueType::Bool:
      if (text == "true" || text == "1") return Value(true);
      if (text == "false" || text == "0") return Value(false);
      return std::nullopt;
    case ValueType::StringList: {
      if (!text.empty() && text.front() == '[') {
        try {
          auto parsed = toml::parse("v = " + text);
          if (auto node = parsed.get("v")) return from_node(ks, *node);
        } catch (const toml::parse_error&) {
        }
        return std::nullopt;
      }
      std::vector<std::string> out;
      std::stringstream ss(text);
      std::string item;
      while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
      return Value(std::move(out));
    }
  }
  return std::nullopt;
}

std::string format_bound(const KeySpec& ks, double b) {
  return ks.type == ValueType::Int ? std::to_string(static_cast<long long>(b)) : format_double(b);
}

// Checks choices and bounds; returns "" when fine.
std::string check_value(const KeySpec& ks, const Value& v) {
  if (!ks.choices.empty() && ks.type == ValueType::String) {
    const auto& s = std::get<std::string>(v);
    if (std::find(ks.choices.begin(), ks.choices.end(), s) == ks.choices.end()) {
      std::string msg = "key '" + ks.name + "' must be one of";
      for (std::size_t i = 0; i < ks.choices.size(); ++i) msg += (i ? ", " : " ") + ks.choices[i];
      msg += " (got " + quote(s) + ")";
      const std::string near = closest(s, ks.choices);
      if (!near.empty()) msg += "; did you mean " + quote(near) + "?";
      return msg;
    }
  }
  if (ks.type == ValueType::Int || ks.type == ValueType::Float) {
    const double d = ks.type == ValueType::Int ? static_cast<double>(std::get<std::int64_t>(v)) : std::get<double>(v);
    // TOML has nan and inf literals (the command line refuses them when parsing): no key takes them, and a NaN
    // passes every bound below (each comparison is false).
    if (!std::isfinite(d)) return "key '" + ks.name + "' must be a finite number (got " + to_toml_literal(v) + ")";
    const bool below = ks.min && (ks.min_open ? d <= *ks.min : d < *ks.min);
    const bool above = ks.max && (ks.max_open ? d >= *ks.max : d > *ks.max);
    if (below || above) {
      std::string msg = "key '" + ks.name + "' must be";
      if (ks.min) msg += (ks.min_open ? " > " : " >= ") + format_bound(ks, *ks.min);
      if (ks.min && ks.max) msg += " and";
      if (ks.max) msg += (ks.max_open ? " < " : " <= ") + format_bound(ks, *ks.max);
      return msg + " (got " + to_toml_literal(v) + ")";
    }
  }
  return "";
}

}  // namespace

std::string closest(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(name, c);
    // The same key under another section is a likely slip too.
    const auto dot_n = name.rfind('.'), dot_c = c.rfind('.');
    const std::string tail_n = dot_n == std::string::npos ? name : name.substr(dot_n + 1);
    const std::string tail_c = dot_c == std::string::npos ? c : c.substr(dot_c + 1);
    if (tail_n == tail_c) d = std::min<std::size_t>(d, 2);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  const std::size_t limit = std::max<std::size_t>(2, name.size() / 3);
  return best_d <= limit ? best : std::string();
}

void Config::set(const KeySpec& ks, Value v, Origin o) {
  values_[ks.name] = std::move(v);
  origins_[ks.name] = o;
}

Config Config::from_string(const Schema& schema, const std::string& text, const std::string& name) {
  Config c;
  c.schema_ = &schema;
  c.file_ = name;
  for (const auto& ks : schema)
    if (ks.def) c.set(ks, *ks.def, {Origin::Default, 0});

  toml::table root;
  try {
    root = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << name << ":" << e.source().begin.line << ":" << e.source().begin.column << ": invalid TOML: "
        << e.description();
    throw UserError(msg.str());
  }

  auto where = [&](const toml::node& n) {
    return name + ":" + std::to_string(n.source().begin.line) + ": ";
  };
  auto take = [&](const std::string& key, const toml::node& n) {
    const KeySpec* ks = find_key(schema, key);
    if (!ks) throw UserError(where(n) + unknown_key_message(schema, key));
    auto v = from_node(*ks, n);
    if (!v)
      throw UserError(where(n) + "key '" + key + "' must be " + value_type_name(ks->type) + ", not " +
                      node_type_name(n));
    const std::string bad = check_value(*ks, *v);
    if (!bad.empty()) throw UserError(where(n) + bad);
    c.set(*ks, std::move(*v), {Origin::File, static_cast<int>(n.source().begin.line)});
  };

  auto is_array_name = [&](const std::string& top) {
    return std::any_of(schema.begin(), schema.end(),
                       [&](const KeySpec& ks) { return ks.name.rfind(top + "[].", 0) == 0; });
  };
  for (auto&& [k, node] : root) {
    const std::string top(k.str());
    if (is_array_name(top)) {
      auto arr = node.as_array();
      if (!arr || !arr->is_array_of_tables())
        throw UserError(where(node) + "'" + top + "' must be an array of tables: write each one as [[" + top + "]]");
      auto& items = c.tables_[top];
      for (auto&& el : *arr) {
        const toml::table& t = *el.as_table();
        TableItem item;
        item.file = name;
        item.line = static_cast<int>(t.source().begin.line);
        for (const auto& ks : schema)
          if (ks.name.rfind(top + "[].", 0) == 0 && ks.def) item.values[ks.name.substr(top.size() + 3)] = *ks.def;
        for (auto&& [k2, node2] : t) {
          const std::string local(k2.str()), key = top + "[]." + local;
          const KeySpec* ks = find_key(schema, key);
          if (!ks) throw UserError(where(node2) + unknown_key_message(schema, key));
          std::optional<Value> v = from_node(*ks, node2);
          if (!v && ks->type == ValueType::StringList && node2.is_string())  // a single string is a list of one
            v = Value(std::vector<std::string>{node2.as_string()->get()});
          if (!v)
            throw UserError(where(node2) + "key '" + key + "' must be " + value_type_name(ks->type) + ", not " +
                            node_type_name(node2));
          const std::string bad = check_value(*ks, *v);
          if (!bad.empty()) throw UserError(where(node2) + bad);
          item.values[local] = std::move(*v);
          item.lines[local] = static_cast<int>(node2.source().begin.line);
        }
        items.push_back(std::move(item));
      }
      continue;
    }
    if (auto section = node.as_table()) {
      if (section->empty() && !std::any_of(schema.begin(), schema.end(), [&](const KeySpec& ks) {
            return ks.name.rfind(top + ".", 0) == 0;
          }))
        throw UserError(where(node) + "unknown section [" + top + "] (mgrl help-config lists every key)");
      for (auto&& [k2, node2] : *section) {
        const std::string key = top + "." + std::string(k2.str());
        if (node2.is_table()) throw UserError(where(node2) + unknown_key_message(schema, key));
        take(key, node2);
      }
    } else {
      take(top, node);
    }
  }
  return c;
}

Config Config::load(const Schema& schema, const std::string& file, const std::vector<std::string>& args,
                    const std::string& mode_from_cli) {
  std::string text;
  if (!file.empty()) {
    // Checked before the open, which would block for good on a FIFO.
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      throw UserError(file + ": not a regular file (the configuration is a TOML file)");
    std::ifstream in(file, std::ios::binary);
    if (!in) throw UserError(file + ": cannot open the configuration file (" + std::strerror(errno) + ")");
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  Config c = from_string(schema, text, file.empty() ? "(no file)" : file);
  c.file_ = file;

  for (const auto& arg : args) {
    if (arg.rfind("--", 0) != 0)
      throw UserError("command line: unexpected argument '" + arg + "' (options are --section.key=value)");
    const auto eq = arg.find('=');
    if (eq == std::string::npos)
      throw UserError("command line: option '" + arg + "' needs a value: " + arg + "=VALUE");
    const std::string key = arg.substr(2, eq - 2), text_value = arg.substr(eq + 1);
    const KeySpec* ks = find_key(schema, key);
    if (!ks) throw UserError("command line: " + unknown_key_message(schema, key));
    // A key of an array of tables ([[reward]]) names no one table: it was accepted, type-checked and ignored.
    const auto brackets = key.find("[].");
    if (brackets != std::string::npos)
      throw UserError("command line: '--" + key + "': the keys of [[" + key.substr(0, brackets) +
                      "]] tables cannot be set on the command line (each table is one " + key.substr(0, brackets) +
                      "): set it in the configuration file");
    if (key == "mode" && !mode_from_cli.empty() && text_value != mode_from_cli)
      throw UserError("command line: '--mode=" + text_value + "' disagrees with the mode '" + mode_from_cli +
                      "' given before it: give one");
    // TOML text is UTF-8: a value that is not could not be written into the effective configuration (checkpoints
    // store it, `mgrl export` reads it back), nor given in a file.
    if (const auto bad = unicode::utf8_invalid_at(text_value); bad != std::string::npos)
      throw UserError("command line: the value of '--" + key + "' is not valid UTF-8 (byte " +
                      std::to_string(bad + 1) + ")");
    auto v = from_text(*ks, text_value);
    if (!v)
      throw UserError("command line: '" + arg + "': key '" + key + "' must be " + value_type_name(ks->type) +
                      (text_value.empty() ? " (the value is empty)" : ""));
    const std::string bad = check_value(*ks, *v);
    if (!bad.empty()) throw UserError("command line: " + bad);
    c.set(*ks, std::move(*v), {Origin::CommandLine, 0});
  }
  c.finish(mode_from_cli);
  return c;
}

void Config::finish(const std::string& mode_from_cli) {
  const KeySpec* mode_key = find_key(*schema_, "mode");
  if (mode_key && !mode_from_cli.empty()) {
    if (is_set("mode")) mode_before_cli_ = get_string("mode");
    const std::string bad = check_value(*mode_key, Value(mode_from_cli));
    if (!bad.empty()) throw UserError("command line: " + bad);
    set(*mode_key, Value(mode_from_cli), {Origin::CommandLine, 0});
  }
  const std::string mode = is_set("mode") ? get_string("mode") : std::string();
  for (const auto& ks : *schema_) {
    if (ks.def || ks.name.find("[].") != std::string::npos) continue;
    // An empty string for a key without a default (`--model.path=`) is as good as none.
    const bool empty = is_set(ks.name) && ks.type == ValueType::String && std::get<std::string>(values_.at(ks.name)).empty();
    if (is_set(ks.name) && !empty) continue;
    const std::string waived_by = waiver(ks);
    const bool required =
        ks.required_modes.size() == (waived_by.empty() ? 0u : 1u) ||
        std::find(ks.required_modes.begin(), ks.required_modes.end(), mode) != ks.required_modes.end();
    if (!required) continue;
    if (!waived_by.empty() && is_set(waived_by) && values_.at(waived_by) != Value(std::string()))
      continue;  // the alternative key is given
    if (ks.name == "mode")
      throw UserError("no mode given: name one on the command line (mgrl MODE ...) or set mode = \"...\" in the "
                      "input file; modes: " + [&] {
                        std::string m;
                        for (std::size_t i = 0; i < ks.choices.size(); ++i) m += (i ? ", " : "") + ks.choices[i];
                        return m;
                      }());
    throw UserError(std::string(empty ? "empty value of" : "missing") + " required key '" + ks.name + "'" +
                    (mode.empty() ? "" : " for mode " + mode) +
                    ": set it in the input file or pass --" + ks.name + "=VALUE" +
                    (waived_by.empty() ? "" : " (or set " + waived_by + ")"));
  }
  read_.clear();  // the checks above are the configuration's own, not a use of the keys (unread_given)
}

const KeySpec& Config::spec(const std::string& key, ValueType expected) const {
  const KeySpec* ks = schema_ ? find_key(*schema_, key) : nullptr;
  MGRL_CHECK(ks != nullptr, "configuration key '" + key + "' is not in the schema");
  MGRL_CHECK(ks->type == expected, "configuration key '" + key + "' read as " + value_type_name(expected) +
                                       " but declared as " + value_type_name(ks->type));
  MGRL_CHECK(values_.count(key) != 0, "configuration key '" + key + "' has no value");
  read_.insert(key);
  return *ks;
}

std::vector<std::string> Config::unread_given() const {
  std::vector<std::string> out;
  for (const auto& [key, o] : origins_)
    if (o.kind != Origin::Default && key != "mode" && !read_.count(key)) out.push_back(key);
  return out;
}

const std::string& Config::get_string(const std::string& key) const {
  spec(key, ValueType::String);
  return std::get<std::string>(values_.at(key));
}
std::int64_t Config::get_int(const std::string& key) const {
  spec(key, ValueType::Int);
  return std::get<std::int64_t>(values_.at(key));
}
double Config::get_float(const std::string& key) const {
  spec(key, ValueType::Float);
  return std::get<double>(values_.at(key));
}
bool Config::get_bool(const std::string& key) const {
  spec(key, ValueType::Bool);
  return std::get<bool>(values_.at(key));
}
const std::vector<std::string>& Config::get_strings(const std::string& key) const {
  spec(key, ValueType::StringList);
  return std::get<std::vector<std::string>>(values_.at(key));
}
bool Config::is_set(const std::string& key) const {
  read_.insert(key);
  return values_.count(key) != 0;
}

const std::vector<TableItem>& Config::tables(const std::string& name) const {
  static const std::vector<TableItem> none;
  auto it = tables_.find(name);
  return it == tables_.end() ? none : it->second;
}

namespace {
template <typename T>
const T& table_get(const TableItem& t, const std::string& key) {
  auto it = t.values.find(key);
  MGRL_CHECK(it != t.values.end(), "table key '" + key + "' has no value");
  const T* v = std::get_if<T>(&it->second);
  MGRL_CHECK(v != nullptr, "table key '" + key + "' read with the wrong type");
  return *v;
}
}  // namespace

const std::string& TableItem::get_string(const std::string& key) const { return table_get<std::string>(*this, key); }
std::int64_t TableItem::get_int(const std::string& key) const { return table_get<std::int64_t>(*this, key); }
double TableItem::get_float(const std::string& key) const { return table_get<double>(*this, key); }
bool TableItem::get_bool(const std::string& key) const { return table_get<bool>(*this, key); }
const std::vector<std::string>& TableItem::get_strings(const std::string& key) const {
  return table_get<std::vector<std::string>>(*this, key);
}
std::string TableItem::where(const std::string& key) const {
  auto it = lines.find(key);
  return file + ":" + std::to_string(it == lines.end() ? line : it->second) + ": ";
}
Origin Config::origin(const std::string& key) const {
  read_.insert(key);
  auto it = origins_.find(key);
  return it == origins_.end() ? Origin{} : it->second;
}

namespace {
// Writes the keys of a schema grouped by section; line(ks) gives the text for one key.
template <typename Fn>
void by_section(const Schema& schema, std::ostringstream& out, Fn&& line) {
  std::vector<std::string> sections;
  for (const auto& ks : schema) {
    if (ks.name.find("[].") != std::string::npos) continue;  // arrays of tables: written separately
    const auto dot = ks.name.find('.');
    const std::string sec = dot == std::string::npos ? "" : ks.name.substr(0, dot);
    if (std::find(sections.begin(), sections.end(), sec) == sections.end()) sections.push_back(sec);
  }
  std::stable_sort(sections.begin(), sections.end(), [](const std::string& a, const std::string& b) {
    return a.empty() && !b.empty();  // top-level keys first, then sections in schema order
  });
  for (const auto& sec : sections) {
    if (!sec.empty()) out << "\n[" << sec << "]\n";
    for (const auto& ks : schema) {
      if (ks.name.find("[].") != std::string::npos) continue;
      const auto dot = ks.name.find('.');
      const std::string ksec = dot == std::string::npos ? "" : ks.name.substr(0, dot);
      if (ksec != sec) continue;
      line(ks, dot == std::string::npos ? ks.name : ks.name.substr(dot + 1));
    }
  }
}
}  // namespace

std::string Config::to_toml() const {
  std::ostringstream out;
  by_section(*schema_, out, [&](const KeySpec& ks, const std::string& local) {
    auto it = values_.find(ks.name);
    if (it != values_.end()) out << local << " = " << to_toml_literal(it->second) << "\n";
  });
  for (const auto& [name, items] : tables_)
    for (const auto& item : items) {
      out << "\n[[" << name << "]]\n";
      for (const auto& [k, v] : item.values) out << k << " = " << to_toml_literal(v) << "\n";
    }
  return out.str();
}

std::string help_config(const Schema& schema, const std::string& title) {
  std::ostringstream out;
  out << "# " << title << "\n"
      << "# Every key can also be given on the command line as --section.key=value.\n";
  by_section(schema, out, [&](const KeySpec& ks, const std::string& local) {
    std::string type = value_type_name(ks.type);
    type = type.substr(type.find(' ') + 1);
    out << "\n# " << ks.doc << "\n# (" << type;
    if (!ks.choices.empty()) {
      out << "; one of";
      for (std::size_t i = 0; i < ks.choices.size(); ++i) out << (i ? ", " : " ") << ks.choices[i];
    }
    if (ks.min) out << (ks.min_open ? "; > " : "; >= ") << format_bound(ks, *ks.min);
    if (ks.max) out << (ks.max_open ? "; < " : "; <= ") << format_bound(ks, *ks.max);
    if (!ks.def) {
      out << "; required";
      if (ks.required_modes.size() > (waiver(ks).empty() ? 0u : 1u)) {
        out << " in mode";
        int shown = 0;
        for (const auto& m : ks.required_modes)
          if (m.rfind("unless ", 0) != 0) out << (shown++ ? ", " : " ") << m;
      }
      if (!waiver(ks).empty()) out << " unless " << waiver(ks) << " is set";
    }
    out << ")\n";
    if (ks.def) out << local << " = " << to_toml_literal(*ks.def) << "\n";
    else out << "# " << local << " =\n";
  });
  // Arrays of tables: one commented example table each, with every key.
  std::vector<std::string> arrays;
  for (const auto& ks : schema) {
    const auto br = ks.name.find("[].");
    if (br != std::string::npos && std::find(arrays.begin(), arrays.end(), ks.name.substr(0, br)) == arrays.end())
      arrays.push_back(ks.name.substr(0, br));
  }
  for (const auto& a : arrays) {
    out << "\n# [[" << a << "]]: an array of tables, one per " << a << " (not settable on the command line).\n"
        << "# [[" << a << "]]\n";
    for (const auto& ks : schema) {
      if (ks.name.rfind(a + "[].", 0) != 0) continue;
      std::string type = value_type_name(ks.type);
      type = type.substr(type.find(' ') + 1);
      out << "#   " << ks.name.substr(a.size() + 3) << " = " << (ks.def ? to_toml_literal(*ks.def) : std::string("(required)"))
          << "   # " << type << ": " << ks.doc << "\n";
    }
  }
  return out.str();
}

}  // namespace mgrl::io
