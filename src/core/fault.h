// fault.h: fault injection for the reliability tests (tests/cli/faults.sh, docs/reliability.md). The environment
// variable MGRL_FAULT_INJECT=<point>@<step> makes the code at <point> fail at training step <step>, on rank 0 only
// where rank 0 alone runs that code (checkpoint writes). Points: checkpoint_write (throws a FatalError after the
// tensors are written, before the file is committed). Read once; unset, it costs a comparison.
#pragma once
#include <cstdint>

namespace mgrl::fault {

// True when MGRL_FAULT_INJECT names this point and step.
bool injected(const char* point, std::int64_t step);

}  // namespace mgrl::fault
