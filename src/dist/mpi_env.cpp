// mpi_env.cpp: MPI initialisation, node-local ranks, gathers and collective error agreement.
#include "dist/mpi_env.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

#include "core/crash.h"
#include "core/fault.h"
#include "core/log.h"
#include "dist/check_mpi.h"
#include "dist/comm_detail.h"
#include "dist/peers.h"
#include "dist/watchdog.h"

namespace mgrl::dist {
namespace {
bool g_mpi_up = false;
std::atomic<bool> g_started{false};

// MPI's start-up (MPI_Init_thread and the first collectives) runs before the watchdog can: a rank that dies or
// cannot connect there (seen: Open MPI's TCP transport crashing in one rank under srun) leaves the others waiting
// for good. A thread armed before MPI_Init_thread ends this rank with one line and exit code 4 (a lost rank, which
// slurm/common.sh requeues) when the start-up has not finished within MGRL_STARTUP_TIMEOUT_S seconds (default 300).
void arm_startup_deadline() {
  double secs = 300;
  if (const char* e = std::getenv("MGRL_STARTUP_TIMEOUT_S")) {
    char* end = nullptr;
    const double v = std::strtod(e, &end);
    if (end != e && *end == '\0' && v > 0) secs = v;
  }
  std::thread([secs] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(secs);
    while (std::chrono::steady_clock::now() < until) {
      if (g_started.load()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (g_started.load()) return;
    std::fprintf(stderr,
                 "mgrl: rank %s on host %s (pid %d): MPI start-up did not finish in %g s (MGRL_STARTUP_TIMEOUT_S): "
                 "another rank ended or could not connect while MPI was set up; ending this rank\n",
                 crash::launcher_rank(), crash::host(), static_cast<int>(::getpid()), secs);
    std::fflush(stderr);
    _exit(kExitRankLost);
  }).detach();
}

void on_terminate() {
  // An exception escaped or std::terminate was called: never leave the other ranks waiting.
  std::string what = "unknown exception";
  if (auto ep = std::current_exception()) {
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
  }
  log::error("terminating: " + what);
  abort_job(kExitFatal);
}
}  // namespace

void abort_job(int exit_code) {
  // This rank's line is out: the other ranks of the host must not add lines of their own about its end.
  peers::mark_speaking();
  crash::exit_expected();  // MPI_Abort may end the process by exit(): this rank's line is already out
  std::fflush(stdout);
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  _exit(exit_code);
}

MpiEnv::MpiEnv(int* argc, char*** argv) {
  int provided = 0;
  // A rank that dies of a signal says so in one line with its frames (Open MPI keeps a handler already installed).
  crash::install();
  // A crash in MPI's start-up (seen: Open MPI's TCP transport, docs/reliability.md) is the MPI's, not the run's:
  // exit code 4, a lost rank, which slurm/common.sh requeues.
  crash::set_phase("MPI start-up (MPI_Init_thread and the first collectives)", kExitRankLost);
  arm_startup_deadline();
  // THREAD_MULTIPLE: the watchdog thread may call MPI_Abort while the main thread is inside MPI.
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  g_mpi_up = true;
  std::set_terminate(on_terminate);
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  log::set_rank(rank_);
  crash::set_rank(rank_);
  fault::set_rank(rank_);

  fault::point("startup", rank_, 0);  // tests: action=segv crashes as Open MPI's start-up did (core/fault.h)
  if (fault::fires("startup_stall", rank_, 0))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
  MPI_CHECK(MPI_Comm_size(local, &local_size_));
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  host_.assign(name, static_cast<std::size_t>(len));
  peers::init(MPI_COMM_WORLD, local, host_);
  MPI_CHECK(MPI_Comm_free(&local));
  num_nodes_ = static_cast<int>(allreduce_sum(static_cast<long long>(local_rank_ == 0 ? 1 : 0)));
  g_started.store(true);
  crash::set_phase("the run");
}

MpiEnv::~MpiEnv() {
  crash::exit_expected();  // the normal end: the exit() after main returns is not a library's silent one
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    peers::finalize();
    MPI_Finalize();
  }
  peers::close_probe();
  g_mpi_up = false;
}

struct MpiEnv::Watched {
  Watchdog::Guard guard;
};

MpiEnv::Watched MpiEnv::watch(const char* op, std::size_t count, const char* type, const Patience& patience) const {
  if (!watchdog_) return {Watchdog::Guard(nullptr, 0)};
  return {watchdog_->watch(detail::describe(op, ++seq_, count, type), patience.extra_s, patience.why)};
}

std::string MpiEnv::library_version() const {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_CHECK(MPI_Get_library_version(buf, &len));
  std::string s(buf, static_cast<std::size_t>(len));
  const auto nl = s.find_first_of("\r\n");
  if (nl != std::string::npos) s.resize(nl);
  while (!s.empty() && (s.back() == ',' || s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string MpiEnv::standard_version() const {
  int major = 0, minor = 0;
  MPI_CHECK(MPI_Get_version(&major, &minor));
  return std::to_string(major) + "." + std::to_string(minor);
}

void MpiEnv::barrier(const Patience& patience) const {
  const auto g = watch("env.barrier", 0, "-", patience);
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

int MpiEnv::allreduce_max(int v, const Patience& patience) const {
  const auto g = watch("env.allreduce_max", 1, "i32", patience);
  int out = 0;
  MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  return out;
}

int MpiEnv::allreduce_min(int v) const {
  const auto g = watch("env.allreduce_min", 1, "i32");
  int out = 0;
  MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return out;
}

double MpiEnv::allreduce_max(double v) const {
  const auto g = watch("env.allreduce_max", 1, "f64");
  double out = 0;
  MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return out;
}

long long MpiEnv::allreduce_sum(long long v) const {
  const auto g = watch("env.allreduce_sum", 1, "i64");
  long long out = 0;
  MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
  return out;
}

double MpiEnv::allreduce_sum(double v) const {
  const auto g = watch("env.allreduce_sum", 1, "f64");
  double out = 0;
  MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  return out;
}

std::vector<std::string> MpiEnv::gather_to_root(const std::string& s, const Patience& patience) const {
  const auto g = watch("env.gather", s.size(), "byte", patience);
  int len = static_cast<int>(s.size());
  std::vector<int> lens(rank_ == 0 ? size_ : 0), displs(rank_ == 0 ? size_ : 0);
  MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::string all;
  if (rank_ == 0) {
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[r] = total;
      total += lens[r];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  MPI_CHECK(MPI_Gatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0,
                        MPI_COMM_WORLD));
  std::vector<std::string> out;
  if (rank_ == 0) {
    for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], lens[r]));
  }
  return out;
}

std::string MpiEnv::broadcast(const std::string& s, int root) const {
  const auto g = watch("env.broadcast", s.size(), "byte");
  int len = static_cast<int>(s.size());
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, root, MPI_COMM_WORLD));
  std::string out = rank_ == root ? s : std::string(static_cast<std::size_t>(len), '\0');
  MPI_CHECK(MPI_Bcast(out.data(), len, MPI_CHAR, root, MPI_COMM_WORLD));
  return out;
}

void MpiEnv::agree(const std::function<void()>& fn, const Patience& patience) const {
  int code = 0;
  std::string msg;
  try {
    fn();
  } catch (const UserError& e) {
    code = kExitUserError;
    msg = e.what();
  } catch (const std::exception& e) {
    code = kExitFatal;
    msg = e.what();
  }
  // The first collective after fn is where the ranks that finished early wait for the others.
  const int worst = allreduce_max(code, patience);
  if (worst == 0) return;
  // The lowest rank with the worst outcome speaks for the job.
  const int speaker = allreduce_min(code == worst ? rank_ : size_);
  const std::string text = broadcast(msg, speaker);
  if (rank_ == 0) {
    // An error of another rank than the one printing names it (a file missing on rank 1's node alone read as a
    // plain "cannot open" where the user sees the file, until 2026-11-28).
    const std::string who = size_ == 1                ? std::string()
                            : worst == kExitFatal     ? "rank " + std::to_string(speaker) + ": "
                            : speaker != 0            ? "[rank " + std::to_string(speaker) + "] "
                                                      : std::string();
    log::error(who + text);
  }
  throw JobFailed{worst};
}

int run_guarded(const MpiEnv& env, const std::function<int()>& body) {
  try {
    return body();
  } catch (const JobFailed& f) {
    return f.exit_code;
  } catch (const UserError& e) {
    log::error(e.what());
    if (env.size() == 1) return kExitUserError;
    abort_job(kExitUserError);
  } catch (const std::exception& e) {
    log::error(e.what());
    if (env.size() == 1) return kExitFatal;
    abort_job(kExitFatal);
  }
}

}  // namespace mgrl::dist
