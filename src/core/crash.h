// crash.h: one line and the call frames when a rank dies of a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT):
// which rank, host and pid, the signal and faulting address, what the rank was doing, and the frames (module+offset,
// to resolve with `addr2line -Cfe mgrl OFFSET`), then the signal's default action, so that the exit status and SLURM's
// report stay those of the signal. Installed before MPI starts: Open MPI keeps a handler that is already there. The
// same line and frames when a rank ends by an exit() that none of mgrl's own ends made (a library's silent exit).
#pragma once

namespace mgrl::crash {

// Installs the handlers (once; an alternate signal stack, so that a stack overflow is reported too), for each signal
// whose disposition is still the default (a sanitizer's or a debugger's handler is kept); and a glibc on_exit handler
// that reports an exit() the process did not expect (a library ending it without a message) with the caller's frames.
void install();
// The process is ending on purpose (its normal return, or after its own error line): exit() is no longer reported.
void exit_expected();
// What this process is doing, for the line: a string literal (kept by pointer), e.g. "MPI start-up". With
// exit_code >= 0 a crash in this phase ends the process with that exit code after the report, instead of the
// signal's default action (a crash inside MPI's start-up is the launcher's or the MPI's, not the run's: the batch
// scripts requeue exit code 4 as a lost rank).
void set_phase(const char* phase, int exit_code = -1);
// This process's rank as the launcher gave it (OMPI_COMM_WORLD_RANK, PMIX_RANK or SLURM_PROCID, else "?") and its
// host name, read by install(): for lines written before MPI knows the rank.
const char* launcher_rank();
const char* host();
// The rank for the line, once MPI knows it (before: OMPI_COMM_WORLD_RANK, PMIX_RANK or SLURM_PROCID, else "?").
void set_rank(int rank);

}  // namespace mgrl::crash
