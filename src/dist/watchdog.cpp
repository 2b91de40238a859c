// watchdog.cpp: polling thread behind Watchdog; a timeout or a vanished rank of this host prints one line and
// aborts the job.
#include "dist/watchdog.h"

#include <cstdio>
#include <sstream>

#include "core/log.h"
#include "dist/mpi_env.h"
#include "dist/peers.h"

namespace mgrl::dist {

Watchdog::Watchdog(double timeout_s, std::function<void()> on_timeout)
    : timeout_s_(timeout_s), on_timeout_(std::move(on_timeout)) {
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& e : entries_)
    if (e.release) e.release();
}

Watchdog::Guard::~Guard() {
  if (w_) w_->unwatch(id_);
}

Watchdog::Guard Watchdog::watch(std::string what) {
  if (timeout_s_ <= 0) return Guard(nullptr, 0);
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t id = next_id_++;
  entries_.push_back({id, std::move(what), std::chrono::steady_clock::now(), {}, {}});
  return Guard(this, id);
}

void Watchdog::watch_async(std::string what, std::function<bool()> done, std::function<void()> release) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back({next_id_++, std::move(what), std::chrono::steady_clock::now(), std::move(done),
                      std::move(release)});
}

std::size_t Watchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const auto& e : entries_) n += e.done ? 1 : 0;
  return n;
}

void Watchdog::unwatch(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.remove_if([id](const Entry& e) { return e.id == id; });
}

std::string Watchdog::waiting_in() const {
  const Entry* oldest = nullptr;
  for (const auto& e : entries_)
    if (!oldest || e.start < oldest->start) oldest = &e;
  return oldest ? oldest->what : std::string();
}

void Watchdog::fire_or_wait(const std::string& message, std::chrono::steady_clock::time_point now) {
  using namespace std::chrono;
  // Mpirun ends every rank once one has aborted; lines from the others would only repeat the story, in a worse
  // order (a rank that lost its peer after that peer's own error line).
  if (deferred_since_ == steady_clock::time_point{}) deferred_since_ = now;
  if (peers::someone_spoke()) {
    if (now - deferred_since_ > seconds(30)) abort_job(1);  // the job was not ended after all: end it, silently
    return;
  }
  int lowest = peers::self_rank();
  for (const auto& p : peers::look())
    if (p.state == peers::State::Running && p.rank < lowest) lowest = p.rank;
  if (lowest != peers::self_rank()) {
    // A lower rank of this host sees the same and speaks for the job; this one speaks only if it does not.
    if (now - deferred_since_ < seconds(3)) return;
  }
  fire(message);
}

void Watchdog::fire(const std::string& message) {
  peers::mark_speaking();
  if (on_timeout_) on_timeout_();
  log::error(message);
  abort_job(1);
}
void Watchdog::loop() {
  using namespace std::chrono;
  const auto limit = duration<double>(timeout_s_);
  auto last_look = steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, milliseconds(50));
    if (stop_) break;
    const auto now = steady_clock::now();
    // A rank of this host that has ended while this one runs (before MPI_Finalize, which no rank passes alone):
    // killed or crashed, and the job cannot go on. Mpirun ends the job too, but says nothing of what the others
    // were doing, and a rank blocked in shared-memory communication would otherwise wait for it.
    if (now - last_look >= milliseconds(100)) {
      last_look = now;
      for (const auto& p : peers::look()) {
        if (p.state != peers::State::Ended) continue;
        const std::string in = waiting_in();
        fire_or_wait(peers::name(p) + " has ended (killed or crashed) " +
                         (in.empty() ? std::string("while this rank was computing")
                                     : "while this rank waited in " + in) +
                         "; ending the job",
                     now);
        break;
      }
    }
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->done) {
        bool finished = false;
        try {
          finished = it->done();
        } catch (const std::exception& e) {
          fire(std::string("communication failed during ") + it->what + ": " + e.what());
        }
        if (finished) {
          if (it->release) it->release();
          it = entries_.erase(it);
          continue;
        }
      }
      if (timeout_s_ > 0 && now - it->start > limit) {
        std::ostringstream msg;
        msg << it->what << " did not complete within " << timeout_s_ << " s (runtime.comm_timeout_s): ";
        std::string stopped;
        int n_stopped = 0;
        for (const auto& p : peers::look())
          if (p.state == peers::State::Stopped) stopped += (n_stopped++ ? ", " : "") + peers::name(p);
        if (n_stopped)
          msg << stopped << (n_stopped > 1 ? " are" : " is")
              << " stopped (SIGSTOP, a debugger or job control); ending the job";
        else
          msg << "another rank has probably failed, been killed or is waiting in a different collective; ending "
                 "the job";
        fire_or_wait(msg.str(), now);
        break;  // waiting for a lower rank to speak: look again at the next poll
      }
      ++it;
    }
  }
}

}  // namespace mgrl::dist
