// check_hdf5.h: H5_CHECK, the HDF5 member of the check-macro family (core/error.h).
// HDF5 calls return a negative value on failure.
#pragma once
#include <hdf5.h>

#include <cstring>
#include <string>

#include "core/error.h"

namespace mgrl::io {

// The operating system's reason for the HDF5 call that has just failed ("No space left on device"), found in
// libhdf5's error stack (its file drivers record errno's message there); "" when no system call failed.
inline std::string hdf5_system_error() {
  std::string reason;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        static const char key[] = "error message = '";
        const char* at = e->desc ? std::strstr(e->desc, key) : nullptr;
        const char* end = at ? std::strchr(at + sizeof key - 1, '\'') : nullptr;
        if (end) *static_cast<std::string*>(out) = std::string(at + sizeof key - 1, end);
        return 0;
      },
      &reason);
  return reason;
}

}  // namespace mgrl::io

#define H5_CHECK(expr)                                                                                \
  ([&]() {                                                                                            \
    const auto mgrl_h5_ = (expr);                                                                     \
    if (mgrl_h5_ < 0) ::mgrl::check_failed("HDF5", #expr, ::mgrl::io::hdf5_system_error(), __FILE__, __LINE__); \
    return mgrl_h5_;                                                                                  \
  }())
