// peers.h: the other ranks of the job on this host, as the watchdog sees them (private to src/dist): through /proc
// (a rank that has ended, or is stopped) and a flag each in memory shared by the host's ranks, raised by a rank that
// has printed its error line and is ending the job, so that the others stay silent instead of adding lines of their
// own about its disappearance. Ranks on other hosts are not seen (mpirun's own messages and the watchdog's timeout
// cover them).
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
// and allocates the flags. Without /proc or shared memory, nothing is seen and every query answers "nothing".
void init(MPI_Comm world, MPI_Comm local);
// Collective (MpiEnv's destructor, before MPI_Finalize).
void finalize();

int self_rank();
// The other ranks of this host, each with its state now (reads /proc/<pid>/stat).
std::vector<Peer> look();
// This rank is ending the job and has printed (or is about to print) its one line.
void mark_speaking();
// Some rank of this host (this one included) has called mark_speaking().
bool someone_spoke();
// "rank 1 (pid 4242)".
std::string name(const Peer& p);

}  // namespace mgrl::dist::peers
