// main.cpp: the mgrl binary: brings MPI up, runs the command line, returns its exit code.
#include <cstdio>
#include <exception>

#include "app/run.h"
#include "core/crash.h"
#include "core/error.h"
#include "dist/mpi_env.h"

int main(int argc, char** argv) {
  try {
    mgrl::dist::MpiEnv env(&argc, &argv);
    return mgrl::app::run(env, argc, argv);
  } catch (const std::exception& e) {  // MPI could not be brought up
    mgrl::crash::exit_expected();       // this line is the report
    std::fprintf(stderr, "mgrl: error: %s\n", e.what());
    return mgrl::kExitFatal;
  }
}
