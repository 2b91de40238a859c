// watchdog.cpp: polling thread behind Watchdog; a timeout prints one line and aborts the job.
#include "dist/watchdog.h"

#include <cstdio>
#include <sstream>

#include "core/log.h"
#include "dist/mpi_env.h"

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

void Watchdog::fire(const std::string& message) {
  if (on_timeout_) on_timeout_();
  log::error(message);
  abort_job(1);
}

void Watchdog::loop() {
  using namespace std::chrono;
  const auto limit = duration<double>(timeout_s_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, milliseconds(50));
    if (stop_) break;
    const auto now = steady_clock::now();
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
        msg << it->what << " did not complete within " << timeout_s_
            << " s (runtime.comm_timeout_s): another rank has probably failed, been killed or is waiting "
               "in a different collective; ending the job";
        fire(msg.str());
      }
      ++it;
    }
  }
}

}  // namespace mgrl::dist
