// log.cpp: rank-aware logging to stdout (info) and stderr (warnings, errors).
#include "core/log.h"

#include <cstdio>

#include "core/error.h"

namespace mgrl::log {
namespace {
int g_rank = -1;
Level g_level = Level::Info;

void emit(std::FILE* out, const std::string& line) {
  std::fputs(line.c_str(), out);
  std::fputc('\n', out);
  std::fflush(out);
}
std::string prefix() { return g_rank > 0 ? "[rank " + std::to_string(g_rank) + "] " : ""; }
}  // namespace

void set_rank(int r) { g_rank = r; }
int rank() { return g_rank; }
void set_level(Level l) { g_level = l; }
Level level() { return g_level; }

Level parse_level(const std::string& name) {
  if (name == "debug") return Level::Debug;
  if (name == "info") return Level::Info;
  if (name == "warn") return Level::Warn;
  if (name == "error") return Level::Error;
  throw UserError("unknown log level '" + name + "' (expected debug, info, warn or error)");
}

void info(const std::string& msg) {
  if (g_rank <= 0 && g_level <= Level::Info) emit(stdout, msg);
}
void debug(const std::string& msg) {
  if (g_level <= Level::Debug) emit(stdout, prefix() + msg);
}
void warn_once(const std::string& msg) {
  if (g_rank <= 0 && g_level <= Level::Warn) emit(stderr, "mgrl: warning: " + msg);
}
void warn(const std::string& msg) {
  if (g_level <= Level::Warn) emit(stderr, "mgrl: warning: " + prefix() + msg);
}
void error(const std::string& msg) { emit(stderr, "mgrl: error: " + prefix() + msg); }

}  // namespace mgrl::log
