// mpi_gtest_main.h: access to the MPI environment of a test binary started by mpi_gtest_main.cpp.
#pragma once
#include <string>

#include "dist/mpi_env.h"

namespace mgrl::test {

dist::MpiEnv& env();
// Value of a --name=value argument given to the test binary ("" when absent).
std::string arg(const std::string& name);
// Exit code that CTest counts as "skipped" (SKIP_RETURN_CODE).
inline constexpr int kSkip = 77;

}  // namespace mgrl::test
