// watchdog.cpp: polling thread behind Watchdog; a timeout, a vanished rank of this host or a rank of another host
// that has ended or cannot be reached prints one line and aborts the job.
#include "dist/watchdog.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "dist/mpi_env.h"
#include "dist/peers.h"
#include "dist/progress.h"

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

Watchdog::Guard Watchdog::watch(std::string what, double extra_s, std::string why) {
  if (timeout_s_ <= 0) return Guard(nullptr, 0);
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t id = next_id_++;
  // A call given a reason to wait longer gets at least one more timeout.
  const double extra = why.empty() ? 0.0 : std::max(extra_s, timeout_s_);
  entries_.push_back({id, std::move(what), std::chrono::steady_clock::now(), {}, {}, extra, std::move(why)});
  return Guard(this, id);
}

void Watchdog::watch_async(std::string what, std::function<bool()> done, std::function<void()> release) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back({next_id_++, std::move(what), std::chrono::steady_clock::now(), std::move(done),
                      std::move(release), 0.0, {}});
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

void Watchdog::fire_or_wait(const std::string& message, std::chrono::steady_clock::time_point now, int exit_code) {
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
  fire(message, exit_code);
}

void Watchdog::fire(const std::string& message, int exit_code) {
  peers::mark_speaking();
  if (on_timeout_) on_timeout_();
  log::error(message);
  abort_job(exit_code);
}

namespace {
// "rank 2, rank 3" from a list of ranks; past 8, "rank 8, ..., rank 15 and 12 more".
std::string rank_list(const std::vector<int>& ranks) {
  constexpr std::size_t kNamed = 8;
  std::string s;
  for (std::size_t i = 0; i < ranks.size() && i < kNamed; ++i)
    s += (i ? ", rank " : "rank ") + std::to_string(ranks[i]);
  if (ranks.size() > kNamed) s += " and " + std::to_string(ranks.size() - kNamed) + " more";
  return s;
}
// The ranks of the last probe in one state, grouped by host: {host -> (ranks, first address)}.
std::map<std::string, std::pair<std::vector<int>, std::string>> by_host(const std::vector<RemoteSeen>& seen,
                                                                        peers::Reach reach) {
  std::map<std::string, std::pair<std::vector<int>, std::string>> out;
  for (const auto& r : seen) {
    if (r.reach != static_cast<int>(reach)) continue;
    auto& e = out[r.host];
    if (e.first.empty()) e.second = r.address;
    e.first.push_back(r.rank);
  }
  return out;
}
}  // namespace

void Watchdog::probe_remote(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point now) {
  using namespace std::chrono;
  if (timeout_s_ <= 0 || peers::remote_count() == 0) return;
  const Entry* oldest = nullptr;
  for (const auto& e : entries_)
    if (!oldest || e.start < oldest->start) oldest = &e;
  if (!oldest) return;
  // A call that waits this long gets the other hosts' ranks probed, again every `every` while it waits; each probe
  // waits `wait` for answers. With the default timeout (600 s): after 10 s, 2 s, every 4 s.
  const double after = std::clamp(timeout_s_ / 5, 0.5, 10.0);
  const double wait = std::clamp(timeout_s_ / 10, 0.2, 2.0);
  const double every = std::max(1.0, 2 * wait);
  if (duration<double>(now - oldest->start).count() < after) return;
  if (last_probe_ != steady_clock::time_point{} && duration<double>(now - last_probe_).count() < every) return;
  // The first probe of this wait: another host's progress counters read now are a baseline (they may have moved
  // long before this wait began), moves are seen between this wait's probes.
  const bool first_of_wait = last_probe_ < oldest->start;
  lock.unlock();  // the main thread must not wait for the probe to watch or unwatch its calls
  const auto found = peers::probe(wait);
  lock.lock();
  last_probe_ = steady_clock::now();
  probe_wait_s_ = wait;
  remote_.clear();
  for (const auto& r : found) {
    remote_.push_back({r.rank, r.host, r.address, r.doing, static_cast<int>(r.reach)});
    if (r.reach == peers::Reach::Answers) saw_progress(r.rank, r.progress, last_probe_, first_of_wait);
  }
  const std::string in = waiting_in();
  if (in.empty()) return;  // the call has completed meanwhile
  // A rank whose port refuses connections has ended: no reason to wait for the timeout.
  const auto ended = by_host(remote_, peers::Reach::Refused);
  if (ended.empty()) return;
  const auto& [host, what] = *ended.begin();
  const auto& [ranks, address] = what;
  fire_or_wait(rank_list(ranks) + " on host " + host + (ranks.size() > 1 ? " have" : " has") +
                   " ended (killed, crashed or its node lost: " + address + " refuses connections) while this rank "
                   "waited in " + in + "; ending the job",
               last_probe_, kExitRankLost);
}

void Watchdog::saw_progress(int rank, unsigned long long count, std::chrono::steady_clock::time_point now,
                            bool first_is_baseline) {
  ProgressSeen& p = progress_[rank];
  // This host's counters are read from the start, every poll: they start at 0, and a first reading above it has
  // moved since. Another host's are read only by the probes of a long wait: its first probe's are a baseline.
  if (count != p.count && !first_is_baseline) p.changed = now;
  p.count = count;
}

Watchdog::LastProgress Watchdog::last_progress() const {
  LastProgress out;
  for (const auto& [rank, p] : progress_)
    if (p.changed != std::chrono::steady_clock::time_point{} && (out.rank < 0 || p.changed > out.at))
      out = {rank, p.changed};
  return out;
}

std::string Watchdog::remote_story(bool* lost, std::chrono::steady_clock::time_point since) const {
  *lost = false;
  std::string story;
  if (last_probe_ < since) return story;  // no probe during this wait: what an earlier one found may be over
  const auto add = [&story](const std::string& s) { story += (story.empty() ? "" : "; ") + s; };
  for (const auto& [host, what] : by_host(remote_, peers::Reach::Refused)) {
    add(rank_list(what.first) + " on host " + host + (what.first.size() > 1 ? " have" : " has") +
        " ended (killed, crashed or its node lost: " + what.second + " refuses connections)");
    *lost = true;
  }
  for (const auto& [host, what] : by_host(remote_, peers::Reach::Unreachable)) {
    std::ostringstream s;
    s << rank_list(what.first) << " on host " << host << " cannot be reached (no connection to " << what.second
      << " within " << probe_wait_s_ << " s: the node is down or its network is cut)";
    add(s.str());
    *lost = true;
  }
  for (const auto& [host, what] : by_host(remote_, peers::Reach::Silent))
    add(rank_list(what.first) + " on host " + host + (what.first.size() > 1 ? " do" : " does") +
        " not answer (the process is stopped or hung)");
  return story;
}
void Watchdog::loop() {
  using namespace std::chrono;
  const auto limit = duration<double>(timeout_s_);
  auto last_look = steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, milliseconds(50));
    if (stop_) break;
    peers::set_doing(waiting_in());  // what this rank's probe port answers
    probe_remote(lock, steady_clock::now());
    if (stop_) break;
    const auto now = steady_clock::now();
    // A rank of this host that has ended while this one runs (before MPI_Finalize, which no rank passes alone):
    // killed or crashed, and the job cannot go on. Mpirun ends the job too, but says nothing of what the others
    // were doing, and a rank blocked in shared-memory communication would otherwise wait for it.
    for (const auto& p : peers::local_progress()) saw_progress(p.rank, p.count, now, false);
    if (now - last_look >= milliseconds(100)) {
      last_look = now;
      for (const auto& p : peers::look()) {
        if (p.state != peers::State::Ended) continue;
        const std::string in = waiting_in();
        fire_or_wait(peers::name(p) + " has ended (killed or crashed) " +
                         (in.empty() ? std::string("while this rank was computing")
                                     : "while this rank waited in " + in) +
                         "; ending the job",
                     now, kExitRankLost);
        break;
      }
    }
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->done) {
        bool finished = false;
        try {
          finished = it->done();
        } catch (const std::exception& e) {
          fire(std::string("communication failed during ") + it->what + ": " + e.what(), kExitFatal);
        }
        if (finished) {
          if (it->release) it->release();
          it = entries_.erase(it);
          continue;
        }
      }
      if (timeout_s_ > 0 && now - it->start > limit + duration<double>(it->extra_s)) {
        // Another rank still makes progress in work of its own (its generation): it will come; wait on. The
        // timeout counts from its last progress.
        const LastProgress lp = last_progress();
        // Moved during this wait (not just seen moving by the first polls after it began: 50 ms apart).
        const bool moved = lp.rank >= 0 && lp.at > it->start + milliseconds(250);
        const std::string who = "rank " + std::to_string(lp.rank) + ", generating";  // the only progress counted
        if (moved && now - lp.at < limit) {
          if (!said_waiting_on_progress_) {
            said_waiting_on_progress_ = true;
            std::ostringstream s;
            s << "rank " << peers::self_rank() << " has waited in " << it->what << " for "
              << std::llround(duration<double>(now - it->start).count()) << " s, past runtime.comm_timeout_s ("
              << timeout_s_ << " s), while " << who
              << ", still makes progress: waiting on (the timeout counts from the last progress of a rank; said once)";
            log::warn(s.str());
          }
          ++it;
          continue;
        }
        std::ostringstream msg;
        msg << it->what << " did not complete within " << timeout_s_ + it->extra_s << " s (runtime.comm_timeout_s";
        if (it->extra_s > 0) msg << " + " << it->extra_s << " s for " << it->why;
        msg << "): ";
        // Progress seen shortly before or during this wait, and none since: say whose was last (it may itself be
        // waiting here now: the rank that does not come is not known).
        const bool stalled = lp.rank >= 0 && lp.at + limit > it->start;
        std::ostringstream stall;
        if (stalled)
          stall << "no rank has made progress for " << std::llround(duration<double>(now - lp.at).count())
                << " s (the last seen: " << who << "); a rank has probably hung, failed or is waiting in a "
                << "different collective";
        std::string stopped;
        int n_stopped = 0;
        for (const auto& p : peers::look())
          if (p.state == peers::State::Stopped) stopped += (n_stopped++ ? ", " : "") + peers::name(p);
        bool lost = false;
        const std::string remote = remote_story(&lost, it->start);
        if (n_stopped)
          msg << stopped << (n_stopped > 1 ? " are" : " is")
              << " stopped (SIGSTOP, a debugger or job control); ending the job";
        else if (!remote.empty())
          msg << remote << "; ending the job";
        else if (stalled)
          msg << stall.str() << "; ending the job";
        else if (!it->why.empty())
          msg << "it has not ended (a file system or reward program that hangs?), or another rank has failed; "
                 "ending the job";
        else
          msg << "another rank has probably failed, been killed or is waiting in a different collective; ending "
                 "the job";
        fire_or_wait(msg.str(), now, lost && !n_stopped ? kExitRankLost : kExitFatal);
        break;  // waiting for a lower rank to speak: look again at the next poll
      }
      ++it;
    }
  }
}

}  // namespace mgrl::dist
