// fault.h: a testing hook. MGRL_FAULT_INJECT=<point>:rank=<R>:step=<N>[:count=<K>][:action=throw|kill|segv|
// sleep:secs=<S>] makes rank R fail at the named point of step N (of steps N to N+K-1: for action=sleep, each) (throw: a FatalError, as a failing library call would; kill: SIGKILL to
// itself, as the kernel's OOM killer or a node failure would; segv: a call through a null function pointer, as a
// crashing library would, which core/crash.h reports; sleep: the point takes S seconds and the run goes on, as a
// slow file system would), so that tests can show how a multi-rank job ends when one rank
// fails there (tests/faults/). Points: checkpoint_write (rank 0: in the middle of the file, after the tensors;
// other ranks: while rank 0 writes); output_write (rank=0:step=0: `mgrl generate` half way through its output
// file, `mgrl score` after its datasets, before the file is moved into place); generate_step (step = the steps of one
// generation call, prefill or decode, counted from 0 in each call; with action=sleep and a count, a rank whose
// generation is slow: dist/progress.h); training_setup (rank=R:step=0: a training mode's set-up, after the stop handlers
// are installed and before the model loads; with action=sleep, a long load that a stop signal interrupts). One point corrupts a value instead
// of failing: grad_overflow[:count=K] (rank R writes +inf into one gradient element before the allreduce of
// training steps N to N+K-1, K = 1 by default, as an fp16 overflow would; train/grad_sync.h), and
// grad_overflow_local[:count=K] the same after the allreduce, on rank R's copy only (as a fault of that rank's memory
// would: the ranks must still agree to skip). startup_stall:rank=R:step=0 stops rank R for good inside MPI's
// start-up (dist/mpi_env.cpp), as a rank that died or cannot connect there would leave the others: the start-up
// deadline must end the job. startup:rank=R:step=0[:action=...] fails rank R in the same place (action=segv:
// as the crash inside Open MPI's start-up; core/crash.h: its line, then exit code 4). Read once; unset, a point costs one branch on a static.
#pragma once
#include <cstdint>

namespace mgrl::fault {

// Fails as MGRL_FAULT_INJECT says when it names this point, this rank and this step; otherwise returns.
// A malformed MGRL_FAULT_INJECT is a UserError (a test that means to inject a fault must not pass without one).
void point(const char* name, int rank, std::int64_t step);
// The same for this process's rank (set_rank; 0 until MpiEnv sets it).
void point(const char* name, std::int64_t step);
void set_rank(int rank);
// For the points that corrupt a value (grad_overflow): whether MGRL_FAULT_INJECT names this point, this rank and a
// step of its range. Never throws for a well-formed MGRL_FAULT_INJECT (a malformed one is a UserError).
bool fires(const char* name, int rank, std::int64_t step);

}  // namespace mgrl::fault
