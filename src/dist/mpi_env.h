// mpi_env.h: the MPI environment of the process: init/finalize, rank, size, node-local rank,
// host name, rank-0 gathering of lines, collective agreement on errors, job-wide abort.
// MPI types stay inside src/dist; callers see plain C++.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mgrl::dist {

class Watchdog;

// For a collective that ranks may reach far apart for a known reason (rank 0 writing a checkpoint, a slow reward
// on some rank): the wait may last runtime.comm_timeout_s + max(extra_s, runtime.comm_timeout_s), the timeout's
// line naming `why`. An empty `why`: the plain timeout.
struct Patience {
  double extra_s = 0;
  std::string why;  // "rank 0's write of <path> (<size>)"
};

class MpiEnv {
 public:
  MpiEnv(int* argc, char*** argv);  // MPI_Init_thread once per process
  ~MpiEnv();                        // MPI_Finalize
  MpiEnv(const MpiEnv&) = delete;
  MpiEnv& operator=(const MpiEnv&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // rank among the ranks of this node
  int local_size() const { return local_size_; }
  int num_nodes() const { return num_nodes_; }
  const std::string& host() const { return host_; }
  std::string library_version() const;  // MPI_Get_library_version, first line
  std::string standard_version() const;  // "3.1"

  using Patience = dist::Patience;

  void barrier(const Patience& patience = Patience()) const;
  int allreduce_max(int v, const Patience& patience = Patience()) const;
  int allreduce_min(int v) const;
  double allreduce_max(double v) const;
  long long allreduce_sum(long long v) const;
  double allreduce_sum(double v) const;
  // Every rank's string, in rank order, on rank 0 (empty vector elsewhere).
  std::vector<std::string> gather_to_root(const std::string& s, const Patience& patience = Patience()) const;
  // Rank `root`'s string on every rank.
  std::string broadcast(const std::string& s, int root) const;

  // Runs fn on every rank and agrees on the outcome: if any rank threw, every rank throws
  // JobFailed with the same exit code, after rank 0 printed the lowest failing rank's message.
  // fn must not itself enter collectives that other ranks could skip.
  void agree(const std::function<void()>& fn) const { agree(fn, Patience()); }
  // The same, where fn may take some ranks much longer than the others (rank 0 writing a checkpoint while the
  // others wait for the outcome; see Patience).
  void agree(const std::function<void()>& fn, const Patience& patience) const;

  // The communicator's watchdog also watches this object's collectives (the agreements of the training loops: a
  // rank that stops or dies between two gradient allreduces leaves the others waiting in one of these). Set by
  // the Comm for its lifetime; nullptr: unwatched (set-up, before the configuration gives a timeout).
  void attach_watchdog(Watchdog* w) const { watchdog_ = w; }

 private:
  // A guard over one collective; "env.allreduce_max #3 (i32 x 1)" in the watchdog's message.
  struct Watched;
  Watched watch(const char* op, std::size_t count, const char* type, const Patience& patience = Patience()) const;

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, num_nodes_ = 1;
  std::string host_;
  mutable Watchdog* watchdog_ = nullptr;
  mutable std::uint64_t seq_ = 0;
};

// Thrown by MpiEnv::agree on every rank when some rank failed; the message is already printed.
struct JobFailed {
  int exit_code;
};

// Runs the body of a program and applies the error policy; returns the exit code:
//  - JobFailed (an error every rank agreed on, already printed): its code, on every rank;
//  - UserError / other exceptions on some ranks only: the rank prints one line and the whole job
//    ends (MPI_Abort) with code 2 / 1, so that no other rank is left waiting.
int run_guarded(const MpiEnv& env, const std::function<int()>& body);

// Ends every rank of the job now (MPI_Abort when MPI is up, _exit otherwise).
[[noreturn]] void abort_job(int exit_code);

}  // namespace mgrl::dist
