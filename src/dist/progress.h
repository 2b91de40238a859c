// progress.h: a rank says that its generation has made a step (prefill or decode), work of its own that the other
// ranks may be waiting for. The watchdog of a rank that waits in a collective reads the other ranks' step counts
// (this host's through shared memory, other hosts' through the probe of dist/peers.h) and does not end the job while
// one of them still moves: runtime.comm_timeout_s counts from the last step of any rank, so that one rank generating
// far longer than the others (long completions, a slower GPU) is waited for, while a rank that is stopped, hung or
// waiting in another collective still ends the job one timeout after the last step.
#pragma once

namespace mgrl::dist {

// One step of this rank's generation. Cheap (one relaxed atomic add): once per step of the generation loop. Before
// MpiEnv exists (unit tests), it only counts.
void note_generation_step();

}  // namespace mgrl::dist
