// stop.h: graceful stop on a signal. SIGUSR1 or SIGUSR2 (SLURM's warning before the time limit, `sbatch
// --signal=USR1@300`; either may be chosen), SIGTERM (preemption, scancel, mpirun forwarding), SIGINT (Ctrl-C) and
// SIGHUP (the terminal or ssh session of an interactive run gone) only raise a flag; the training loops read it at the
// end of each optimizer step (the ranks agree on it), write a checkpoint and the process exits with kExitStopped.
// A second SIGINT, SIGTERM or SIGHUP ends the process at once, as if no handler were installed. Before a training loop has
// armed the handlers (set-up: loading, checks, or a job that mpirun aborts because another rank failed) there is
// nothing to checkpoint yet and a rank must not linger: SIGUSR1/SIGUSR2 end the process at once with kExitStopped
// (work left: the job scripts requeue) and rank 0 says so in one line; the others take their default action, silently.
#pragma once

namespace mgrl::stop {

// Installs the handlers (idempotent). A SIGINT or SIGHUP ignored on entry (a background job of a non-interactive
// shell, nohup) stays ignored.
// speak: this process writes the line for a signal during set-up (rank 0).
void install_handlers(bool speak);
// Called by a training loop as it starts: from now on a signal stops after the step.
void arm();
// The number of the first stop signal this process received, 0 if none. Async-signal-safe to read.
int pending_signal();
// Its name ("SIGUSR1"), or "" when none.
const char* pending_signal_name();
// Raises the flag as a signal would (tests, and code that wants to stop the loop itself).
void request(int signo);
// The training loop stopped early on the ranks' agreement (so the work is not finished): the process should
// exit with kExitStopped.
void mark_stopped_early();
bool stopped_early();

}  // namespace mgrl::stop
