// fault.cpp: MGRL_FAULT_INJECT parsing.
#include "core/fault.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace mgrl::fault {

namespace {
struct Spec {
  std::string point;
  std::int64_t step = -1;
};
Spec parse() {
  Spec s;
  const char* v = std::getenv("MGRL_FAULT_INJECT");
  if (!v) return s;
  const char* at = std::strchr(v, '@');
  if (!at) return s;
  s.point.assign(v, static_cast<std::size_t>(at - v));
  s.step = std::strtoll(at + 1, nullptr, 10);
  return s;
}
}  // namespace

bool injected(const char* point, std::int64_t step) {
  static const Spec spec = parse();
  return spec.step >= 0 && step == spec.step && spec.point == point;
}

}  // namespace mgrl::fault
