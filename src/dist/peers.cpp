// peers.cpp: this host's ranks through /proc/<pid>/stat, and the shared "speaking" flags (one MPI shared window).
#include "dist/peers.h"

#include <unistd.h>

#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace mgrl::dist::peers {
namespace {

struct Known {
  int rank;
  long pid;
  long long start_time;
};

int g_self = 0;
std::vector<Known> g_known;           // the other ranks of this host whose identity checked out
MPI_Win g_win = MPI_WIN_NULL;
std::vector<int*> g_flags;            // every local rank's flag (this one's included)
int* g_own_flag = nullptr;

// State letter and start time (clock ticks since boot) of a process, from /proc/<pid>/stat. The command name (field
// 2) may hold spaces and parentheses: the fields after it follow the last ')'.
bool read_stat(long pid, char* state, long long* start_time) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!f || !std::getline(f, text)) return false;
  const auto close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  // Fields 3 (state) .. 22 (starttime).
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3) *state = field.empty() ? '?' : field[0];
    if (i == 22) {
      *start_time = std::atoll(field.c_str());
      return true;
    }
  }
  return false;
}

}  // namespace

void init(MPI_Comm world, MPI_Comm local) {
  MPI_Comm_rank(world, &g_self);
  int local_size = 1;
  MPI_Comm_size(local, &local_size);
  // Every local rank's (world rank, pid, start time as it reads it itself).
  char state = '?';
  long long start = -1;
  if (!read_stat(static_cast<long>(::getpid()), &state, &start)) start = -1;
  long long mine[3] = {g_self, static_cast<long long>(::getpid()), start};
  std::vector<long long> all(static_cast<std::size_t>(3 * local_size));
  if (MPI_Allgather(mine, 3, MPI_LONG_LONG, all.data(), 3, MPI_LONG_LONG, local) != MPI_SUCCESS) return;
  for (int i = 0; i < local_size; ++i) {
    const Known k{static_cast<int>(all[3 * i]), static_cast<long>(all[3 * i + 1]), all[3 * i + 2]};
    if (k.rank == g_self) continue;
    long long seen = -2;
    // Seen under the same pid with the same start time: the same process, in this pid namespace.
    if (k.start_time >= 0 && read_stat(k.pid, &state, &seen) && seen == k.start_time) g_known.push_back(k);
  }
  // One int per local rank in shared memory; without it the flags are simply not consulted.
  int* base = nullptr;
  if (MPI_Win_allocate_shared(sizeof(int), sizeof(int), MPI_INFO_NULL, local, &base, &g_win) != MPI_SUCCESS) {
    g_win = MPI_WIN_NULL;
    return;
  }
  g_own_flag = base;
  __atomic_store_n(g_own_flag, 0, __ATOMIC_SEQ_CST);
  for (int r = 0; r < local_size; ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    int* p = nullptr;
    if (MPI_Win_shared_query(g_win, r, &size, &unit, &p) == MPI_SUCCESS && p != nullptr) g_flags.push_back(p);
  }
  MPI_Barrier(local);  // every flag is 0 before anyone may raise one
}

void finalize() {
  g_flags.clear();
  g_own_flag = nullptr;
  if (g_win != MPI_WIN_NULL) MPI_Win_free(&g_win);
  g_known.clear();
}

int self_rank() { return g_self; }

std::vector<Peer> look() {
  std::vector<Peer> out;
  out.reserve(g_known.size());
  for (const auto& k : g_known) {
    Peer p{k.rank, k.pid, State::Running};
    char state = '?';
    long long start = -1;
    // Gone, a zombie not yet reaped, or a new process under a reused pid: the rank has ended.
    if (!read_stat(k.pid, &state, &start) || start != k.start_time || state == 'Z' || state == 'X')
      p.state = State::Ended;
    else if (state == 'T' || state == 't')
      p.state = State::Stopped;
    out.push_back(p);
  }
  return out;
}

void mark_speaking() {
  if (g_own_flag) __atomic_store_n(g_own_flag, 1, __ATOMIC_SEQ_CST);
}

bool someone_spoke() {
  for (int* f : g_flags)
    if (__atomic_load_n(f, __ATOMIC_SEQ_CST) != 0) return true;
  return false;
}

std::string name(const Peer& p) { return "rank " + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) + ")"; }

}  // namespace mgrl::dist::peers
