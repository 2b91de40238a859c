// stop_agreement.cpp: ranks agree on a stop signal after each optimizer step.
#include "train/stop_agreement.h"

#include <string>

#include "core/log.h"
#include "core/stop.h"

namespace mgrl::train {

bool stop_agreed(const dist::MpiEnv& env, std::int64_t step) {
  const bool mine = stop::pending_signal() != 0;
  if (env.allreduce_max(mine ? 1 : 0) == 0) return false;
  // Who got it (the lowest such rank), and which signal, for the one log line.
  const int first = env.allreduce_min(mine ? env.rank() : env.size());
  const std::string name = env.broadcast(mine ? std::string(stop::pending_signal_name()) : std::string(), first);
  if (!stop::stopped_early())
    log::info("stopping after step " + std::to_string(step) + ": " + name + " on rank " + std::to_string(first) +
              " (checkpoint, then exit code 3; resume with checkpoint.resume = \"auto\")");
  stop::mark_stopped_early();
  return true;
}

}  // namespace mgrl::train
