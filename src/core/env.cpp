// env.cpp: switches set in the environment.
#include "core/env.h"

#include <cstdlib>
#include <cstring>

namespace mgrl::env {

bool switch_on(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || std::strcmp(e, "0") != 0;
}

}  // namespace mgrl::env
