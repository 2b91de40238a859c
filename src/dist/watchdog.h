// watchdog.h: a thread that ends the job when a communication call does not complete in time, or when another rank
// has ended (killed, crashed, its node lost) while this one still runs. Blocking calls are watched by a Guard;
// asynchronous ones (NCCL on a stream) by a poll function. One line names the operation and the rank that ended, is
// stopped or cannot be reached, with its host: ranks of this host through /proc, the others by a TCP probe
// (dist/peers.h) once a call has waited a while. A lost rank ends the job with exit code kExitRankLost (4).
// The timeout counts from the later of the call's start and the last progress of another rank (dist/progress.h):
// while some rank still generates, the others wait for it.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mgrl::dist {

// A rank of another host as the last probe found it (dist/peers.h's Remote, kept by the watchdog).
struct RemoteSeen {
  int rank;
  std::string host, address, doing;
  int reach;  // peers::Reach
};

class Watchdog {
 public:
  // timeout_s <= 0: no time limit (asynchronous failures are still reported). on_timeout runs
  // before the job is aborted.
  Watchdog(double timeout_s, std::function<void()> on_timeout = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  class Guard {
   public:
    Guard(Watchdog* w, std::uint64_t id) : w_(w), id_(id) {}
    Guard(Guard&& o) noexcept : w_(o.w_), id_(o.id_) { o.w_ = nullptr; }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    ~Guard();

   private:
    Watchdog* w_;
    std::uint64_t id_;
  };

  // Watches a blocking call for the lifetime of the returned guard. With a reason `why` (named in the timeout's
  // line: a wait for one rank's file write), the call may take max(extra_s, the timeout) longer than the timeout.
  Guard watch(std::string what, double extra_s = 0, std::string why = {});
  // Watches an asynchronous operation until done() returns true (polled from the watchdog thread).
  // done() may throw to report an asynchronous failure; it is then treated as fatal.
  // release() runs on the watchdog thread once done() returned true (e.g. to free an event).
  void watch_async(std::string what, std::function<bool()> done, std::function<void()> release = {});
  // Outstanding asynchronous operations.
  std::size_t pending() const;
  double timeout_s() const { return timeout_s_; }

 private:
  struct Entry {
    std::uint64_t id;
    std::string what;
    std::chrono::steady_clock::time_point start;
    std::function<bool()> done;  // empty for a guard
    std::function<void()> release;
    double extra_s = 0;  // beyond timeout_s_, for `why`
    std::string why;
  };
  void loop();
  void unwatch(std::uint64_t id);
  // Called with mu_ held. Ends the job with message, unless another rank of this host has already printed its line
  // (then this one waits silently to be ended with the job) or should speak first (the lowest rank that still
  // runs; this one speaks after a grace period if that rank does not end the job). Returns only to wait.
  void fire_or_wait(const std::string& message, std::chrono::steady_clock::time_point now, int exit_code);
  [[noreturn]] void fire(const std::string& message, int exit_code);
  // Probes the ranks of other hosts when a call has waited long enough; ends the job when one has ended.
  void probe_remote(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point now);
  // What the last probe found wrong, for the timeout's message ("" when nothing, or when it was made before
  // `since`, the start of the call that timed out); sets *lost when a rank is lost.
  std::string remote_story(bool* lost, std::chrono::steady_clock::time_point since) const;
  // The operation this rank waits in, for messages ("" when none).
  std::string waiting_in() const;
  // Another rank's generation step count as read at `now` (dist/progress.h); first_is_baseline: this reading is
  // not compared with the one before (the first probe of a wait).
  void saw_progress(int rank, unsigned long long count, std::chrono::steady_clock::time_point now,
                    bool first_is_baseline);
  // The rank whose progress was seen last and when (rank -1: none seen to move).
  struct LastProgress {
    int rank = -1;
    std::chrono::steady_clock::time_point at{};
  };
  LastProgress last_progress() const;

  double timeout_s_;
  std::function<void()> on_timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Entry> entries_;
  std::uint64_t next_id_ = 1;
  bool stop_ = false;
  std::chrono::steady_clock::time_point deferred_since_{};  // when fire_or_wait first let a lower rank speak
  std::chrono::steady_clock::time_point last_probe_{};
  std::vector<RemoteSeen> remote_;  // the last probe's findings
  struct ProgressSeen {
    unsigned long long count = 0;
    std::chrono::steady_clock::time_point changed{};  // {}: not seen to move yet
  };
  std::map<int, ProgressSeen> progress_;  // by rank
  bool said_waiting_on_progress_ = false;
  double probe_wait_s_ = 0;         // how long it waited for answers
  std::thread thread_;
};

}  // namespace mgrl::dist
