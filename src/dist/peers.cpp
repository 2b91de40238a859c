// peers.cpp: this host's ranks through /proc/<pid>/stat, the shared "speaking" flags (one MPI shared window), and
// the TCP probe of the ranks of other hosts (a listening port per rank, answered by a thread of its own).
#include "dist/peers.h"
#include "dist/progress.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace mgrl::dist::peers {
namespace {

struct Known {
  int rank;
  long pid;
  long long start_time;
};

// Each local rank's slot in memory shared by the host's ranks: its "speaking" flag and its generation step count.
struct Slot {
  std::int64_t speaking;
  std::uint64_t progress;
};

int g_self = 0;
std::vector<Known> g_known;           // the other ranks of this host whose identity checked out
MPI_Win g_win = MPI_WIN_NULL;
std::vector<Slot*> g_slots;           // every local rank's slot (this one's included)
std::vector<int> g_slot_rank;         // the world rank of each slot
Slot g_private{};                     // this rank's slot while no shared one exists
Slot* g_own = &g_private;
std::mutex g_own_mu;                  // the answering thread's reads of *g_own against finalize's switch

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


// ---- the probe: every rank's card, exchanged at start-up ----
constexpr int kMaxAddrs = 8;
struct Card {
  std::int32_t rank;
  std::int32_t port;  // 0: no probe port
  std::int64_t pid;
  std::int32_t n_addrs;
  std::uint32_t addrs[kMaxAddrs];  // IPv4, network order
  std::uint32_t masks[kMaxAddrs];
  char host[64];
};
std::vector<Card> g_cards;     // every rank's, in rank order
std::vector<int> g_remote;     // the ranks probe() looks at
int g_listen = -1;
int g_wake[2] = {-1, -1};      // written to end the answering thread
// Never destroyed: a process that ends without close_probe (std::exit on an error path) must not meet a joinable
// std::thread in static destruction (std::terminate).
std::thread* g_server = nullptr;
std::mutex g_doing_mu;
std::string g_doing;

std::string ipv4(std::uint32_t a) {
  char buf[INET_ADDRSTRLEN] = {0};
  in_addr in{};
  in.s_addr = a;
  inet_ntop(AF_INET, &in, buf, sizeof(buf));
  return buf;
}

// This host's IPv4 addresses (up, not loopback).
void own_addresses(Card* c) {
  c->n_addrs = 0;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return;
  for (ifaddrs* i = list; i && c->n_addrs < kMaxAddrs; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !i->ifa_netmask) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    c->addrs[c->n_addrs] = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    c->masks[c->n_addrs] = reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr;
    ++c->n_addrs;
  }
  freeifaddrs(list);
}

// A listening TCP port on every address; 0 when none can be had.
int open_listener() {
  g_listen = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (g_listen < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(g_listen, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(g_listen, 128) != 0 ||
      ::getsockname(g_listen, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(g_listen);
    g_listen = -1;
    return 0;
  }
  return ntohs(a.sin_port);
}

// The answering thread: one line per connection, "mgrl-peer <rank> <pid> <progress> <operation or ->".
void serve() {
  for (;;) {
    pollfd fds[2] = {{g_listen, POLLIN, 0}, {g_wake[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    for (;;) {
      const int c = ::accept4(g_listen, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) break;
      std::string doing;
      {
        std::lock_guard<std::mutex> lock(g_doing_mu);
        doing = g_doing;
      }
      unsigned long long progress = 0;
      {
        std::lock_guard<std::mutex> lock(g_own_mu);  // the shared window is not freed meanwhile
        progress = __atomic_load_n(&__atomic_load_n(&g_own, __ATOMIC_ACQUIRE)->progress, __ATOMIC_RELAXED);
      }
      const std::string line = "mgrl-peer " + std::to_string(g_self) + " " + std::to_string(::getpid()) + " " +
                               std::to_string(progress) + " " +
                               (doing.empty() ? std::string("-") : doing) + "\n";
      (void)::send(c, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(c);
    }
  }
}

// Where to probe rank r: loopback for a rank of this host; else its address in a subnet this host shares, else its
// first address that is not also one of this host's (a docker bridge has the same address on every host).
bool probe_address(const Card& me, const Card& r, sockaddr_in* out) {
  std::uint32_t pick = 0;
  if (std::strncmp(me.host, r.host, sizeof(me.host)) == 0) {
    pick = htonl(INADDR_LOOPBACK);
  } else {
    std::uint32_t first = 0;
    for (int i = 0; i < r.n_addrs && !pick; ++i) {
      bool mine = false, shared = false;
      for (int j = 0; j < me.n_addrs; ++j) {
        mine = mine || me.addrs[j] == r.addrs[i];
        shared = shared || (me.addrs[j] & me.masks[j]) == (r.addrs[i] & me.masks[j]);
      }
      if (mine) continue;
      if (shared) pick = r.addrs[i];
      else if (!first) first = r.addrs[i];
    }
    if (!pick) pick = first;
  }
  if (!pick || r.port == 0) return false;
  *out = sockaddr_in{};
  out->sin_family = AF_INET;
  out->sin_addr.s_addr = pick;
  out->sin_port = htons(static_cast<std::uint16_t>(r.port));
  return true;
}

}  // namespace

void init(MPI_Comm world, MPI_Comm local, const std::string& host) {
  MPI_Comm_rank(world, &g_self);
  int local_size = 1;
  MPI_Comm_size(local, &local_size);
  // Every local rank's (world rank, pid, start time as it reads it itself).
  char state = '?';
  long long start = -1;
  if (!read_stat(static_cast<long>(::getpid()), &state, &start)) start = -1;
  long long mine[3] = {g_self, static_cast<long long>(::getpid()), start};
  std::vector<long long> all(static_cast<std::size_t>(3 * local_size));
  const bool gathered = MPI_Allgather(mine, 3, MPI_LONG_LONG, all.data(), 3, MPI_LONG_LONG, local) == MPI_SUCCESS;
  for (int i = 0; gathered && i < local_size; ++i) {
    const Known k{static_cast<int>(all[3 * i]), static_cast<long>(all[3 * i + 1]), all[3 * i + 2]};
    if (k.rank == g_self) continue;
    long long seen = -2;
    // Seen under the same pid with the same start time: the same process, in this pid namespace.
    if (k.start_time >= 0 && read_stat(k.pid, &state, &seen) && seen == k.start_time) g_known.push_back(k);
  }
  // Every rank's card: host name, addresses and probe port (the ranks /proc does not show are probed through it).
  Card me{};
  me.rank = g_self;
  me.pid = static_cast<std::int64_t>(::getpid());
  std::snprintf(me.host, sizeof(me.host), "%s", host.c_str());
  own_addresses(&me);
  me.port = open_listener();
  int world_size = 1;
  MPI_Comm_size(world, &world_size);
  g_cards.assign(static_cast<std::size_t>(world_size), Card{});
  if (MPI_Allgather(&me, sizeof(Card), MPI_BYTE, g_cards.data(), sizeof(Card), MPI_BYTE, world) != MPI_SUCCESS)
    g_cards.clear();
  for (const auto& c : g_cards) {
    if (c.rank == g_self) continue;
    bool seen = false;
    for (const auto& k : g_known) seen = seen || k.rank == c.rank;
    if (!seen) g_remote.push_back(c.rank);
  }
  if (g_listen >= 0 && ::pipe2(g_wake, O_CLOEXEC) == 0) g_server = new std::thread(serve);
  // One slot per local rank in shared memory; without it the flags and counters are simply not consulted.
  Slot* base = nullptr;
  if (MPI_Win_allocate_shared(sizeof(Slot), sizeof(Slot), MPI_INFO_NULL, local, &base, &g_win) != MPI_SUCCESS) {
    g_win = MPI_WIN_NULL;
    return;
  }
  __atomic_store_n(&base->speaking, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&base->progress, __atomic_load_n(&g_private.progress, __ATOMIC_RELAXED), __ATOMIC_SEQ_CST);
  {
    std::lock_guard<std::mutex> lock(g_own_mu);
    __atomic_store_n(&g_own, base, __ATOMIC_RELEASE);
  }
  for (int r = 0; r < local_size; ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    Slot* p = nullptr;
    if (MPI_Win_shared_query(g_win, r, &size, &unit, &p) == MPI_SUCCESS && p != nullptr && gathered) {
      g_slots.push_back(p);
      g_slot_rank.push_back(static_cast<int>(all[3 * r]));
    }
  }
  MPI_Barrier(local);  // every flag is 0 before anyone may raise one
}

void close_probe() {
  if (g_server) {
    const char x = 1;
    (void)!::write(g_wake[1], &x, 1);
    g_server->join();
    delete g_server;
    g_server = nullptr;
  }
  for (int* fd : {&g_wake[0], &g_wake[1], &g_listen})
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
  g_remote.clear();
}

void finalize() {
  g_slots.clear();
  g_slot_rank.clear();
  {
    std::lock_guard<std::mutex> lock(g_own_mu);
    g_private.progress = __atomic_load_n(&g_own->progress, __ATOMIC_RELAXED);
    __atomic_store_n(&g_own, &g_private, __ATOMIC_RELEASE);
  }
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
  if (g_own != &g_private) __atomic_store_n(&g_own->speaking, 1, __ATOMIC_SEQ_CST);
}

bool someone_spoke() {
  for (Slot* s : g_slots)
    if (__atomic_load_n(&s->speaking, __ATOMIC_SEQ_CST) != 0) return true;
  return false;
}

std::vector<Progress> local_progress() {
  std::vector<Progress> out;
  for (std::size_t i = 0; i < g_slots.size(); ++i) {
    if (g_slot_rank[i] == g_self) continue;
    out.push_back({g_slot_rank[i], __atomic_load_n(&g_slots[i]->progress, __ATOMIC_RELAXED)});
  }
  return out;
}

std::string name(const Peer& p) { return "rank " + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) + ")"; }

std::string host_of(int rank) {
  if (rank < 0 || static_cast<std::size_t>(rank) >= g_cards.size()) return "?";
  return g_cards[static_cast<std::size_t>(rank)].host;
}

int remote_count() { return static_cast<int>(g_remote.size()); }

void set_doing(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_doing_mu);
  if (g_doing != what) g_doing = what;
}

std::string name(const Remote& r) { return "rank " + std::to_string(r.rank) + " on host " + r.host; }

}  // namespace mgrl::dist::peers

namespace mgrl::dist {

void note_generation_step() {
  __atomic_add_fetch(&__atomic_load_n(&peers::g_own, __ATOMIC_ACQUIRE)->progress, 1, __ATOMIC_RELAXED);
}

}  // namespace mgrl::dist

namespace mgrl::dist::peers {

std::vector<Remote> probe(double wait_s) {
  using clock = std::chrono::steady_clock;
  struct Try {
    Remote r;
    int fd = -1;
    bool connected = false;
    std::string got;
  };
  std::vector<Try> tries;
  if (g_cards.empty()) return {};
  const Card& me = g_cards[static_cast<std::size_t>(g_self)];
  for (int rank : g_remote) {
    const Card& c = g_cards[static_cast<std::size_t>(rank)];
    sockaddr_in a{};
    if (!probe_address(me, c, &a)) continue;
    Try t;
    t.r.rank = rank;
    t.r.pid = static_cast<long>(c.pid);
    t.r.host = c.host;
    t.r.address = ipv4(a.sin_addr.s_addr) + ":" + std::to_string(c.port);
    t.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (t.fd < 0) continue;
    if (::connect(t.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      t.connected = true;
    } else if (errno != EINPROGRESS) {
      t.r.reach = errno == ECONNREFUSED ? Reach::Refused : Reach::Unreachable;
      ::close(t.fd);
      t.fd = -1;
    }
    tries.push_back(std::move(t));
  }
  const auto deadline =
      clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(wait_s));
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Try*> who;
    for (auto& t : tries)
      if (t.fd >= 0) {
        fds.push_back({t.fd, static_cast<short>(t.connected ? POLLIN : POLLOUT), 0});
        who.push_back(&t);
      }
    if (fds.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      Try& t = *who[i];
      if (!fds[i].revents) continue;
      if (!t.connected) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(t.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) {
          t.connected = true;
          continue;
        }
        t.r.reach = err == ECONNREFUSED ? Reach::Refused : Reach::Unreachable;
        ::close(t.fd);
        t.fd = -1;
        continue;
      }
      char buf[512];
      const ssize_t n = ::recv(t.fd, buf, sizeof(buf), 0);
      if (n > 0) t.got.append(buf, static_cast<std::size_t>(n));
      if (n <= 0 || t.got.find('\n') != std::string::npos) {
        ::close(t.fd);
        t.fd = -1;
      }
    }
  }
  std::vector<Remote> out;
  for (auto& t : tries) {
    if (t.fd >= 0) {  // still connecting (no answer from its host) or connected without an answer
      t.r.reach = t.connected ? Reach::Silent : Reach::Unreachable;
      ::close(t.fd);
    } else if (t.connected) {
      // "mgrl-peer <rank> <pid> <progress> <operation>": the rank itself answered (another process on its port
      // would not).
      const auto nl = t.got.find('\n');
      std::istringstream line(t.got.substr(0, nl));
      std::string tag;
      long rank = -1, pid = -1;
      unsigned long long progress = 0;
      line >> tag >> rank >> pid >> progress;
      std::string doing;
      std::getline(line >> std::ws, doing);
      if (tag == "mgrl-peer" && line && rank == t.r.rank && pid == t.r.pid && nl != std::string::npos) {
        t.r.reach = Reach::Answers;
        t.r.doing = doing == "-" ? std::string() : doing;
        t.r.progress = progress;
      } else {
        t.r.reach = Reach::Silent;
      }
    }
    out.push_back(t.r);
  }
  return out;
}

}  // namespace mgrl::dist::peers
