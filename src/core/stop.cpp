// stop.cpp: the stop-signal handlers (async-signal-safe: they store into a sig_atomic_t and write(2) one line).
#include "core/stop.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <initializer_list>

#include "core/error.h"

namespace mgrl::stop {
namespace {

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_armed = 0;
bool g_tty = false;  // stderr is a terminal: SIGINT is acknowledged at once
bool g_installed = false;
bool g_stopped_early = false;
bool g_speak = true;  // this process writes the set-up stop line (rank 0)

void say(const char* s) {
  const ssize_t r = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)r;
}

const char* name_of(int signo) {
  switch (signo) {
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case 0: return "";
    default: return "a signal";
  }
}

void on_stop_signal(int signo) {
  if (!g_armed) {
    // Set-up (loading, checks): nothing to checkpoint yet. SLURM's warning before the time limit (SIGUSR1/2, which no
    // launcher sends when it aborts a job) ends the run as stopped with work left, so that the job scripts requeue
    // it: until 2026-11-29 it killed the process (exit 138, no line) and the job ended as failed, not requeued. The
    // others keep their default action, silently: mpirun's or srun's SIGTERM to the ranks of a job they abort
    // because another rank failed must neither read as a stop nor add lines to that rank's error.
    if (signo == SIGUSR1 || signo == SIGUSR2) {
      if (g_speak) {
        say("mgrl: ");
        say(name_of(signo));
        say(" before the first training step: stopped with nothing new to save (exit 3: run it again to go on)\n");
      }
      ::_exit(kExitStopped);
    }
    ::signal(signo, SIG_DFL);
    ::raise(signo);
    return;
  }
  if (g_signal != 0 && signo != SIGUSR1 && signo != SIGUSR2) {
    // The second SIGINT / SIGTERM / SIGHUP: stop now, with the signal's default action.
    ::signal(signo, SIG_DFL);
    ::raise(signo);
    return;
  }
  if (g_signal == 0) {
    g_signal = signo;
    // The agreed stop is logged once by rank 0 after the step; at a terminal Ctrl-C is acknowledged at once.
    if (signo == SIGINT && g_tty)
      say("mgrl: SIGINT received: stopping after this step (checkpoint, then exit 3); again to stop now\n");
  }
}

}  // namespace

void install_handlers(bool speak) {
  if (g_installed) return;
  g_installed = true;
  g_speak = speak;
  g_tty = ::isatty(STDERR_FILENO) == 1;
  // A training run whose standard output was a pipe whose reader went away (`mgrl ... | tee log` and the ssh session
  // ended) was killed by SIGPIPE at its next line, with no message and its work since the last checkpoint lost
  // (until 2026-11-28). Ignored, the lines that cannot be written are lost and the run goes on (metrics.jsonl and
  // the checkpoints are files). Programs mgrl starts get the default back (rewards.cpp, sandbox.cpp).
  ::signal(SIGPIPE, SIG_IGN);
  // SIGHUP (the terminal of an interactive run, or an ssh session, gone) as SIGTERM: until 2026-11-28 it ended a
  // training run at once, its work since the last checkpoint lost. A SIGINT or SIGHUP ignored by whoever started mgrl
  // (a background job, nohup) stays ignored.
  for (int signo : {SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction old {};
    if ((signo == SIGINT || signo == SIGHUP) && ::sigaction(signo, nullptr, &old) == 0 && old.sa_handler == SIG_IGN)
      continue;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // blocking calls (MPI, file I/O) go on; the loop looks at the flag after the step
    ::sigaction(signo, &sa, nullptr);
  }
}

void arm() { g_armed = 1; }

int pending_signal() { return g_signal; }

const char* pending_signal_name() { return name_of(g_signal); }

void request(int signo) {
  if (g_signal == 0) g_signal = signo;
}

void mark_stopped_early() { g_stopped_early = true; }
bool stopped_early() { return g_stopped_early; }

}  // namespace mgrl::stop
