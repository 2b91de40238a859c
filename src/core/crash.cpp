// crash.cpp: the fatal-signal report (crash.h). Only async-signal-safe calls in the handler, but backtrace(), which
// is called once at install so that its first call (it may load libgcc_s) is not made in the handler.
#include "core/crash.h"

#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace mgrl::crash {
namespace {

std::atomic<const char*> g_phase{"start-up"};
std::atomic<int> g_phase_exit{-1};
std::atomic<int> g_rank{-1};
char g_env_rank[16] = "?";
char g_host[64] = "?";
std::atomic<bool> g_installed{false};
std::atomic<int> g_reporting{0};
std::atomic<bool> g_exit_expected{false};

// A small buffer filled with async-signal-safe appends, written to stderr in one write.
struct Line {
  char buf[512];
  std::size_t n = 0;
  void add(const char* s) {
    while (*s && n < sizeof buf - 1) buf[n++] = *s++;
  }
  void num(unsigned long long v, int base) {
    char tmp[24];
    int k = 0;
    do {
      const int d = static_cast<int>(v % static_cast<unsigned>(base));
      tmp[k++] = static_cast<char>(d < 10 ? '0' + d : 'a' + d - 10);
      v /= static_cast<unsigned>(base);
    } while (v && k < 24);
    if (base == 16) add("0x");
    while (k > 0 && n < sizeof buf - 1) buf[n++] = tmp[--k];
  }
  void flush() {
    std::size_t off = 0;
    while (off < n) {
      const ssize_t w = ::write(STDERR_FILENO, buf + off, n - off);
      if (w <= 0) break;
      off += static_cast<std::size_t>(w);
    }
    n = 0;
  }
};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV (invalid memory access)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGILL: return "SIGILL (illegal instruction)";
    case SIGFPE: return "SIGFPE (arithmetic fault)";
    case SIGABRT: return "SIGABRT (abort)";
    default: return "a fatal signal";
  }
}

// "mgrl: rank R on host H (pid P): " into l.
void add_who(Line& l) {
  l.add("mgrl: rank ");
  const int rank = g_rank.load();
  if (rank >= 0) l.num(static_cast<unsigned long long>(rank), 10);
  else l.add(g_env_rank);
  l.add(" on host ");
  l.add(g_host);
  l.add(" (pid ");
  l.num(static_cast<unsigned long long>(::getpid()), 10);
  l.add("): ");
}

// Registered with glibc's on_exit (atexit with the status): the process is ending by exit() without
// exit_expected() first, that is without going through mgrl's own ends (the normal return, which passes MpiEnv's
// destructor, or abort_job): a library ended it without a word. One case seen: nvcc compiles host code that reaches a
// __device__-only function into a bare exit(1). The caller of exit() is still on the stack here, so its frames are
// printed.
void report_unexpected_exit(int status, void*) {
  if (g_exit_expected.load() || g_reporting.fetch_add(1) != 0) return;
  Line l;
  add_who(l);
  l.add("ended by a call to exit(");
  l.num(static_cast<unsigned long long>(static_cast<unsigned>(status) & 0xffu), 10);
  l.add(") during ");
  l.add(g_phase.load());
  l.add(", without an error message: a defect in mgrl or in a library it calls; the frames that called exit() follow "
        "(resolve one with: addr2line -Cfe MODULE OFFSET)\n");
  l.flush();
  void* frames[48];
  const int n = ::backtrace(frames, 48);
  for (int i = 1; i < n; ++i) {  // frames[0] is this function
    l.add("  #");
    l.num(static_cast<unsigned long long>(i - 1), 10);
    l.add(" ");
    l.flush();
    ::backtrace_symbols_fd(frames + i, 1, STDERR_FILENO);
  }
}

void handler(int sig, siginfo_t* info, void* uc_ptr) {
  // One report per process (a second fault inside the report goes straight to the default action).
  if (g_reporting.fetch_add(1) != 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  Line l;
  add_who(l);
  l.add(signal_name(sig));
  if (info && info->si_code <= 0) {  // sent (kill, raise, abort), not a fault: who sent it
    l.add(" sent by pid ");
    l.num(static_cast<unsigned long long>(info->si_pid), 10);
  } else if (info) {
    l.add(" at address ");
    l.num(reinterpret_cast<std::uintptr_t>(info->si_addr), 16);
  }
  l.add(" during ");
  l.add(g_phase.load());
  l.add("; its frames follow (resolve one with: addr2line -Cfe MODULE OFFSET)\n");
  l.flush();
  void* frames[48];
  int n = 0;
  bool null_call = false;
#if defined(__x86_64__)
  // A call through a null (or wild) function pointer: the instruction pointer is the bad address, from which the
  // unwinder cannot go on. The caller is the return address on top of the stack: for the unwind only, the saved
  // context is made to look as if the bad function had returned there (the unwinder reads it through the signal
  // frame), then put back, so that the return from this handler faults again and the default action applies.
  if (uc_ptr && info && sig == SIGSEGV) {
    auto* uc = static_cast<ucontext_t*>(uc_ptr);
    greg_t& ip = uc->uc_mcontext.gregs[REG_RIP];
    greg_t& sp = uc->uc_mcontext.gregs[REG_RSP];
    if (static_cast<std::uintptr_t>(ip) == reinterpret_cast<std::uintptr_t>(info->si_addr)) {
      const greg_t ip0 = ip, sp0 = sp;
      ip = static_cast<greg_t>(*reinterpret_cast<const std::uintptr_t*>(static_cast<std::uintptr_t>(sp)));
      sp += 8;
      n = ::backtrace(frames, 48);
      ip = ip0;
      sp = sp0;
      null_call = true;
    }
  }
#else
  (void)uc_ptr;
#endif
  if (!null_call) n = ::backtrace(frames, 48);
  // frames[0] is this handler, frames[1] the signal trampoline, frames[2] the faulting function (its caller after a
  // null call).
  for (int i = 2; i < n; ++i) {
    l.add("  #");
    l.num(static_cast<unsigned long long>(i - 2), 10);
    l.add(i == 2 && null_call ? " (the caller of the bad address) " : " ");
    l.flush();
    ::backtrace_symbols_fd(frames + i, 1, STDERR_FILENO);
  }
  const int code = g_phase_exit.load();
  if (code >= 0) {
    l.add("  (a crash in this phase ends the rank with exit code ");
    l.num(static_cast<unsigned long long>(code), 10);
    l.add(": a lost rank, which the batch scripts requeue)\n");
    l.flush();
    ::_exit(code);
  }
  // The signal again, pending until this handler returns (it is blocked here), then the default action: also when
  // it was sent (kill -SEGV), where no faulting instruction would run again.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void install() {
  if (g_installed.exchange(true)) return;
  const char* names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"};
  for (const char* name : names)
    if (const char* v = std::getenv(name)) {
      std::strncpy(g_env_rank, v, sizeof g_env_rank - 1);
      break;
    }
  (void)::gethostname(g_host, sizeof g_host - 1);
  void* warm[2];
  (void)::backtrace(warm, 2);  // loads the unwinder now, not in the handler
  static char alt[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  (void)::sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
    // A handler already there (a sanitizer's, a debugger's) is kept: it knows more than this one.
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler != SIG_DFL) continue;
    (void)::sigaction(sig, &sa, nullptr);
  }
  (void)::on_exit(report_unexpected_exit, nullptr);
}

void exit_expected() { g_exit_expected.store(true); }

void set_phase(const char* phase, int exit_code) {
  g_phase_exit.store(exit_code);
  g_phase.store(phase);
}
void set_rank(int rank) { g_rank.store(rank); }
const char* launcher_rank() { return g_env_rank; }
const char* host() { return g_host; }

}  // namespace mgrl::crash
