// run_log.h: what a training run reports, shared by SFT and GRPO: on rank 0 the step lines (stdout), a progress
// line with ETA on a terminal, metrics.jsonl and TensorBoard event files in the run directory; phase timers for
// the split of a step's time; small helpers (human-readable durations, peak memory).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/mpi_env.h"
#include "io/tfevents.h"
#include "kernels/ops.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace mgrl::model {
class ModelDef;
}

namespace mgrl::train {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t);
std::string human_time(double seconds);  // "42s", "3m05s", "1h02m"
double host_peak_rss_gib();
void mkdir_p(const std::string& dir);

// The loss scaler and skipped steps on a step line: " | scale 32768" (loss scaling on), " | overflows N" (the
// scaler's overflows so far), " | skipped N" (every step that changed nothing, overflows included). Writes at most
// size - 1 characters to out; returns how many it wrote.
int scaler_text(char* out, std::size_t size, const TrainState& st, bool scaling);
// Adds to a metrics record (loss scaling on): loss_scale (after the step), overflow (1: this step overflowed, was
// skipped and halved the scale; else 0) and overflow_steps (so far).
void scaler_record(nlohmann::json& rec, const TrainState& st, StepOutcome outcome);
// model.shard_base: writes " | base X MiB/rank + gather Y MiB" (what this rank holds of the base, and the gather
// workspace beside it) into out, at most size bytes with its '\0'; returns the characters written (0, and nothing
// written, when the base is not sharded). shard_record adds the same two figures to a metrics record
// (base_bytes_per_rank, gather_workspace_bytes), when sharded. `what`: another sharded model's name in place of
// "base" (distillation's teacher: " | teacher X MiB/rank + gather Y MiB", teacher_bytes_per_rank,
// teacher_gather_workspace_bytes).
int shard_text(char* out, std::size_t size, const model::ModelDef& def, const std::string& what = "base");
void shard_record(nlohmann::json& rec, const model::ModelDef& def, const std::string& what = "base");
// job_summary.txt's line about loss scaling ("" when it is off), ending in '\n'.
std::string scaler_summary(const TrainState& st, bool scaling);

// The phase table of a run: each op phase's seconds per step (kernels::Phase, measured on the backend: CUDA events on
// a GPU) and its share of the mean step time; attention and LoRA are shown as parts of forward + backward, and what
// no phase covers (host work between kernels, data, metrics) as "other". Lines end in '\n'.
// `host` adds phases timed on the host outside the op phases (GRPO: generation, rewards).
std::string phase_table(const kernels::PhaseSeconds& s, std::int64_t steps, double step_seconds,
                        const std::vector<std::pair<std::string, double>>& host = {});

// The phase table as data, for tools (perf/scaling): {"steps": n, "step_seconds": s, "tokens": t, "seconds": {phase:
// s}, "ranks": [{phase: s, ..., "step_seconds": s}, one per rank]}; seconds are totals over the n steps, "seconds" and
// "step_seconds" rank 0's, "ranks" every rank's own (communication on CPU ranks includes waiting for the slower one).
// A collective (the ranks' figures are gathered): every rank calls it; "ranks" is empty except on rank 0.
nlohmann::json phase_record(const dist::MpiEnv& env, const kernels::PhaseSeconds& s, std::int64_t steps,
                            double step_seconds, double tokens,
                            const std::vector<std::pair<std::string, double>>& host = {});

// Leaves the op phases of a scope (evaluation, generation) out of the phase table: what was measured before is kept,
// what the scope adds is dropped. (On a GPU: one synchronisation at each end.)
class PhasesPaused {
 public:
  explicit PhasesPaused(kernels::Ops& ops) : ops_(ops), kept_(ops.phase_seconds()) {}
  ~PhasesPaused() {
    ops_.phase_reset();
    for (int p = 0; p < kernels::kNumPhases; ++p) ops_.phase_add(static_cast<kernels::Phase>(p), kept_[p]);
  }
  PhasesPaused(const PhasesPaused&) = delete;
  PhasesPaused& operator=(const PhasesPaused&) = delete;

 private:
  kernels::Ops& ops_;
  kernels::PhaseSeconds kept_;
};

class RunLog {
 public:
  // resumed_step >= 0: the run resumes at that step (from a checkpoint). The records of later steps at the end of
  // metrics.jsonl, an earlier run's whose work was lost with its end (killed after its last checkpoint), are moved
  // to metrics.jsonl.dropped (said once), so that each step has the records of the run that kept it (the event
  // files are not rewritten). `trim_at` ("<bytes> <path>", Checkpointer::log_position_to_trim) names where the run
  // this one continues had its metrics.jsonl end: what follows there (the lost steps of a killed attempt, whatever
  // other records came before them) is what is moved, when it is this file and still ends a line there; else the
  // records are picked by step, as before 2026-11-28 (which moved another mode's records in a shared log.dir when
  // the killed attempt had written none after them).
  RunLog(const dist::MpiEnv& env, const std::string& log_dir, std::int64_t resumed_step = -1,
         const std::string& trim_at = "");
  ~RunLog();
  // One record at `step`: a line of metrics.jsonl, and every number (but "step") as a TensorBoard scalar.
  void emit(const nlohmann::json& record, std::int64_t step);
  // A line for the log (rank 0), clearing the progress line first.
  void line(const std::string& text);
  // The progress line "[ 42%] step 42/100, ETA 1m05s" (rank 0, on a terminal, not under mpirun or SLURM).
  void progress(std::int64_t step, std::int64_t first_step, std::int64_t max_steps, double elapsed);
  void end_progress();
  void flush();
  // Rank 0: <log.dir>/job_summary.txt, replaced whole (written under a temporary name, then renamed) or not at all:
  // a failure is a warning, not the end of a run whose work is done.
  void write_summary(const std::string& text);
  bool rank0() const { return rank0_; }
  const std::string& dir() const { return dir_; }
  // Rank 0: "<bytes> <absolute path>" of metrics.jsonl as it stands (every record is flushed); "" without log.dir
  // or elsewhere.
  std::string position() const;

 private:
  // A write of the TensorBoard events failed (a full disk): said once, and no more events are written; the run
  // goes on, as it does when metrics.jsonl cannot be written.
  void drop_events(const std::string& why);
  bool rank0_, tty_;
  bool metrics_failed_ = false;
  std::string dir_;
  std::unique_ptr<std::ofstream> metrics_;
  std::unique_ptr<io::TfEventsWriter> tb_;
};

// Seconds spent per named phase (generation, rewards, reference, training, communication, ...).
class PhaseTimes {
 public:
  class Scope {
   public:
    Scope(PhaseTimes& p, std::string name) : p_(p), name_(std::move(name)), t0_(Clock::now()) {}
    ~Scope() { p_.add(name_, seconds_since(t0_)); }

   private:
    PhaseTimes& p_;
    std::string name_;
    Clock::time_point t0_;
  };
  Scope time(const std::string& name) { return Scope(*this, name); }
  void add(const std::string& name, double s) { t_[name] += s; }
  double get(const std::string& name) const {
    auto it = t_.find(name);
    return it == t_.end() ? 0.0 : it->second;
  }
  const std::map<std::string, double>& all() const { return t_; }
  void clear() { t_.clear(); }

 private:
  std::map<std::string, double> t_;
};

}  // namespace mgrl::train
