// cli.h: the command line: mgrl [MODE] [INPUT.toml] [--section.key=value ...] | --help | --version.
#pragma once
#include <string>
#include <vector>

namespace mgrl::app {

struct Cli {
  bool help = false;
  bool version = false;
  std::string mode;                    // "" when not on the command line
  std::string input;                   // "" when no TOML file
  std::vector<std::string> overrides;  // "--section.key=value"
};

// Throws UserError on a malformed command line.
Cli parse_cli(int argc, char** argv);
std::string usage();

}  // namespace mgrl::app
