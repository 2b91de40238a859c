// progress.h: a rank says that it is making progress in work of its own that the other ranks may be waiting for
// (a decode step of its generation). The watchdog of a rank that waits in a collective reads the other ranks'
// progress (this host's through shared memory, other hosts' through the probe of dist/peers.h) and does not end the
// job while one of them still makes progress: runtime.comm_timeout_s counts from the last progress of any rank, so
// that one rank generating far longer than the others (long completions, a slower GPU) is waited for, while a rank
// that is stopped, hung or waiting in another collective still ends the job one timeout after the last progress.
#pragma once

namespace mgrl::dist {

enum class Activity : int {
  None = 0,
  Generating = 1,  // a step of generation (prefill or decode)
};

// "generating"; "" for None.
const char* activity_name(Activity a);

// One step of progress in `what`. Cheap (two relaxed atomic stores): call it once per step of a long loop. Before
// MpiEnv exists (unit tests), it only counts.
void note_progress(Activity what);

}  // namespace mgrl::dist
