// jsonl.cpp: JSON Lines reader.
#include "io/jsonl.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace mgrl::io {

void jsonl_error(const std::string& path, int line, const std::string& what) {
  throw UserError(path + ":" + std::to_string(line) + ": " + what);
}

std::string json_error_text(const std::exception& e) {
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    const auto close = text.find("] ");
    if (close != std::string::npos) text = text.substr(close + 2);
  }
  static const std::string kParse = "parse error at ";
  if (text.rfind(kParse, 0) == 0) text = text.substr(kParse.size());
  static const std::string kParseShort = "parse error: ";
  if (text.rfind(kParseShort, 0) == 0) text = text.substr(kParseShort.size());
  return text;
}

void check_regular_input(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket";
  throw UserError(path + ": not a regular file (" + (what.empty() ? std::string() : what + " is ") + kind + ")");
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  check_regular_input(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open" + (what.empty() ? "" : " " + what) + " (" + std::strerror(errno) + ")");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // The JSON library stops at a NUL byte as if the text ended there: refuse it instead.
  const auto nul = text.find('\0');
  if (nul != std::string::npos)
    throw UserError(path + ": a NUL byte at offset " + std::to_string(nul) + " (not a text file, or a damaged one?)");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path + ": invalid JSON: " + json_error_text(e));
  }
}

void read_jsonl(const std::string& path, const std::function<void(const nlohmann::ordered_json&, int)>& fn) {
  check_regular_input(path, "the data");
  std::ifstream in(path);
  if (!in) throw UserError(path + ": cannot open (" + std::strerror(errno) + ")");
  std::string text;
  int line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    // A NUL byte is never part of JSON text (inside strings it is written \u0000): a binary or damaged file.
    const auto nul = text.find('\0');
    if (nul != std::string::npos)
      jsonl_error(path, line, "a NUL byte at column " + std::to_string(nul + 1) + " (not a text file, or a damaged one?)");
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      std::string why = json_error_text(e);
      if (why.rfind("line 1, column ", 0) == 0) why = why.substr(8);  // the line is the file's, named already
      jsonl_error(path, line, "invalid JSON at " + why);
    } catch (const nlohmann::json::exception& e) {
      // Valid syntax the library cannot hold, e.g. a number beyond double's range (1e400): out_of_range, which
      // escaped as a raw library message before fuzzing found it (fuzz/corpus/jsonl/number_overflow.jsonl).
      jsonl_error(path, line, "invalid JSON: " + json_error_text(e));
    }
    if (!j.is_object()) jsonl_error(path, line, "expected a JSON object");
    fn(j, line);
  }
}

}  // namespace mgrl::io
