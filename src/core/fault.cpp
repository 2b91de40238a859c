// fault.cpp: MGRL_FAULT_INJECT, parsed once on first use.
#include "core/fault.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"

namespace mgrl::fault {
namespace {

struct Spec {
  bool set = false;
  std::string point;
  int rank = -1;
  std::int64_t step = -1;
  std::int64_t count = 1;  // steps step .. step + count - 1
  bool kill = false;
  bool segv = false;  // action=segv: a call through a null function pointer
  bool sleep = false;  // action=sleep: the point takes secs seconds, then the run goes on
  double secs = 0;
};

Spec parse(const char* text) {
  Spec s;
  if (text == nullptr || *text == '\0') return s;
  const std::string all(text);
  const auto bad = [&all](const std::string& why) {
    return UserError("MGRL_FAULT_INJECT='" + all + "': " + why +
                     " (expected <point>:rank=<R>:step=<N>[:count=<K>][:action=throw|kill|segv|sleep:secs=<S>], or "
                     "grad_overflow[_local]:rank=<R>:step=<N>[:count=<K>], or startup_stall:rank=<R>:step=0)");
  };
  std::size_t start = 0;
  bool first = true;
  while (start <= all.size()) {
    const std::size_t colon = std::min(all.find(':', start), all.size());
    const std::string field = all.substr(start, colon - start);
    start = colon + 1;
    if (first) {
      if (field != "checkpoint_write" && field != "output_write" && field != "grad_overflow" &&
          field != "grad_overflow_local" && field != "startup_stall" && field != "startup" &&
          field != "generate_step" && field != "training_setup")
        throw bad("unknown point '" + field + "'");
      s.point = field;
      first = false;
      continue;
    }
    const auto eq = field.find('=');
    if (eq == std::string::npos) throw bad("'" + field + "' is not key=value");
    const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
    char* end = nullptr;
    const bool corrupts = s.point == "grad_overflow" || s.point == "grad_overflow_local";
    if (key == "rank" || key == "step" || key == "count") {
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < (key == "count" ? 1 : 0))
        throw bad(key + (key == "count" ? " must be a number >= 1" : " must be a number >= 0"));
      if (key == "rank") s.rank = static_cast<int>(v);
      else if (key == "step") s.step = v;
      else s.count = v;
    } else if (key == "action" && !corrupts &&
               (value == "throw" || value == "kill" || value == "segv" || value == "sleep")) {
      s.kill = value == "kill";
      s.segv = value == "segv";
      s.sleep = value == "sleep";
    } else if (key == "secs" && !corrupts) {
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(v >= 0)) throw bad("secs must be a number >= 0");
      s.secs = v;
    } else {
      throw bad("unknown field '" + field + "'");
    }
  }
  if (s.rank < 0 || s.step < 0) throw bad("rank and step are required");
  if (s.sleep != (s.secs > 0)) throw bad("action=sleep and secs=<S> (S > 0) go together");
  s.set = true;
  return s;
}

int g_rank = 0;

const Spec& spec() {
  static const Spec s = parse(std::getenv("MGRL_FAULT_INJECT"));
  return s;
}

}  // namespace

bool fires(const char* name, int rank, std::int64_t step) {
  const Spec& s = spec();
  return s.set && s.rank == rank && s.point == name && step >= s.step && step - s.step < s.count;
}

void set_rank(int rank) { g_rank = rank; }

void point(const char* name, std::int64_t step) { point(name, g_rank, step); }

void point(const char* name, int rank, std::int64_t step) {
  const Spec& s = spec();
  if (!s.set) return;
  if (!fires(name, rank, step)) return;
  const std::string what = std::string("fault injected by MGRL_FAULT_INJECT: ") + name + " on rank " +
                           std::to_string(rank) + " at step " + std::to_string(step);
  if (s.sleep) {  // as a slow file system (or a rank busy for that long) would: the run then goes on
    std::this_thread::sleep_for(std::chrono::duration<double>(s.secs));
    return;
  }
  if (s.kill) {
    ::kill(::getpid(), SIGKILL);
    ::pause();
  }
  if (s.segv) {  // as a library calling through a null function pointer would (core/crash.h reports it)
    void (*volatile null_call)() = nullptr;
    null_call();
  }
  throw FatalError(what);
}

}  // namespace mgrl::fault
