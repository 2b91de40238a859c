// hdf5_info.cpp: HDF5 library version and flavour.
#include "io/hdf5_info.h"

#include "io/check_hdf5.h"

namespace mgrl::io {

std::string hdf5_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5_CHECK(H5get_libversion(&major, &minor, &release));
  std::string v = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
#ifdef H5_HAVE_PARALLEL
  v += " (parallel)";
#else
  v += " (serial)";
#endif
  return v;
}

}  // namespace mgrl::io
