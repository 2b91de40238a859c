// sandbox.h: runs an untrusted Python program (a completion's code) with limits: a fresh temporary directory
// (removed afterwards) as its only writable place, an empty environment, no inherited file descriptors, its own
// process group, new mount (a root file system of its own holding only the system's programs and libraries and the
// interpreter, read-only; else everything read-only), network (no interfaces up) and PID namespaces where the
// system allows them, an unprivileged user (root drops to nobody, so RLIMIT_NPROC holds), rlimits on CPU time,
// address space, file size, open files and processes, a wall-clock timeout that kills everything it started,
// and a cap on the output read.
#pragma once
#include <cstddef>
#include <string>

namespace mgrl::rl {

struct SandboxLimits {
  double wall_s = 10;
  int cpu_s = 5;
  long memory_mb = 1024;
  int processes = 64;
  long file_mb = 16;
  std::size_t max_output = 1 << 20;
  // mgrl's own program (the code_exec test planner), not a completion's: when mgrl runs as root it keeps root
  // instead of becoming nobody, so that completions (nobody) can neither signal nor trace it.
  bool own_program = false;
};

struct SandboxResult {
  bool timed_out = false, output_capped = false, setup_failed = false;
  int status = -1;  // exit code, or 128 + signal
  std::string output;  // stdout and stderr, at most max_output bytes
};

// What this machine lets the sandbox enforce (probed once).
struct SandboxSupport {
  bool namespaces = false;  // mount + network + PID namespaces (and a user namespace when not root)
  bool own_root = false;    // a root file system of its own (pivot_root): the rest of the machine's files unseen
  bool root = false;        // runs as root: drops to nobody
  std::string describe() const;
};
const SandboxSupport& sandbox_support();

// Writes `files` (name, content) into a fresh directory and runs `python main.py` there.
SandboxResult run_sandboxed(const std::string& python, const std::string& main_py, const SandboxLimits& limits);

}  // namespace mgrl::rl
