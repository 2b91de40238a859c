// config_schema.h: the one place where mgrl's configuration keys are declared.
#pragma once
#include "io/config.h"

namespace mgrl::io {

// Every key mgrl understands, with type, default and doc.
const Schema& mgrl_schema();
// The modes the binary knows (the choices of the key `mode`).
const std::vector<std::string>& mgrl_modes();

}  // namespace mgrl::io
