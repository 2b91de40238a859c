// error.cpp: formatting of check failures.
#include "core/error.h"

#include <cstring>

#include "core/build_info.h"
#include "core/log.h"

namespace mgrl {

const char* source_relative(const char* file) {
  const char* root = build_info().source_dir;
  const std::size_t n = std::strlen(root);
  if (n > 0 && std::strncmp(file, root, n) == 0 && file[n] == '/') return file + n + 1;
  return file;
}

void check_failed(const char* lib, const char* expr, const std::string& detail, const char* file, int line) {
  std::string msg = std::string(lib) + " error at " + source_relative(file) + ":" + std::to_string(line);
  if (log::rank() >= 0) msg += " (rank " + std::to_string(log::rank()) + ")";
  msg += ": " + std::string(expr) + " failed";
  if (!detail.empty()) msg += ": " + detail;
  throw FatalError(msg);
}

}  // namespace mgrl
