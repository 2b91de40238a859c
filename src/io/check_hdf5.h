// check_hdf5.h: H5_CHECK, the HDF5 member of the check-macro family (core/error.h).
// HDF5 calls return a negative value on failure.
#pragma once
#include <hdf5.h>

#include "core/error.h"

#define H5_CHECK(expr)                                                                   \
  ([&]() {                                                                               \
    const auto mgrl_h5_ = (expr);                                                        \
    if (mgrl_h5_ < 0) ::mgrl::check_failed("HDF5", #expr, "", __FILE__, __LINE__);       \
    return mgrl_h5_;                                                                     \
  }())
