// fuzz_common.h: shared by the libFuzzer targets (fuzz/README.md). The parsers under test read files, so each
// input is written to a file in a per-process temporary directory (tmpfs where there is one) first.
// What a target may do with an input: return, or throw UserError (a refused input: exit 2 in mgrl). Anything else
// (a sanitizer report, a crash, another exception type escaping) is a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace mgrl::fuzz {

inline std::string temp_dir() {
  static const std::string dir = [] {
    const char* base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string d = std::string(base) + "/mgrl-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes the input to temp_dir()/name and returns the path.
inline std::string write_input(const std::string& name, const std::uint8_t* data, std::size_t size) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// Runs fn; a UserError is a refused input, which is fine.
template <class F>
void refused_ok(F&& fn) {
  try {
    fn();
  } catch (const UserError&) {
  }
}

}  // namespace mgrl::fuzz
