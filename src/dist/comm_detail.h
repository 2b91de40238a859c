// comm_detail.h: pieces shared by the Comm implementations (private to src/dist).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace mgrl::dist::detail {

// "allreduce_sum #12 (f32 x 4096)" for watchdog messages.
inline std::string describe(const char* op, std::uint64_t seq, std::size_t count, const char* type) {
  return std::string(op) + " #" + std::to_string(seq) + " (" + type + " x " + std::to_string(count) + ")";
}

}  // namespace mgrl::dist::detail
