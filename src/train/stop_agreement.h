// stop_agreement.h: the training loops' side of a graceful stop (core/stop.h): at the end of every optimizer step
// the ranks agree whether a stop signal reached any of them, so that all stop after the same step.
#pragma once
#include <cstdint>

#include "dist/mpi_env.h"

namespace mgrl::train {

// Collective, once per optimizer step (one int max-allreduce). True on every rank when any rank has received a
// stop signal; then it logs the stop once and marks the process as stopped early (exit code kExitStopped). The
// caller saves its checkpoint (checkpointing: it has a checkpoint.dir; else the line says that nothing is saved) and
// leaves the loop.
bool stop_agreed(const dist::MpiEnv& env, std::int64_t step, bool checkpointing);

}  // namespace mgrl::train
