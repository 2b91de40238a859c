// jsonl.h: JSON files and JSON Lines input (one JSON object per line), with errors naming file and line.
#pragma once
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace mgrl::io {

// Refuses, before it is opened, an input path that exists and is not a regular file: a FIFO would block the open
// for good (a hang that no timeout ends: nothing is watched yet), a directory reads as an empty file. UserError
// "path: not a regular file (what: ...)". A path that does not exist passes (its open says so).
void check_regular_input(const std::string& path, const std::string& what = "");

// Calls fn(object, line_number) for every non-empty line of path (1-based line numbers). A line that
// is not a JSON object is a UserError "path:line: ...". fn may throw UserError via jsonl_error(). The objects keep
// the keys in the file's order (as Python's json does): a chat template that prints a dict or its tojson (a tool
// call's arguments) renders what transformers renders. (Until 2026-11-28 they arrived sorted by key.)
void read_jsonl(const std::string& path, const std::function<void(const nlohmann::ordered_json&, int)>& fn);

// A whole JSON file; UserError "path: cannot open (...)" or "path: invalid JSON: ..." (what: e.g. "the model config").
nlohmann::json read_json_file(const std::string& path, const std::string& what = "");

// A JSON library error as a plain phrase: "[json.exception.parse_error.101] parse error at line 1, column 5:
// syntax error ..." -> "line 1, column 5: syntax error ...".
std::string json_error_text(const std::exception& e);

// UserError "path:line: what".
[[noreturn]] void jsonl_error(const std::string& path, int line, const std::string& what);

}  // namespace mgrl::io
