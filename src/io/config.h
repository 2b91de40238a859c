// config.h: a run's configuration: a schema of typed keys with defaults and docs, read from
// an optional TOML file and overridden by --section.key=value arguments.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace mgrl::io {

enum class ValueType { String, Int, Float, Bool, StringList };
const char* value_type_name(ValueType t);  // "a string", "an integer", ...

using Value = std::variant<std::string, std::int64_t, double, bool, std::vector<std::string>>;

struct KeySpec {
  std::string name;          // "section.key", or "key" for a top-level key
  ValueType type;
  std::optional<Value> def;  // empty: required (see required_modes)
  std::string doc;           // one line
  std::vector<std::string> choices;         // allowed strings (empty: any)
  std::optional<double> min, max;           // bounds for Int and Float
  // Required only in these modes (empty + no def: always). An entry "unless KEY" waives the requirement when KEY
  // has a non-empty value (an alternative to this key).
  std::vector<std::string> required_modes;
  // The bounds themselves excluded (> min, < max): a value at the bound is refused (adam_beta1 = 1 divides by zero).
  bool min_open = false, max_open = false;
};

using Schema = std::vector<KeySpec>;

// One table of an array of tables ([[reward]] ...): keys named "<array>[].<key>" in the schema.
class TableItem {
 public:
  int line = 0;  // line of the [[...]] header
  std::string file;
  std::map<std::string, Value> values;  // local key -> value (defaults filled in)
  std::map<std::string, int> lines;     // local key -> line, for keys given in the file
  bool has(const std::string& key) const { return lines.count(key) != 0; }
  const std::string& get_string(const std::string& key) const;
  std::int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::vector<std::string>& get_strings(const std::string& key) const;
  // "file:line: " of a key (or of the table when the key was not given), for messages.
  std::string where(const std::string& key = "") const;
};

// Where a value came from, for messages and for the effective-config dump.
struct Origin {
  enum Kind { Default, File, CommandLine } kind = Default;
  int line = 0;
};

class Config {
 public:
  // file: "" for none. args: "--section.key=value" strings. mode_from_cli: "" when the command line
  // named no mode (then the key `mode` of the file, if the schema has one, decides).
  // Throws UserError naming the file and line, or the argument, on any problem.
  static Config load(const Schema& schema, const std::string& file, const std::vector<std::string>& args,
                     const std::string& mode_from_cli = "");
  // A config of defaults plus the given values (tests, tools).
  static Config from_string(const Schema& schema, const std::string& toml_text, const std::string& name);

  const std::string& get_string(const std::string& key) const;
  std::int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::vector<std::string>& get_strings(const std::string& key) const;
  bool is_set(const std::string& key) const;  // a value exists (given or default)
  // The tables of an array of tables ([[name]] in the file), in file order; empty when none.
  const std::vector<TableItem>& tables(const std::string& name) const;
  Origin origin(const std::string& key) const;
  const std::string& file() const { return file_; }
  // The mode the input file (or a --mode= override) named before the command line's mode replaced it ("" when
  // none): what `mgrl plan input.toml` plans.
  const std::string& mode_before_cli() const { return mode_before_cli_; }

  // The effective configuration as TOML (every key with a value), e.g. for checkpoints.
  std::string to_toml() const;
  // The keys given (in the input file or on the command line; not `mode`) that nothing has read so far: a get_*,
  // is_set or origin of a key counts as reading it (asking whether a key was given is a use of it).
  std::vector<std::string> unread_given() const;

 private:
  const KeySpec& spec(const std::string& key, ValueType expected) const;
  void set(const KeySpec& ks, Value v, Origin o);
  void finish(const std::string& mode_from_cli);

  const Schema* schema_ = nullptr;
  std::string file_;
  std::string mode_before_cli_;
  std::map<std::string, Value> values_;
  std::map<std::string, Origin> origins_;
  std::map<std::string, std::vector<TableItem>> tables_;
  mutable std::set<std::string> read_;  // unread_given()
};

// `mgrl help-config`: every key with its type, default and doc, as a TOML file one can start from.
std::string help_config(const Schema& schema, const std::string& title);

// Closest name to `name` among `candidates` (edit distance), "" when nothing is close.
std::string closest(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace mgrl::io
