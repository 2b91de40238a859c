// gatherer.h: what a sharded model needs from the ranks it is sharded over: an all-gather of one byte range per rank.
// The model knows nothing of ranks or communicators; src/train adapts dist::Comm to this interface.
#pragma once
#include <cstddef>

namespace mgrl::model {

class Gatherer {
 public:
  virtual ~Gatherer() = default;
  virtual int parts() const = 0;  // how many parts a sharded tensor has (the ranks)
  virtual int index() const = 0;  // which part this process holds
  // Collective: every part gives `bytes` from `part` (backend memory); `whole` (parts() * bytes, backend memory)
  // receives them in part order, ordered with the backend's queue. Every part must call it in the same order.
  virtual void all_gather(const void* part, void* whole, std::size_t bytes) = 0;
  // The same as a prefetch: it runs beside the work queued after it (on the GPU: on the communicator's stream,
  // after the work queued before it), until wait() orders the backend's queue after every prefetch. Blocking
  // backends gather at once.
  virtual void all_gather_async(const void* part, void* whole, std::size_t bytes) { all_gather(part, whole, bytes); }
  virtual void wait() {}
};

}  // namespace mgrl::model
