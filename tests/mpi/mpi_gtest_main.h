// mpi_gtest_main.h: access to the MPI environment of a test binary started by mpi_gtest_main.cpp.
#pragma once
#include <functional>
#include <string>

#include "dist/mpi_env.h"

namespace mgrl::test {

dist::MpiEnv& env();
// Value of a --name=value argument given to the test binary ("" when absent).
std::string arg(const std::string& name);
// Runs fn at the end of main(), while the MPI environment still lives: test-wide objects that hold on to it (a
// communicator in a function-local static) must be released there, not by static destruction after main returns
// (AddressSanitizer: stack-use-after-return on the environment).
void before_exit(std::function<void()> fn);
// Exit code that CTest counts as "skipped" (SKIP_RETURN_CODE).
inline constexpr int kSkip = 77;

}  // namespace mgrl::test
