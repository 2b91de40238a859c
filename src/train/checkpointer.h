// checkpointer.h: checkpoints of a training run, shared by SFT and GRPO: before writing, every rank's trainable
// weights are compared with rank 0's (a mismatch stops the run naming the rank), and weights or moments with a
// non-finite value are not written (exit 2, naming the last checkpoint); rank 0 writes
// <dir>/step_<8 digits>.h5 (weights, AdamW moments, state, config, the loop's extra state) and prunes old ones
// (keeping the newest keep_last intact ones);
// resume = auto | none | a path, read by every rank, errors agreed on by all ranks.
#pragma once
#include <functional>
#include <string>

#include "dist/mpi_env.h"
#include "kernels/ops.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/trainable.h"

namespace mgrl::train {

struct CheckpointOptions {
  std::string dir;         // "": no checkpoints
  int every = 0;           // 0: only at the end
  int keep_last = 0;       // 0: all
  std::string resume;      // "" / "none", "auto", or a path
  std::string config_text; // the run's effective configuration
  // checkpoint.allow_other_base: resume a checkpoint written over other base weights than this run's (compared by
  // their fingerprints, model::ModelDef::base_fingerprint); refused otherwise, naming the first tensor that differs.
  bool allow_other_base = false;
  // What the checkpoint keeps beside the configuration, compared on resume (a warning each when they differ): the
  // numeric setup (backend, CPU threads and BLAS, or GPU: app::numerics_of) and the training data's bytes
  // (data.input: "N bytes, checksum X").
  std::string numerics, data;
  std::string lora_config;  // LoRA runs: model::peft_config_json of the adapter trained (Checkpoint::lora_config)
  // The trainer's reference policy (train::reference_identity), kept in every checkpoint; a resume whose reference is
  // another is refused (both set). "": no reference (SFT, GRPO with beta 0).
  std::string reference;
};

// A run resumed at `step` from `resumed` ("" when it started afresh) whose last step `end` (train.max_steps, or
// train.stop_at_step) is not beyond it has nothing to train: one warning (rank 0) saying so and how to go on, and
// true. The trainers then end at once, touching no file of the run (a requeued job that had finished rewrote
// job_summary.txt with an empty run's and added the final evaluation again, until 2026-11-28).
bool nothing_to_train(const std::string& resumed, std::int64_t step, std::int64_t end);

class Checkpointer {
 public:
  // identity: model_identity() of the trainable tensors. Every checkpoint keeps the base weights' fingerprint of
  // opt.trainable() (Trainable::base), and a resume compares it.
  Checkpointer(const dist::MpiEnv& env, kernels::Ops& ops, const Optimizer& opt, CheckpointOptions opts,
               std::string identity);
  bool enabled() const { return !opts_.dir.empty(); }
  // Due after this step (not the last one, which the caller saves itself)?
  bool due(std::int64_t step) const { return enabled() && opts_.every > 0 && step % opts_.every == 0; }
  // Collective. Loads the checkpoint named by `resume` into the weights, the moments and st; extra gets the
  // loop's state. Returns the path, or "" when starting fresh. auto: the newest intact checkpoint of dir (damaged
  // newer ones are passed over, and set aside by rank 0 as <file>.damaged with a warning; UserError, renaming
  // nothing, when there are checkpoints but none is intact);
  // a path: that file, any damage a UserError. accept (collective, may be empty) checks the loop's extra state
  // before the resume counts (a UserError from it is prefixed with the checkpoint's path). Then, once, a warning
  // names the settings of this run that differ from the checkpoint's run's.
  std::string resume(TrainState& st, std::string* extra,
                     const std::function<void(const std::string& extra)>& accept = {});
  // Collective: the hash check, then rank 0 writes.
  void save(const TrainState& st, const std::string& extra = "");
  // The run's metrics log (RunLog::position, "<bytes> <path>" of rank 0's metrics.jsonl), for the trainers:
  // log_position_to_trim() is where this run's log continues the run it carries on: the resumed checkpoint's
  // position, or for a fresh start in a checkpoint.dir the position where an earlier attempt of this run began
  // (<dir>/.mgrl.log_start: one killed before its first checkpoint); "" when none. attach_log(position) gives every
  // later checkpoint its position, and a fresh start records where its log begins. Rank 0's view; "" elsewhere.
  std::string log_position_to_trim() const;
  // Attached while the returned object lives (the run's RunLog must outlive it).
  class LogAttachment {
   public:
    explicit LogAttachment(Checkpointer* c) : c_(c) {}
    ~LogAttachment() { c_->log_position_ = nullptr; }
    LogAttachment(const LogAttachment&) = delete;
    LogAttachment& operator=(const LogAttachment&) = delete;

   private:
    Checkpointer* c_;
  };
  [[nodiscard]] LogAttachment attach_log(std::function<std::string()> position);
  // A reference policy that moves with training (sync_ref_model, TR-DPO: `ref` mixed into the policy every `every`
  // steps): its weights go into every checkpoint (/reference_weights) and a resume sets them back. A resume of a
  // checkpoint without them past its first sync (its run had no sync), or of one with them in a run without
  // (reference null: the starting weights would be the reference again), is refused. Before resume().
  void keep_synced_reference(FrozenCopy* ref, std::int64_t every) {
    synced_ = ref;
    sync_every_ = every;
  }
  // The trainable values' copies a checkpoint holds: weights, two moments, and a synced reference's weights.
  int copies() const { return synced_ ? 4 : 3; }
  // FNV-1a of this rank's trainable weights, hex.
  std::string params_hash() const;
  // The newest checkpoint of this run: the last one written, else the one resumed from; "" when none.
  const std::string& last_checkpoint() const { return last_; }
  const std::string& identity() const { return identity_; }

 private:
  std::string resume_checkpoint(TrainState& st, std::string* extra);  // resume() before accept and the warning
  void write(const TrainState& st, const std::string& extra);  // rank 0: writes, then prunes
  void load(const std::string& path, TrainState& st, std::string* extra);
  Checkpoint read_checked(const std::string& path) const;  // read_checkpoint + this run's size check
  void apply(const Checkpoint& ck, const std::string& path, TrainState& st, std::string* extra);
  const dist::MpiEnv& env_;
  kernels::Ops& ops_;
  const Optimizer& opt_;
  CheckpointOptions opts_;
  std::string identity_;
  std::string last_;
  std::string changed_;  // the settings changed since the resumed checkpoint's run (changed_settings)
  std::string numerics_;  // the warning about another numeric setup than the checkpoint's run's ("" when the same)
  std::string resumed_log_position_;  // the resumed checkpoint's Checkpoint::log_position
  bool resumed_ = false;
  std::function<std::string()> log_position_;
  KnownCheckpoints known_;  // rank 0: what pruning needs not read back (written, resumed from) or must not touch
  FrozenCopy* synced_ = nullptr;  // keep_synced_reference
  std::int64_t sync_every_ = 0;
};

}  // namespace mgrl::train
