// modes.h: what a mode receives, and the modes.
#pragma once

namespace mgrl::dist {
class MpiEnv;
class Comm;
struct Device;
}  // namespace mgrl::dist
namespace mgrl::io {
class Config;
}

namespace mgrl::app {

struct Context {
  dist::MpiEnv& env;
  const io::Config& cfg;
  const dist::Device& device;
  dist::Comm& comm;
};

// `mgrl info`: one line per rank (in rank order), then versions, build options, P2P matrix.
int run_info(Context& ctx);

}  // namespace mgrl::app
