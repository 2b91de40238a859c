// checkpoint.h: training checkpoints in HDF5: `<dir>/step_<8 digits>.h5`, written by rank 0 under a
// temporary name, fsync'ed and renamed (so a complete file is the only kind with that name); the newest
// complete one is found for resume; older ones pruned to keep_last. Layout: docs/checkpoint.md.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace mgrl::train {

// Where the data loader is: the epoch and the number of samples of that epoch's shuffled order consumed.
struct DataCursor {
  std::int64_t epoch = 0;
  std::int64_t position = 0;
};

struct TrainState {
  std::int64_t step = 0;           // optimizer steps completed
  std::int64_t tokens_seen = 0;    // loss tokens over all ranks
  std::int64_t skipped_steps = 0;  // steps skipped for inf/NaN gradients
  double loss_scale = 1.0;         // dynamic loss scaler (fp16); 1 otherwise
  std::int64_t scaler_good_steps = 0;
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
  std::string mgrl_version;
  std::string extra;  // the loop's own state (GRPO: the batch of a generation round in progress), JSON; may be ""
};

// "<dir>/step_00000042.h5"
std::string checkpoint_path(const std::string& dir, std::int64_t step);
// Writes the file (directory created if needed); UserError naming the path when it cannot.
void write_checkpoint(const std::string& dir, const Checkpoint& ck);
// The newest complete checkpoint of dir (by step number in the name), if any. Temporary files are ignored.
std::optional<std::string> newest_checkpoint(const std::string& dir);
// Reads a checkpoint. UserError naming the file when it is not an HDF5 file, is truncated or corrupt, lacks a
// dataset, or (expected_identity not empty) belongs to another model: "...: checkpoint of another model ..."
// naming the first difference.
Checkpoint read_checkpoint(const std::string& path, const std::string& expected_identity = "");
// Removes all but the newest keep_last checkpoints of dir (keep_last <= 0: keep all).
void prune_checkpoints(const std::string& dir, int keep_last);
// Identity text of a model: architecture line + one "name [shape]" line per trainable tensor.
std::string model_identity(const std::string& architecture, const std::vector<TensorEntry>& tensors);

}  // namespace mgrl::train
