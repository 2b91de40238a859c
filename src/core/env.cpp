// env.cpp: switches set in the environment.
#include "core/env.h"

#include <cstdlib>
#include <cstring>

#include "core/log.h"

namespace mgrl::env {

bool switch_on(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || std::strcmp(e, "0") != 0;
}

bool opt_in(const char* name) {
  const char* e = std::getenv(name);
  return e != nullptr && std::strcmp(e, "1") == 0;
}

bool opt_in_logged(const char* name, const char* when_on) {
  const bool on = opt_in(name);
  if (on) log::info(when_on);
  return on;
}

bool switch_on_logged(const char* name, const char* when_off) {
  const bool on = switch_on(name);
  if (!on) log::info(when_off);
  return on;
}

}  // namespace mgrl::env
