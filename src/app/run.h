// run.h: the program behind main(): command line -> configuration -> device -> mode.
#pragma once

namespace mgrl::dist {
class MpiEnv;
}

namespace mgrl::app {

// Returns the process exit code (0, 2 for user errors, 1 for fatal ones). Errors that only some
// ranks meet end the whole job instead of returning.
int run(dist::MpiEnv& env, int argc, char** argv);

}  // namespace mgrl::app
