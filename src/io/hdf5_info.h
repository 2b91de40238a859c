// hdf5_info.h: facts about the HDF5 library mgrl was built with.
#pragma once
#include <string>

namespace mgrl::io {

// "1.10.8 (parallel)" from the library loaded at run time.
std::string hdf5_version();

}  // namespace mgrl::io
