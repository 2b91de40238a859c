// stop_agreement.cpp: ranks agree on a stop signal after each optimizer step.
#include "train/stop_agreement.h"

#include <string>

#include "core/log.h"
#include "core/stop.h"

namespace mgrl::train {

bool stop_agreed(const dist::MpiEnv& env, std::int64_t step, bool checkpointing) {
  const bool mine = stop::pending_signal() != 0;
  if (env.allreduce_max(mine ? 1 : 0) == 0) return false;
  // Who got it (the lowest such rank), and which signal, for the one log line.
  const int first = env.allreduce_min(mine ? env.rank() : env.size());
  const std::string name = env.broadcast(mine ? std::string(stop::pending_signal_name()) : std::string(), first);
  if (!stop::stopped_early()) {
    const std::string head = "stopping after step " + std::to_string(step) + ": " + name + " on rank " +
                             std::to_string(first);
    if (checkpointing)
      log::info(head + " (checkpoint, then exit code 3; resume with checkpoint.resume = \"auto\")");
    else  // before 2026-11-28 this said "checkpoint" too, and none was written
      log::warn_once(head + ", exit code 3; no checkpoint.dir is set, so nothing of this run is saved: a new run starts "
                "over (set checkpoint.dir to keep the work of a stopped run)");
  }
  stop::mark_stopped_early();
  return true;
}

}  // namespace mgrl::train
