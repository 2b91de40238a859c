// check_mpi.h: MPI_CHECK and NCCL_CHECK, members of the check-macro family (core/error.h).
// Private to src/dist: no other layer calls MPI or NCCL.
#pragma once
#include <mpi.h>

#include <string>

#include "core/error.h"

namespace mgrl::dist {
inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}
}  // namespace mgrl::dist

#define MPI_CHECK(expr)                                                                            \
  do {                                                                                             \
    const int mgrl_rc_ = (expr);                                                                    \
    if (mgrl_rc_ != MPI_SUCCESS)                                                                   \
      ::mgrl::check_failed("MPI", #expr, ::mgrl::dist::mpi_error_string(mgrl_rc_), __FILE__, __LINE__); \
  } while (0)

#if MGRL_WITH_CUDA
#include <nccl.h>
#define NCCL_CHECK(expr)                                                                           \
  do {                                                                                             \
    const ncclResult_t mgrl_nr_ = (expr);                                                           \
    if (mgrl_nr_ != ncclSuccess && mgrl_nr_ != ncclInProgress)                                     \
      ::mgrl::check_failed("NCCL", #expr, ncclGetErrorString(mgrl_nr_), __FILE__, __LINE__);        \
  } while (0)
#endif
