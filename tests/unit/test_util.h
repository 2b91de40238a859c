// test_util.h: small helpers shared by the unit tests: temporary files and caught error messages.
#pragma once
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/error.h"

namespace mgrl::test {

// A path in GTest's temporary directory.
inline std::string temp_path(const std::string& name) { return ::testing::TempDir() + "mgrl_" + name; }

// Writes text to temp_path(name) and returns the path.
inline std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

// The message of the exception of type E that f throws, "" when it throws none.
template <typename E = UserError, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace mgrl::test
