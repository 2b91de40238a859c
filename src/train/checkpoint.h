// checkpoint.h: training checkpoints in HDF5: `<dir>/step_<8 digits>.h5`, written by rank 0 under a
// temporary name, fsync'ed and renamed (so a complete file is the only kind with that name); the newest
// complete one is found for resume; older ones pruned to keep_last. Layout: docs/checkpoint.md.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace mgrl::train {

// A checkpoint file this process cannot open (not there, no permission, an I/O error): not known to be damaged, so
// never set aside or passed over (an intact file that rank 1 could not see, or that the run's user may not read,
// was renamed .damaged and the run rolled back to an older checkpoint until 2026-11-28): an error (exit 2).
class CheckpointUnreadable : public UserError {
 public:
  explicit CheckpointUnreadable(const std::string& what) : UserError(what) {}
};

// A checkpoint file that is damaged or not a usable checkpoint (truncated, not HDF5, a dataset
// missing or failing its checksum, non-finite values, a name that disagrees with its step): resume = auto
// passes over it to an older one. Other UserErrors of read_checkpoint (another model, a newer format) are not
// of this kind: they would hold for every checkpoint of the directory.
class CorruptCheckpoint : public UserError {
 public:
  explicit CorruptCheckpoint(const std::string& what) : UserError(what) {}
};

// Where the data loader is: the epoch and the number of samples of that epoch's shuffled order consumed.
struct DataCursor {
  std::int64_t epoch = 0;
  std::int64_t position = 0;
};

struct TrainState {
  std::int64_t step = 0;           // optimizer steps completed
  std::int64_t tokens_seen = 0;    // loss tokens over all ranks
  std::int64_t skipped_steps = 0;  // steps skipped for an inf/NaN loss or gradients (overflows included)
  std::int64_t overflow_steps = 0;  // of those, the loss scaler's overflows (skipped, scale halved)
  double loss_scale = 1.0;         // dynamic loss scaler; 1 without loss scaling
  std::int64_t scaler_good_steps = 0;  // clean steps since the scale last changed
  double best_eval_loss = std::numeric_limits<double>::infinity();
  DataCursor cursor;
  std::vector<std::uint64_t> rank_rng;  // the counter of every rank's random stream, in rank order
};

// One trainable tensor in the flat buffers.
struct TensorEntry {
  std::string name;  // PEFT / Hugging Face name
  io::Shape shape;
  std::size_t offset;  // in floats
};

struct Checkpoint {
  TrainState state;
  std::vector<TensorEntry> tensors;
  std::vector<float> params, adam_m, adam_v;  // flat f32, tensors' layout
  std::string config_text;                    // the run's effective configuration (TOML)
  std::string model_identity;                 // architecture + every trainable name and shape (model_identity())
  std::string base_fingerprint;  // the base weights it was trained over (ModelDef::base_fingerprint); "" in older files
  std::string mgrl_version;
  // CheckpointOptions::numerics and ::data of the run that wrote it; "" in files written before 2026-11-28.
  std::string numerics, data;
  // Where rank 0's metrics.jsonl ended when it was written, "<bytes> <absolute path>" (RunLog::position); a resume
  // moves what later runs appended after it (their lost steps) aside. "" when unknown (no log.dir, older files).
  std::string log_position;
  // LoRA runs: the adapter's configuration as trained (model::peft_config_json: r, alpha, rsLoRA, targets, dropout),
  // which an export writes (until 2026-11-28 it read the configuration of the run's lora.adapter directory again,
  // whatever that held by then). "" for full fine-tuning and older files.
  std::string lora_config;
  // The trainer's reference policy (train::reference_identity); "" without one (SFT, GRPO with beta 0) and in files
  // written before 2026-11-29.
  std::string reference;
  // The reference policy's weights where they move with training (dpo/kto/grpo.sync_ref_model, TR-DPO: mixed into
  // the policy every ref_model_sync_steps steps), in the tensors' layout; empty otherwise and in older files.
  std::vector<float> reference_params;
  std::string extra;  // the loop's own state (GRPO: the batch of a generation round in progress), JSON; may be ""
};

// "<dir>/step_00000042.h5"
std::string checkpoint_path(const std::string& dir, std::int64_t step);
// Writes the file (directory created if needed); UserError naming the path when it cannot.
void write_checkpoint(const std::string& dir, const Checkpoint& ck);
// The newest complete checkpoint of dir (by step number in the name), if any. Temporary files are ignored.
std::optional<std::string> newest_checkpoint(const std::string& dir);
// Every step_<digits>.h5 of dir, newest first (an empty list when dir does not exist).
std::vector<std::string> checkpoints_newest_first(const std::string& dir);
// The step of a checkpoint's path by its file name ("<dir>/step_00000042.h5": 42); -1 for any other name.
std::int64_t checkpoint_step(const std::string& path);
// Reads a checkpoint and verifies it: the checksum of every dataset (format version 2; version 1 files have
// none and are read with a warning), finite weights and moments, a file name step_<N>.h5 that agrees with the
// step inside. CorruptCheckpoint naming the file (and the dataset) when it is damaged; UserError when it
// (expected_identity not empty) belongs to another model ("...: checkpoint of another model ..." naming the
// first difference) or was written by a newer mgrl.
Checkpoint read_checkpoint(const std::string& path, const std::string& expected_identity = "");
// Removes the temporaries `step_<digits>.h5.tmp.<pid>` of dir that an interrupted writer left (a process killed
// while writing a checkpoint or a GRPO rollout file), except those of processes still running on this host; logs
// one line per file removed.
// Returns how many were removed. Never throws.
int remove_stale_temporaries(const std::string& dir);
// The damage of a checkpoint file, as resume = auto finds it: the message of read_checkpoint's CorruptCheckpoint, ""
// when the file reads back intact (or fails for another reason, such as a newer format: not damage).
std::string checkpoint_damage(const std::string& path);
// Moves a damaged checkpoint out of the way, to "<path>.damaged" ("<path>.damaged.2", ... when that exists): a name
// that resume, pruning and the removal of temporaries never take, and that says what the file is. Returns the new
// path, or "" with the reason in *why when it cannot be renamed (the file then stays where it was). Never throws.
std::string set_aside_damaged(const std::string& path, std::string* why);
// What a run's writer (rank 0) knows of the checkpoints of its directory: files known intact (written by the run
// and read back by the seal, or resumed from) and damaged files that could not be set aside.
struct KnownCheckpoints {
  std::set<std::string> intact, damaged;
};
// Keeps the newest keep_last *intact* checkpoints of dir and deletes the older ones (keep_last <= 0: keeps all).
// From the newest down, a file not in known.intact is read back (checkpoint_damage) before it counts; a damaged one
// is set aside (set_aside_damaged, with a warning naming where) and does not count; a file in known.damaged is
// neither counted nor deleted. So an intact checkpoint is never deleted while a damaged one is kept, and a damaged
// one found is never deleted. Files older than the keep_last-th intact one are deleted unread. A file that cannot be
// deleted is a warning. known.intact gains the files found intact.
void prune_checkpoints(const std::string& dir, int keep_last, KnownCheckpoints& known);
void prune_checkpoints(const std::string& dir, int keep_last);  // nothing known: each counted file is read back
// Identity text of a model: architecture line + one "name [shape]" line per trainable tensor.
std::string model_identity(const std::string& architecture, const std::vector<TensorEntry>& tensors);

}  // namespace mgrl::train
