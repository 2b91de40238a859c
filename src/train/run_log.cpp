// run_log.cpp: step lines, progress line, metrics.jsonl and TensorBoard events of a training run.
#include "train/run_log.h"

#include "model/model_def.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"

namespace mgrl::train {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string phase_table(const kernels::PhaseSeconds& s, std::int64_t steps, double step_seconds,
                        const std::vector<std::pair<std::string, double>>& host) {
  using kernels::Phase;
  const double n = static_cast<double>(std::max<std::int64_t>(1, steps));
  const double step = step_seconds / n;
  auto at = [&](Phase p) { return s[static_cast<int>(p)] / n; };
  std::string out;
  char line[160];
  std::snprintf(line, sizeof(line), "phase table: mean over %lld steps, step %.3f ms\n", static_cast<long long>(steps),
                1e3 * step);
  out += line;
  out += "  phase                ms/step    share\n";
  auto row = [&](const char* name, double v) {
    std::snprintf(line, sizeof(line), "  %-19s %9.3f  %6.1f%%\n", name, 1e3 * v, step > 0 ? 100.0 * v / step : 0.0);
    out += line;
  };
  double covered = 0;
  for (const auto& [name, v] : host) {
    row(name.c_str(), v / n);
    covered += v / n;
  }
  for (const Phase p : {Phase::Forward, Phase::Backward}) {
    row(kernels::phase_name(p), at(p));
    covered += at(p);
  }
  row("  of which attention", at(Phase::Attention));
  row("  of which lora", at(Phase::Lora));
  for (const Phase p : {Phase::Optimizer, Phase::Communication, Phase::HostWait}) {
    row(kernels::phase_name(p), at(p));
    covered += at(p);
  }
  row("other", std::max(0.0, step - covered));
  return out;
}

nlohmann::json phase_record(const dist::MpiEnv& env, const kernels::PhaseSeconds& s, std::int64_t steps,
                            double step_seconds, double tokens, const std::vector<std::pair<std::string, double>>& host) {
  nlohmann::json own = nlohmann::json::object();
  for (const auto& [name, v] : host) own[name] = v;
  for (int p = 0; p < kernels::kNumPhases; ++p) own[kernels::phase_name(static_cast<kernels::Phase>(p))] = s[p];
  nlohmann::json ranks = nlohmann::json::array();
  nlohmann::json mine = own;
  mine["step_seconds"] = step_seconds;
  for (const auto& r : env.gather_to_root(mine.dump())) ranks.push_back(nlohmann::json::parse(r));
  return {{"steps", steps}, {"step_seconds", step_seconds}, {"tokens", tokens}, {"seconds", own}, {"ranks", ranks}};
}

std::string human_time(double s) {
  char buf[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof(buf), "%lds", t);
  return buf;
}

double host_peak_rss_gib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is in KiB on Linux
}

void mkdir_p(const std::string& dir) {
  std::string path;
  for (std::size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!path.empty()) ::mkdir(path.c_str(), 0755);
    }
    if (i < dir.size()) path += dir[i];
  }
}

namespace {
// Appends `records` to <metrics>.dropped, then rewrites metrics.jsonl as `kept`; when either cannot be written (its
// disk full), .dropped is put back as it was (removed if this made it) and a UserError says which: the records then
// stay in metrics.jsonl only, once (a failed rewrite left them in both until 2026-11-29, and a later resume appended
// them to .dropped again; a full disk left an empty .dropped).
void move_to_dropped(const std::string& metrics, const std::string& records, const std::string& kept) {
  namespace fs = std::filesystem;
  const std::string side_path = metrics + ".dropped";
  std::error_code ec;
  const bool existed = fs::exists(side_path, ec);
  const auto size_before = existed ? fs::file_size(side_path, ec) : 0;
  const auto put_back = [&] {
    std::error_code e;
    if (existed)
      fs::resize_file(side_path, size_before, e);
    else
      fs::remove(side_path, e);
  };
  {
    std::ofstream side(side_path, std::ios::app | std::ios::binary);
    side << records << std::flush;
    if (!side) {
      side.close();
      put_back();
      throw UserError(side_path + ": cannot be written");
    }
  }
  try {
    io::write_file_atomically(metrics, kept);
  } catch (const UserError&) {
    put_back();
    throw;
  }
}

// Moves the records of steps after `step` at the end of a metrics.jsonl (the trailing run of them: records of
// another mode's earlier run in the same log.dir, before them, stay) to <metrics>.dropped (appended), rewriting the
// file whole; returns how many. Every kept line ends with a newline.
std::int64_t drop_records_after(const std::string& metrics, std::int64_t step) {
  std::ifstream in(metrics, std::ios::binary);
  if (!in) return 0;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::size_t keep = lines.size();
  while (keep > 0) {
    const auto j = nlohmann::json::parse(lines[keep - 1], nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
        j["step"].get<std::int64_t>() <= step)
      break;
    --keep;
  }
  if (keep == lines.size()) return 0;
  std::string kept, dropped;
  for (std::size_t i = 0; i < lines.size(); ++i) (i < keep ? kept : dropped) += lines[i] + "\n";
  move_to_dropped(metrics, dropped, kept);
  return static_cast<std::int64_t>(lines.size() - keep);
}
// Moves what follows byte `at` of metrics.jsonl to <metrics>.dropped, when trim_at ("<bytes> <path>") names this file
// and a line ends there; returns the records moved, or -1 when the position does not apply (another file, the file
// shorter, or rewritten: no line ends there). The records right after the position that are of the resumed step
// itself stay: a finished run's final evaluation, written after its final checkpoint, is of those weights (it was
// moved as "lost work" when the run was extended, until 2026-11-29).
std::int64_t drop_records_from(const std::string& metrics, const std::string& trim_at, std::int64_t resumed_step) {
  namespace fs = std::filesystem;
  const std::size_t space = trim_at.find(' ');
  if (space == std::string::npos) return -1;
  char* end = nullptr;
  const unsigned long long at = std::strtoull(trim_at.c_str(), &end, 10);
  if (end != trim_at.c_str() + space) return -1;
  std::error_code ec;
  const fs::path here = fs::weakly_canonical(fs::absolute(metrics, ec), ec);
  if (ec || here.string() != trim_at.substr(space + 1)) return -1;
  std::ifstream in(metrics, std::ios::binary);
  if (!in) return -1;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() < at || (at > 0 && text[at - 1] != '\n')) return -1;
  std::size_t from = at;  // past the resumed step's own records
  while (resumed_step >= 0 && from < text.size()) {
    const std::size_t nl = text.find('\n', from);
    if (nl == std::string::npos) break;
    const auto j = nlohmann::json::parse(text.substr(from, nl - from), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
        j["step"].get<std::int64_t>() != resumed_step)
      break;
    from = nl + 1;
  }
  if (text.size() == from) return 0;
  const std::string dropped = text.substr(from);
  std::int64_t records = 0;
  for (const char c : dropped) records += c == '\n' ? 1 : 0;
  if (dropped.back() != '\n') ++records;  // a line cut short
  move_to_dropped(metrics, dropped + (dropped.back() == '\n' ? "" : "\n"), text.substr(0, from));
  return records;
}
}  // namespace

std::string RunLog::position() const {
  if (!rank0_ || dir_.empty()) return "";
  namespace fs = std::filesystem;
  const std::string metrics = dir_ + "/metrics.jsonl";
  std::error_code ec;
  const auto size = fs::file_size(metrics, ec);
  if (ec) return "";
  const fs::path abs = fs::weakly_canonical(fs::absolute(metrics, ec), ec);
  if (ec) return "";
  return std::to_string(size) + " " + abs.string();
}

RunLog::RunLog(const dist::MpiEnv& env, const std::string& log_dir, std::int64_t resumed_step,
               const std::string& trim_at)
    : rank0_(env.rank() == 0), dir_(log_dir) {
  if (rank0_ && !dir_.empty()) {
    mkdir_p(dir_);
    const std::string metrics = dir_ + "/metrics.jsonl";
    std::int64_t dropped = -1;  // > 0: metrics.jsonl rewritten, every line ended; -1: not trimmed by position
    if (!trim_at.empty()) {
      try {
        dropped = drop_records_from(metrics, trim_at, resumed_step);
        if (dropped > 0)
          log::info(metrics + ": moved its last " + std::to_string(dropped) + " records, " +
                    (resumed_step >= 0 ? "of the steps after " + std::to_string(resumed_step) + " where this run resumes"
                                       : std::string("of an earlier attempt of this run that ended before its first "
                                                     "checkpoint")) +
                    " (their work was lost with its end), to metrics.jsonl.dropped");
      } catch (const UserError& e) {
        log::warn(std::string(e.what()) + ": the records of the lost steps stay (this run's follow them)");
        dropped = 0;
      }
    }
    if (dropped < 0 && resumed_step >= 0) {
      try {
        dropped = drop_records_after(metrics, resumed_step);
        if (dropped > 0)
          log::info(metrics + ": moved its last " + std::to_string(dropped) + " records, of the steps after " +
                    std::to_string(resumed_step) + " where this run resumes (an earlier run's, whose work ended with " +
                    "it after its last checkpoint), to metrics.jsonl.dropped");
      } catch (const UserError& e) {
        log::warn(std::string(e.what()) + ": the records of steps after " + std::to_string(resumed_step) +
                  " stay (this run's follow them)");
      }
    }
    if (dropped < 0) dropped = 0;
    // An earlier run's last line cut short (its disk was full, it was killed mid-write): this run's lines start on
    // a line of their own, so that the file stays one JSON document a line from here on.
    bool cut = false;
    if (dropped == 0) {
      std::ifstream in(metrics, std::ios::binary | std::ios::ate);
      if (in && in.tellg() > 0) {
        in.seekg(-1, std::ios::end);
        char last = '\n';
        cut = in.get(last) && last != '\n';
      }
    }
    metrics_ = std::make_unique<std::ofstream>(metrics, std::ios::app);
    if (cut) {
      *metrics_ << "\n" << std::flush;
      log::warn(metrics + ": its last line was cut short (an earlier run's disk full or killed while writing it); "
                "this run's lines follow on a line of their own");
    }
    // Its disk full at the start (a resumed run's log.dir): the run goes on without events, as it does when the disk
    // fills mid-run (it ended with exit 2 until 2026-11-29).
    try {
      tb_ = std::make_unique<io::TfEventsWriter>(dir_);
    } catch (const UserError& e) {
      log::warn(std::string(e.what()) + ": the TensorBoard events of this run are not written (the run goes on)");
    }
  }
  // Open MPI gives ranks a pseudo-terminal even when its own output goes to a file: no progress line there.
  tty_ = rank0_ && ::isatty(STDOUT_FILENO) && !std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("SLURM_JOB_ID");
}

RunLog::~RunLog() = default;

void RunLog::emit(const nlohmann::json& j, std::int64_t step) {
  if (metrics_ && !metrics_failed_) {
    *metrics_ << j.dump() << "\n" << std::flush;
    // Mid-run (the file was writable at the start: app::prepare_run_dirs): a full disk; the run goes on, said once.
    if (!*metrics_) {
      metrics_failed_ = true;
      log::warn(dir_ + "/metrics.jsonl: cannot be written (disk full?): the metrics of later steps are lost");
    }
  }
  if (tb_) {
    try {
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it.value().is_number() && it.key() != "step") tb_->scalar(it.key(), it.value().get<double>(), step);
    } catch (const UserError& e) {
      drop_events(e.what());
    }
  }
}

void RunLog::drop_events(const std::string& why) {
  log::warn(why + ": the TensorBoard events of later steps are not written (the run goes on)");
  tb_->abandon();
  tb_.reset();
}

void RunLog::write_summary(const std::string& text) {
  if (!rank0_ || dir_.empty()) return;
  try {
    io::write_file_atomically(dir_ + "/job_summary.txt", text);
  } catch (const UserError& e) {
    log::warn(std::string(e.what()) + ": job_summary.txt not written (the run's work is done and kept)");
  }
}

void RunLog::line(const std::string& text) {
  if (tty_) std::printf("\r\033[K");
  log::info(text);
}

void RunLog::progress(std::int64_t step, std::int64_t first, std::int64_t max_steps, double elapsed) {
  if (!tty_) return;
  const double done = static_cast<double>(step - first), left = static_cast<double>(max_steps - step);
  const double eta = done > 0 ? elapsed / done * left : 0;
  std::printf("\r\033[K[%3.0f%%] step %lld/%lld, ETA %s", 100.0 * static_cast<double>(step) / static_cast<double>(max_steps),
              static_cast<long long>(step), static_cast<long long>(max_steps), human_time(eta).c_str());
  std::fflush(stdout);
}

void RunLog::end_progress() {
  if (tty_) std::printf("\r\033[K");
}

void RunLog::flush() {
  if (!tb_) return;
  try {
    tb_->flush();
  } catch (const UserError& e) {
    drop_events(e.what());
  }
}

int shard_text(char* out, std::size_t size, const model::ModelDef& def, const std::string& what) {
  if (!def.sharded() || size == 0) return 0;
  const int n = std::snprintf(out, size, " | %s %.1f MiB/rank + gather %.1f MiB", what.c_str(),
                              static_cast<double>(def.base_bytes_held()) / (1 << 20),
                              static_cast<double>(def.gather_workspace_bytes()) / (1 << 20));
  return std::min(n, static_cast<int>(size) - 1);
}

void shard_record(nlohmann::json& rec, const model::ModelDef& def, const std::string& what) {
  if (!def.sharded()) return;
  rec[what + "_bytes_per_rank"] = def.base_bytes_held();
  rec[(what == "base" ? "" : what + "_") + "gather_workspace_bytes"] = def.gather_workspace_bytes();
}

int scaler_text(char* out, std::size_t size, const TrainState& st, bool scaling) {
  std::string t;
  char b[64];
  if (scaling) {
    std::snprintf(b, sizeof b, " | scale %.9g", st.loss_scale);
    t += b;
  }
  if (st.overflow_steps > 0) t += " | overflows " + std::to_string(st.overflow_steps);
  if (st.skipped_steps > 0) t += " | skipped " + std::to_string(st.skipped_steps);  // they changed nothing
  if (size == 0) return 0;
  const std::size_t n = std::min(t.size(), size - 1);
  std::memcpy(out, t.data(), n);
  out[n] = '\0';
  return static_cast<int>(n);
}

void scaler_record(nlohmann::json& rec, const TrainState& st, StepOutcome outcome) {
  rec["loss_scale"] = st.loss_scale;
  rec["overflow"] = outcome == StepOutcome::Overflow ? 1 : 0;
  rec["overflow_steps"] = st.overflow_steps;
}

std::string scaler_summary(const TrainState& st, bool scaling) {
  if (!scaling) return "";
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", st.loss_scale);
  return "loss scaling: dynamic, scale " + std::string(b) + " at the end; " + std::to_string(st.overflow_steps) +
         " step" + (st.overflow_steps == 1 ? "" : "s") + " overflowed (skipped, scale halved)\n";
}

}  // namespace mgrl::train
