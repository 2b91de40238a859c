// failure_probe.cpp: a small MPI program in which one rank misbehaves, to show that the job ends
// with a message instead of hanging. Scenarios (argv[1]):
//   user-error-on-rank-1    rank 1 throws a UserError while the others wait in a barrier -> exit 2
//   fatal-on-last-rank      the last rank fails a check while the others wait -> exit 1
//   rank-1-skips-allreduce  rank 1 never joins an allreduce; the watchdog (2 s) ends the job -> exit 1
//   rank-1-skips-agreement  the same for one of MpiEnv's collectives (the training loops' agreements), which the
//                           communicator's watchdog watches too -> exit 1
//   library-exit-on-rank-1  rank 1 ends by a bare exit(1), as a library can (nvcc's host code for a __device__-only
//                           call): its line says so with the caller's frames, and the job ends -> exit != 0
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/device.h"
#include "dist/mpi_env.h"

using namespace mgrl;

int main(int argc, char** argv) {
  dist::MpiEnv env(&argc, &argv);
  const std::string scenario = argc > 1 ? argv[1] : "";
  return dist::run_guarded(env, [&]() -> int {
    const auto device = dist::choose_device(env, "cpu", 1);
    // A long timeout for the first two: the job must end because of the abort, not the watchdog.
    const bool skips = scenario == "rank-1-skips-allreduce" || scenario == "rank-1-skips-agreement";
    auto comm = dist::make_comm(env, device, skips ? 2.0 : 300.0);
    if (scenario == "user-error-on-rank-1") {
      if (env.rank() == 1) throw UserError("probe: user error on rank 1 only");
      comm->barrier();
    } else if (scenario == "fatal-on-last-rank") {
      MGRL_CHECK(env.rank() != env.size() - 1, "probe: fatal error on rank " + std::to_string(env.rank()) + " only");
      comm->barrier();
    } else if (scenario == "rank-1-skips-allreduce") {
      std::vector<float> v(16, 1.0f);
      if (env.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::seconds(60));
        return 0;
      }
      comm->allreduce_sum(v.data(), v.size(), DType::F32);
    } else if (scenario == "rank-1-skips-agreement") {
      if (env.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::seconds(60));
        return 0;
      }
      env.allreduce_max(1);
    } else if (scenario == "library-exit-on-rank-1") {
      if (env.rank() == 1) std::exit(1);
      comm->barrier();
    } else {
      throw UserError("unknown scenario '" + scenario + "'");
    }
    return 0;
  });
}
