// fault.cpp: MGRL_FAULT_INJECT, parsed once on first use.
#include "core/fault.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace mgrl::fault {
namespace {

struct Spec {
  bool set = false;
  std::string point;
  int rank = -1;
  std::int64_t step = -1;
  bool kill = false;
};

Spec parse(const char* text) {
  Spec s;
  if (text == nullptr || *text == '\0') return s;
  const std::string all(text);
  const auto bad = [&all](const std::string& why) {
    return UserError("MGRL_FAULT_INJECT='" + all + "': " + why +
                     " (expected <point>:rank=<R>:step=<N>[:action=throw|kill])");
  };
  std::size_t start = 0;
  bool first = true;
  while (start <= all.size()) {
    const std::size_t colon = std::min(all.find(':', start), all.size());
    const std::string field = all.substr(start, colon - start);
    start = colon + 1;
    if (first) {
      if (field != "checkpoint_write" && field != "output_write") throw bad("unknown point '" + field + "'");
      s.point = field;
      first = false;
      continue;
    }
    const auto eq = field.find('=');
    if (eq == std::string::npos) throw bad("'" + field + "' is not key=value");
    const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
    char* end = nullptr;
    if (key == "rank" || key == "step") {
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < 0) throw bad(key + " must be a number >= 0");
      if (key == "rank") s.rank = static_cast<int>(v);
      else s.step = v;
    } else if (key == "action" && (value == "throw" || value == "kill")) {
      s.kill = value == "kill";
    } else {
      throw bad("unknown field '" + field + "'");
    }
  }
  if (s.rank < 0 || s.step < 0) throw bad("rank and step are required");
  s.set = true;
  return s;
}

}  // namespace

void point(const char* name, int rank, std::int64_t step) {
  static const Spec spec = parse(std::getenv("MGRL_FAULT_INJECT"));
  if (!spec.set) return;
  if (spec.rank != rank || spec.step != step || spec.point != name) return;
  const std::string what = std::string("fault injected by MGRL_FAULT_INJECT: ") + name + " on rank " +
                           std::to_string(rank) + " at step " + std::to_string(step);
  if (spec.kill) {
    ::kill(::getpid(), SIGKILL);
    ::pause();
  }
  throw FatalError(what);
}

}  // namespace mgrl::fault
