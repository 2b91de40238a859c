// test_util.h: small helpers shared by the unit tests: temporary files and caught error messages.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

// ||got - want|| / ||want|| over all elements, in double (1 as denominator when want is all zeros).
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

// The names of dir's subdirectories that hold a case.json (the trl fixture cases), sorted; none when dir is absent.
inline std::vector<std::string> fixture_cases(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_directory() && std::filesystem::exists(e.path() / "case.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace mgrl::test
