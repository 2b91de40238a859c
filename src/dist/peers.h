// peers.h: the other ranks of the job, as the watchdog sees them (private to src/dist). Ranks of this host through
// /proc (a rank that has ended, or is stopped) and a flag each in memory shared by the host's ranks, raised by a rank
// that has printed its error line and is ending the job, so that the others stay silent instead of adding lines of
// their own about its disappearance. Ranks this host cannot see (other hosts) through a TCP probe: every rank listens
// on a port of its own and answers a connection with one line (its rank, pid and the operation it waits in); a port
// that refuses means the process is gone, no connection within the probe's time means its host or network is lost.
// Every rank's host name, address and port are exchanged at start-up.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace mgrl::dist::peers {

enum class State { Running, Stopped, Ended };

struct Peer {
  int rank = 0;
  long pid = 0;
  State state = State::Running;
};

// Collective over world (MpiEnv's constructor): learns this host's ranks (their pids, checked against the start
// time the rank itself read from /proc so that a pid in another pid namespace, or reused, is never taken for it)
// and allocates the flags; opens this rank's probe port (a thread answers it) and exchanges every rank's host name,
// addresses and port. Without /proc, shared memory or sockets, the part concerned sees nothing and answers
// "nothing".
void init(MPI_Comm world, MPI_Comm local, const std::string& host);
// Collective (MpiEnv's destructor, before MPI_Finalize).
void finalize();
// Closes this rank's probe port (after MPI_Finalize, which no rank passes alone: a port that refuses then never
// means that a rank ended early).
void close_probe();

int self_rank();
// The other ranks of this host, each with its state now (reads /proc/<pid>/stat).
std::vector<Peer> look();
// This rank is ending the job and has printed (or is about to print) its one line.
void mark_speaking();
// Some rank of this host (this one included) has called mark_speaking().
bool someone_spoke();
// The generation step counts of the other ranks of this host (dist/progress.h), read from shared memory.
struct Progress {
  int rank = 0;
  unsigned long long count = 0;
};
std::vector<Progress> local_progress();
// "rank 1 (pid 4242)".
std::string name(const Peer& p);

// ---- ranks this host does not see through /proc (other hosts) ----
enum class Reach {
  Answers,      // its process answered: it runs (and says what it does)
  Silent,       // its port accepted the connection but no answer came: the process is stopped or hung
  Refused,      // its port refuses connections: the process has ended (its host still runs)
  Unreachable,  // no connection within the probe's time, or no route: its host is down or its network is cut
};
struct Remote {
  int rank = 0;
  long pid = 0;
  std::string host;     // its host name as it gave it at start-up
  std::string address;  // "10.0.0.2:41234", where it was probed
  Reach reach = Reach::Answers;
  std::string doing;    // for Answers: the operation it waits in ("" when it computes)
  unsigned long long progress = 0;  // for Answers: its generation step count (dist/progress.h)
};
// Host name of a rank (from the start-up exchange; "?" when unknown).
std::string host_of(int rank);
// Number of ranks that probe() looks at.
int remote_count();
// Probes every rank this host's /proc does not see, all at once, for at most wait_s seconds.
std::vector<Remote> probe(double wait_s);
// What this rank's probe port answers: the operation it waits in ("" when it computes).
void set_doing(const std::string& what);
// "rank 2 on host n2".
std::string name(const Remote& r);

}  // namespace mgrl::dist::peers
