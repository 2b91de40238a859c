// cli.cpp: command-line parsing with Boost.Program_options; --section.key=value arguments are
// passed through to the configuration.
#include "app/cli.h"

#include <algorithm>
#include <boost/program_options.hpp>

#include "core/error.h"
#include "io/config.h"
#include "io/config_schema.h"

namespace po = boost::program_options;

namespace mgrl::app {

std::string usage() {
  std::string modes;
  for (const auto& m : io::mgrl_modes()) modes += (modes.empty() ? "" : ", ") + m;
  return "usage: mgrl [MODE] [INPUT.toml] [--section.key=value ...]\n"
         "       mgrl --help | --version\n"
         "\n"
         "Fine-tunes language models with LoRA or fully (SFT, GRPO, DPO, PPO), one MPI rank per GPU:\n"
         "  srun -n 4 mgrl input.toml        mpirun -n 2 mgrl info\n"
         "\n"
         "MODE     " + modes + " (or the key `mode` of INPUT.toml)\n"
         "INPUT    a TOML file describing the run; a key left out takes its default (model.path and\n"
         "         data.input have none: the run names them)\n"
         "--section.key=value  sets any configuration key, over the file's value\n"
         "\n"
         "mgrl help-config prints every key with its type, default and meaning.\n"
         "mgrl plan INPUT.toml [--gpus N] [--gpu-memory 80GiB] [--json] prints the memory per rank a run needs.\n";
}

Cli parse_cli(int argc, char** argv) {
  Cli cli;
  po::options_description opts("options");
  opts.add_options()("help,h", "print usage")("version", "print the version");
  po::options_description hidden;
  hidden.add_options()("positional", po::value<std::vector<std::string>>(), "mode and input file");
  po::options_description all;
  all.add(opts).add(hidden);
  po::positional_options_description pos;
  pos.add("positional", -1);

  // --section.key=value arguments go to the configuration as they are, an empty value included
  // (`--checkpoint.dir=`: no checkpoints); Boost would refuse the empty value, so they bypass it.
  std::vector<std::string> rest;
  // `mgrl plan` takes --gpus N, --gpu-memory SIZE and --json as short forms of plan.gpus, plan.gpu_memory and
  // plan.json (with a space or an '=' before the value).
  bool plan = false;
  for (int i = 1; i < argc && !plan; ++i) {
    if (std::string(argv[i]).rfind("--", 0) == 0) continue;
    plan = std::string(argv[i]) == "plan";
    break;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (plan) {
      if (a == "--json") {
        cli.overrides.push_back("--plan.json=true");
        continue;
      }
      bool handled = false;
      for (const auto& [flag, key] : {std::pair<std::string, std::string>{"--gpus", "plan.gpus"},
                                      std::pair<std::string, std::string>{"--gpu-memory", "plan.gpu_memory"}}) {
        if (a == flag) {
          if (i + 1 >= argc) throw UserError("command line: " + flag + " needs a value");
          cli.overrides.push_back("--" + key + "=" + argv[++i]);
          handled = true;
        } else if (a.rfind(flag + "=", 0) == 0) {
          cli.overrides.push_back("--" + key + "=" + a.substr(flag.size() + 1));
          handled = true;
        }
      }
      if (handled) continue;
    }
    const auto eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos && eq > 2 && a.compare(0, eq, "--help") != 0 &&
        a.compare(0, eq, "--version") != 0)
      cli.overrides.push_back(a);
    else
      rest.push_back(a);
  }

  po::variables_map vm;
  std::vector<std::string> unknown;
  try {
    const auto parsed = po::command_line_parser(rest)
                            .options(all)
                            .positional(pos)
                            .allow_unregistered()
                            .style(po::command_line_style::unix_style ^ po::command_line_style::allow_guessing)
                            .run();
    po::store(parsed, vm);
    unknown = po::collect_unrecognized(parsed.options, po::exclude_positional);
  } catch (const po::error& e) {
    throw UserError(std::string("command line: ") + e.what());
  }
  cli.help = vm.count("help") != 0;
  cli.version = vm.count("version") != 0;

  // Unregistered options: --section.key=value (kept whole for the configuration).
  for (const auto& u : unknown) {
    if (u.rfind("--", 0) != 0 || u.size() < 3)
      throw UserError("command line: unknown option '" + u + "' (configuration keys are given as --section.key=value)");
    cli.overrides.push_back(u);
  }

  std::vector<std::string> positional;
  if (vm.count("positional")) positional = vm["positional"].as<std::vector<std::string>>();
  const auto& modes = io::mgrl_modes();
  auto is_mode = [&](const std::string& s) { return std::find(modes.begin(), modes.end(), s) != modes.end(); };
  for (std::size_t i = 0; i < positional.size(); ++i) {
    const std::string& p = positional[i];
    if (i == 0 && is_mode(p)) {
      cli.mode = p;
    } else if (cli.input.empty() && p.size() > 5 && p.compare(p.size() - 5, 5, ".toml") == 0) {
      cli.input = p;
    } else if (i == 0 && p.find('.') == std::string::npos && p.find('/') == std::string::npos) {
      const std::string near = io::closest(p, modes);
      std::string msg = "command line: unknown mode '" + p + "'";
      if (!near.empty()) msg += " (did you mean '" + near + "'?)";
      std::string list;
      for (const auto& m : modes) list += (list.empty() ? "" : ", ") + m;
      throw UserError(msg + "; modes: " + list);
    } else {
      throw UserError("command line: unexpected argument '" + p +
                      "' (expected: mgrl [MODE] [INPUT.toml] [--section.key=value ...])");
    }
  }
  return cli;
}

}  // namespace mgrl::app
