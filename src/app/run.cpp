// run.cpp: command line -> configuration -> device -> mode, and the error policy: errors every
// rank meets are agreed on and reported once (exit 2 for user errors); errors of one rank end
// the whole job.
#include "app/run.h"

#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "app/cli.h"
#include "app/modes.h"
#include "core/build_info.h"
#include "core/error.h"
#include "core/log.h"
#include "core/fault.h"
#include "core/stop.h"
#include "dist/comm.h"
#include "dist/device.h"
#include "dist/mpi_env.h"
#include "io/config.h"
#include "io/config_schema.h"
#include "kernels/cpu/blas_info.h"

namespace mgrl::app {
namespace {

// The first key whose value differs between two effective configurations (Config::to_toml: [section] headers, then
// `key = value` lines), as one message.
std::string first_difference(const std::string& mine, const std::string& root) {
  std::istringstream a(mine), b(root);
  std::string la, lb, section;
  for (;;) {
    const bool more_a = static_cast<bool>(std::getline(a, la)), more_b = static_cast<bool>(std::getline(b, lb));
    if (!more_a && !more_b) break;
    if (more_a && !la.empty() && la.front() == '[') section = la.substr(1, la.find(']') - 1);
    if (more_a && more_b && la == lb) continue;
    const auto qualified = [&](bool more, const std::string& l) {
      return more ? "'" + (section.empty() || l.front() == '[' ? "" : section + ".") + l + "'" : std::string("nothing");
    };
    return "the configuration differs from rank 0's: " + qualified(more_a, la) + " here, " + qualified(more_b, lb) +
           " on rank 0 (every rank must be given the same input file and command line)";
  }
  return "the configuration differs from rank 0's";
}

}  // namespace

int run(dist::MpiEnv& env, int argc, char** argv) {
  return dist::run_guarded(env, [&]() -> int {
    Cli cli;
    io::Config cfg;
    env.agree([&] {
      cli = parse_cli(argc, argv);
      if (cli.help || cli.version) return;
      // help-config needs no valid file: it only prints the schema.
      if (cli.mode == "help-config") return;
      cfg = io::Config::load(io::mgrl_schema(), cli.input, cli.overrides, cli.mode);
      log::set_level(log::parse_level(cfg.get_string("log.level")));
    });
    if (cli.help) {
      if (env.rank() == 0) std::cout << usage();
      return 0;
    }
    if (cli.version) {
      if (env.rank() == 0) std::cout << "mgrl " << build_info().version << " (" << build_info().git_sha << ")\n";
      return 0;
    }
    // Every rank runs one configuration: ranks given other arguments (an MPMD launch, another working directory's
    // input file) corrupted the heap in the first gradient allreduce (another lora.r: other buffer sizes) or trained
    // apart in silence until 2026-11-28. The first key that differs from rank 0's is named.
    if (env.size() > 1 && cli.mode != "help-config")
      env.agree([&] {
        const std::string mine = cfg.to_toml(), root = env.broadcast(mine, 0);
        if (mine != root) throw UserError(first_difference(mine, root));
      });
    const std::string mode = cli.mode == "help-config" ? cli.mode : cfg.get_string("mode");
    if (mode == "help-config") {
      if (env.rank() == 0)
        std::cout << io::help_config(io::mgrl_schema(), std::string("mgrl ") + build_info().version +
                                                            ": configuration keys (mgrl help-config)");
      return 0;
    }

    // plan reads shapes and settings only: no device, no communicator (it plans for a GPU on any machine).
    if (mode == "plan") return run_plan(env, cfg);

    // Training stops gracefully on SIGUSR1 / SIGUSR2 / SIGTERM / SIGINT / SIGHUP (checkpoint, exit kExitStopped); others keep
    // the default actions.
    const bool training =
        mode == "sft" || mode == "grpo" || mode == "dpo" || mode == "kto" || mode == "ppo" || mode == "distill";
    if (training) {
      stop::install_handlers(env.rank() == 0);
      fault::point("training_setup", env.rank(), 0);  // tests: a long set-up that a stop signal interrupts
    }
    const auto exit_code = [](int rc) { return rc == 0 && stop::stopped_early() ? kExitStopped : rc; };

    dist::Device device;
    env.agree([&] {
      device = dist::choose_device(env, cfg.get_string("runtime.backend"),
                                   static_cast<int>(cfg.get_int("runtime.threads")));
    });
    kernels::cpu::set_blas_threads(device.cpu_threads);
    std::unique_ptr<dist::Comm> comm;
    env.agree([&] { comm = dist::make_comm(env, device, cfg.get_float("runtime.comm_timeout_s")); });

    Context ctx{env, cfg, device, *comm};
    if (mode == "info") return run_info(ctx);
    int rc = 0;
    if (mode == "sft") rc = exit_code(run_sft(ctx));
    else if (mode == "grpo") rc = exit_code(run_grpo(ctx));
    else if (mode == "dpo" || mode == "kto") rc = exit_code(run_dpo(ctx));
    else if (mode == "ppo") rc = exit_code(run_ppo(ctx));
    else if (mode == "distill") rc = exit_code(run_distill(ctx));
    else if (mode == "reward") rc = run_reward(ctx);
    else if (mode == "export") rc = run_export(ctx);
    else if (mode == "score") rc = run_score(ctx);
    else if (mode == "generate") rc = run_generate(ctx);
    else if (mode == "render") rc = run_render(ctx);
    else throw UserError("mode '" + mode + "' is not implemented in this build");
    // Keys given for this run that it never read (until 2026-11-28 accepted in silence: --grpo.beta in sft, eval.pass_k
    // in ppo): said at the end of every run, and by the modes that say it before their work, there.
    say_unused_keys(ctx);
    return rc;
  });
}

}  // namespace mgrl::app
