// launcher_fence.h: a barrier through the launcher's PMIx server, with its status checked, right after MPI_Init.
// Why: Open MPI 4.1 ends MPI_Init with PMIx fences whose completion status it ignores; when one completes early (seen
// under srun with the TCP transport on loaded nodes) a rank leaves MPI_Init and sends its first message to a rank
// still inside it, whose PML has not registered its handlers yet: that rank jumps to a null callback (SIGSEGV) or
// the job hangs in the first collective. A rank passes this fence only when every rank has entered it, that is, has
// left MPI_Init; a fence that fails ends the rank with one line instead.
#pragma once
#include <string>

namespace mgrl::dist {

struct LauncherFence {
  bool ran = false;     // false: no PMIx client in this process (a singleton, or an MPI without external PMIx)
  int status = 0;       // PMIx status (0 = success)
  double seconds = 0;   // how long it took
  std::string skipped;  // why it did not run
};

// The fence over every process of this job's namespace (PMIx_Fence with no procs, no data). Looked up at run time
// in the libpmix that Open MPI has already loaded: nothing to link, nothing done where there is none.
LauncherFence launcher_fence();

}  // namespace mgrl::dist
