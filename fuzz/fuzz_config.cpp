// fuzz_config.cpp: the TOML configuration loader with mgrl's schema (io::Config::from_string): parsing, key and
// type checks, [[reward]] tables, the "did you mean" suggestions.
#include "fuzz/fuzz_common.h"
#include "io/config.h"
#include "io/config_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  mgrl::fuzz::refused_ok([&] {
    const auto cfg = mgrl::io::Config::from_string(mgrl::io::mgrl_schema(), text, "fuzz.toml");
    (void)cfg.to_toml();  // what a checkpoint stores of the configuration
  });
  return 0;
}
