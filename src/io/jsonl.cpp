// jsonl.cpp: JSON Lines reader.
#include "io/jsonl.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace mgrl::io {

void jsonl_error(const std::string& path, int line, const std::string& what) {
  throw UserError(path + ":" + std::to_string(line) + ": " + what);
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open" + (what.empty() ? "" : " " + what) + " (" + std::strerror(errno) + ")");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path + ": invalid JSON: " + e.what());
  }
}

void read_jsonl(const std::string& path, const std::function<void(const nlohmann::json&, int)>& fn) {
  std::ifstream in(path);
  if (!in) throw UserError(path + ": cannot open (" + std::strerror(errno) + ")");
  std::string text;
  int line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      jsonl_error(path, line, std::string("invalid JSON (") + e.what() + ")");
    }
    if (!j.is_object()) jsonl_error(path, line, "expected a JSON object");
    fn(j, line);
  }
}

}  // namespace mgrl::io
