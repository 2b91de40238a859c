// fuzz_verdict.cpp: what a code_exec test child reports (untrusted bytes: the completion controls them all), read
// and compared by mgrl (src/rl/rewards/verdict.h), and the planner's output read back. Nothing may throw or crash;
// a malformed report only fails its test.
#include <cstdint>
#include <string>

#include "rl/rewards/verdict.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using mgrl::rl::TestPlan;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  static const TestPlan plans[] = {
      {TestPlan::kEqual, "f()", nlohmann::json::parse(R"({"int":"4"})"), 1e-9, 0, ""},
      {TestPlan::kEqual, "f()",
       nlohmann::json::parse(R"({"tuple":[{"float":"1.5"},{"set":[true,"a"]},{"dict":[[null,{"list":[]}]]}]})"), 1e-9,
       0, ""},
      {TestPlan::kIsClose, "f()", nlohmann::json::parse(R"({"float":"0.25"})"), 1e-6, 1e-9, ""},
  };
  for (const auto& p : plans) (void)mgrl::rl::passes(p, bytes);
  nlohmann::json v;
  if (mgrl::rl::parse_report(bytes, &v)) (void)mgrl::rl::py_equal(v, v);
  std::vector<TestPlan> out;
  (void)mgrl::rl::parse_plans(bytes, 2, &out);
  return 0;
}
