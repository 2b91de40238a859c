// error.h: the two error kinds (user error -> exit 2, fatal error -> whole job ends) and the
// base of the check-macro family (MGRL_CHECK here; CUDA/cuBLAS in core/check_cuda.h,
// MPI/NCCL in dist/check_mpi.h, HDF5 in io/check_hdf5.h).
#pragma once
#include <stdexcept>
#include <string>

namespace mgrl {

// Bad input, bad config, missing or corrupt files: one clear line, exit code 2.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& what) : std::runtime_error(what) {}
};

// A failed library call or a broken invariant: reported with file, line and rank; ends the job.
class FatalError : public std::runtime_error {
 public:
  explicit FatalError(const std::string& what) : std::runtime_error(what) {}
};

// A device or host allocation that could not be satisfied (a FatalError unless the caller can name the setting that
// asked for the memory, which turns it into a UserError).
class OutOfMemory : public FatalError {
 public:
  explicit OutOfMemory(const std::string& what) : FatalError(what) {}
};

inline constexpr int kExitUserError = 2;
inline constexpr int kExitFatal = 1;
// A training run stopped early by SIGUSR1, SIGTERM or SIGINT after writing its checkpoint: work is left, resume
// with checkpoint.resume = "auto" (slurm/common.sh requeues the job on this code).
inline constexpr int kExitStopped = 3;
// Another rank of the job ended (killed, crashed) or became unreachable (its node or network lost) while this one ran:
// the job can resume from its last checkpoint once the node is back (slurm/common.sh requeues the job on this code).
inline constexpr int kExitRankLost = 4;

// Throws FatalError "<lib> error at <file>:<line> (rank R): <expr> failed: <detail>".
[[noreturn]] void check_failed(const char* lib, const char* expr, const std::string& detail, const char* file,
                               int line);

// Path of a source file relative to the source tree (for messages).
const char* source_relative(const char* file);

}  // namespace mgrl

#define MGRL_CHECK(cond, msg)                                              \
  do {                                                                     \
    if (!(cond)) ::mgrl::check_failed("mgrl", #cond, (msg), __FILE__, __LINE__); \
  } while (0)
