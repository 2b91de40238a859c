// checkpoint.cpp: writing, finding, reading (with every consistency check) and pruning the HDF5 training
// checkpoints `<dir>/step_<8 digits>.h5`; the layout is documented in docs/checkpoint.md.
#include "train/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "core/build_info.h"
#include "core/error.h"
#include "core/log.h"
#include "io/hdf5_file.h"

namespace mgrl::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "mgrl-checkpoint";
constexpr std::int64_t kFormatVersion = 1;

// Dataset names of the layout.
const std::string kTrainable = "/trainable";
const std::string kExpAvg = "/optimizer/exp_avg";
const std::string kExpAvgSq = "/optimizer/exp_avg_sq";
const std::string kOrder = "/trainable_order";
const std::string kConfig = "/config";
const std::string kIdentity = "/model_identity";
const std::string kStep = "/state/step";
const std::string kTokensSeen = "/state/tokens_seen";
const std::string kSkippedSteps = "/state/skipped_steps";
const std::string kLossScale = "/state/loss_scale";
const std::string kScalerGoodSteps = "/state/scaler_good_steps";
const std::string kBestEvalLoss = "/state/best_eval_loss";
const std::string kEpoch = "/state/data/epoch";
const std::string kPosition = "/state/data/position";
const std::string kRng = "/state/rng";
const std::string kExtra = "/state/extra";

std::string join_path(const std::string& dir, const std::string& file) {
  if (dir.empty()) return file;
  return dir.back() == '/' ? dir + file : dir + "/" + file;
}

std::vector<std::uint64_t> dims_of(const io::Shape& s) { return std::vector<std::uint64_t>(s.begin(), s.end()); }

// The step of a file name "step_<8 or more digits>.h5", or -1 for any other name (temporaries included).
std::int64_t step_of_name(const std::string& name) {
  static const std::string prefix = "step_", suffix = ".h5";
  if (name.size() < prefix.size() + 8 + suffix.size()) return -1;
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 18) return -1;  // beyond int64; not one of ours
  std::int64_t step = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

// The complete checkpoints of dir, oldest first. A missing directory has none.
std::vector<std::pair<std::int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  const fs::path root = dir.empty() ? fs::path(".") : fs::path(dir);
  if (!fs::is_directory(root, ec)) return found;
  fs::directory_iterator it(root, ec);
  if (ec) throw UserError(dir + ": cannot list the checkpoint directory (" + ec.message() + ")");
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) throw UserError(dir + ": cannot list the checkpoint directory (" + ec.message() + ")");
    const std::string name = it->path().filename().string();
    const std::int64_t step = step_of_name(name);
    std::error_code file_ec;
    if (step < 0 || !fs::is_regular_file(it->path(), file_ec)) continue;
    found.emplace_back(step, join_path(dir, name));
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    const auto nl = text.find('\n', start);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

// "PATH: checkpoint of another model: it has 'a' where this run has 'b'" for the first differing line.
void check_identity(const std::string& path, const std::string& found, const std::string& expected) {
  if (found == expected) return;
  const auto have = split_lines(found), want = split_lines(expected);
  std::size_t i = 0;
  while (i < have.size() && i < want.size() && have[i] == want[i]) ++i;
  const auto quoted = [](const std::vector<std::string>& lines, std::size_t k) {
    return k < lines.size() ? "'" + lines[k] + "'" : std::string("nothing more");
  };
  throw UserError(path + ": checkpoint of another model: it has " + quoted(have, i) + " where this run has " +
                  quoted(want, i));
}

// Validates what the caller hands to write_checkpoint (a violation is a bug in mgrl, not bad input).
void check_writable(const Checkpoint& ck) {
  MGRL_CHECK(ck.state.step >= 0, "checkpoint of a negative step");
  MGRL_CHECK(ck.adam_m.size() == ck.params.size() && ck.adam_v.size() == ck.params.size(),
             "params (" + std::to_string(ck.params.size()) + "), exp_avg (" + std::to_string(ck.adam_m.size()) +
                 ") and exp_avg_sq (" + std::to_string(ck.adam_v.size()) + ") differ in size");
  std::set<std::string> names;
  for (const auto& t : ck.tensors) {
    MGRL_CHECK(!t.name.empty() && t.name.find_first_of("/\n") == std::string::npos,
               "tensor name '" + t.name + "' is empty or holds '/' or a newline");
    MGRL_CHECK(names.insert(t.name).second, "tensor '" + t.name + "' appears twice");
    for (const auto d : t.shape) MGRL_CHECK(d >= 0, "tensor '" + t.name + "' has a negative dimension");
    const auto n = static_cast<std::size_t>(io::shape_numel(t.shape));
    MGRL_CHECK(t.offset <= ck.params.size() && n <= ck.params.size() - t.offset,
               "tensor '" + t.name + "' " + io::shape_str(t.shape) + " at offset " + std::to_string(t.offset) +
                   " lies outside the flat buffer of " + std::to_string(ck.params.size()) + " floats");
  }
}

// ---- reading helpers: every failure is a UserError that starts with the path ----

[[noreturn]] void corrupt(const io::H5Reader& r, const std::string& what) {
  throw UserError(r.path() + ": corrupt checkpoint: " + what);
}

void require(const io::H5Reader& r, const std::string& name) {
  if (!r.has(name)) throw UserError(r.path() + ": incomplete checkpoint: no dataset '" + name + "'");
}

std::int64_t read_i64(const io::H5Reader& r, const std::string& name) {
  require(r, name);
  if (!r.shape(name).empty()) corrupt(r, "'" + name + "' is not a scalar");
  std::int64_t v = 0;
  r.read(name, DType::I64, &v);
  return v;
}

double read_f64(const io::H5Reader& r, const std::string& name) {
  require(r, name);
  if (!r.shape(name).empty()) corrupt(r, "'" + name + "' is not a scalar");
  double v = 0;
  r.read(name, DType::F64, &v);
  return v;
}

std::string read_text(const io::H5Reader& r, const std::string& name) {
  require(r, name);
  return r.read_string(name);
}

// The members of a group, which must be exactly `names` (the group may be absent when names is empty).
void check_members(const io::H5Reader& r, const std::string& group, const std::vector<std::string>& names) {
  if (!r.has(group)) {
    if (names.empty()) return;
    throw UserError(r.path() + ": incomplete checkpoint: no group '" + group + "'");
  }
  const std::set<std::string> wanted(names.begin(), names.end());
  for (const auto& m : r.list(group))
    if (!wanted.count(m)) corrupt(r, "'" + group + "/" + m + "' is not listed in " + kOrder);
}

// Reads every tensor of one group into a flat buffer laid out by `tensors`.
std::vector<float> read_flat(const io::H5Reader& r, const std::string& group, const std::vector<TensorEntry>& tensors,
                             std::size_t total) {
  std::vector<float> flat(total);
  for (const auto& t : tensors) {
    const std::string name = group + "/" + t.name;
    require(r, name);
    const auto dims = r.shape(name);
    if (dims != dims_of(t.shape)) {
      const io::Shape got(dims.begin(), dims.end());
      corrupt(r, "'" + name + "' has shape " + io::shape_str(got) + " but '" + kTrainable + "/" + t.name + "' has " +
                     io::shape_str(t.shape));
    }
    if (io::shape_numel(t.shape) > 0) r.read(name, DType::F32, flat.data() + t.offset);
  }
  return flat;
}

Checkpoint read_file(const io::H5Reader& r, const std::string& expected_identity) {
  const std::string& path = r.path();
  Checkpoint ck;

  std::string format;
  try {
    format = r.attr_string("/", "format");
  } catch (const UserError&) {
    throw UserError(path + ": not an mgrl checkpoint (no 'format' attribute on '/')");
  }
  if (format != kFormat) throw UserError(path + ": not an mgrl checkpoint (format '" + format + "')");
  try {
    ck.mgrl_version = r.attr_string("/", "mgrl_version");
  } catch (const UserError&) {
    ck.mgrl_version = "unknown";
  }
  const std::int64_t version = r.attr_int("/", "format_version");
  if (version > kFormatVersion)
    throw UserError(path + ": checkpoint format version " + std::to_string(version) + " (written by mgrl " +
                    ck.mgrl_version + ") is newer than version " + std::to_string(kFormatVersion) +
                    ", the one this mgrl (" + build_info().version + ") reads");
  if (version < 1) corrupt(r, "unknown format_version " + std::to_string(version));

  ck.model_identity = read_text(r, kIdentity);
  if (!expected_identity.empty()) check_identity(path, ck.model_identity, expected_identity);
  ck.config_text = read_text(r, kConfig);

  auto& s = ck.state;
  s.step = read_i64(r, kStep);
  s.tokens_seen = read_i64(r, kTokensSeen);
  s.skipped_steps = read_i64(r, kSkippedSteps);
  s.loss_scale = read_f64(r, kLossScale);
  s.scaler_good_steps = read_i64(r, kScalerGoodSteps);
  s.best_eval_loss = read_f64(r, kBestEvalLoss);
  s.cursor.epoch = read_i64(r, kEpoch);
  s.cursor.position = read_i64(r, kPosition);
  if (r.attr_int("/", "step") != s.step)
    corrupt(r, "attribute step = " + std::to_string(r.attr_int("/", "step")) + " but " + kStep + " = " +
                   std::to_string(s.step));
  require(r, kRng);
  if (r.shape(kRng).size() != 1) corrupt(r, "'" + kRng + "' is not one-dimensional");
  const auto rng = r.read_all<std::int64_t>(kRng, DType::I64);
  s.rank_rng.resize(rng.size());
  if (!rng.empty()) std::memcpy(s.rank_rng.data(), rng.data(), rng.size() * sizeof(std::uint64_t));

  // Tensors: names in flat-buffer order from /trainable_order, shapes from /trainable, offsets rebuilt packed.
  const auto names = split_lines(read_text(r, kOrder));
  std::set<std::string> seen;
  std::size_t total = 0;
  for (const auto& name : names) {
    if (name.empty() || name.find('/') != std::string::npos) corrupt(r, "bad tensor name '" + name + "' in " + kOrder);
    if (!seen.insert(name).second) corrupt(r, "tensor '" + name + "' is listed twice in " + kOrder);
    const std::string ds = kTrainable + "/" + name;
    require(r, ds);
    const auto dims = r.shape(ds);
    io::Shape shape;
    for (const auto d : dims) {
      if (d > (std::uint64_t{1} << 40)) corrupt(r, "'" + ds + "' has an absurd dimension " + std::to_string(d));
      shape.push_back(static_cast<std::int64_t>(d));
    }
    ck.tensors.push_back({name, shape, total});
    total += static_cast<std::size_t>(io::shape_numel(shape));
  }
  check_members(r, kTrainable, names);
  check_members(r, kExpAvg, names);
  check_members(r, kExpAvgSq, names);
  ck.params = read_flat(r, kTrainable, ck.tensors, total);
  ck.adam_m = read_flat(r, kExpAvg, ck.tensors, total);
  ck.adam_v = read_flat(r, kExpAvgSq, ck.tensors, total);
  if (r.has(kExtra)) ck.extra = r.read_string(kExtra);
  return ck;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  MGRL_CHECK(step >= 0, "checkpoint of a negative step");
  char name[40];
  std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(step));
  return join_path(dir, name);
}

void write_checkpoint(const std::string& dir, const Checkpoint& ck) {
  check_writable(ck);
  const std::string path = checkpoint_path(dir, ck.state.step);
  if (!dir.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw UserError(dir + ": cannot create the checkpoint directory (" + ec.message() + ")");
  }
  io::H5Writer w(path);  // UserError naming the path when the file cannot be created
  try {
    std::string order;
    for (const auto& t : ck.tensors) {
      if (!order.empty()) order += '\n';
      order += t.name;
      const auto dims = dims_of(t.shape);
      w.write(kTrainable + "/" + t.name, DType::F32, dims, ck.params.data() + t.offset);
      w.write(kExpAvg + "/" + t.name, DType::F32, dims, ck.adam_m.data() + t.offset);
      w.write(kExpAvgSq + "/" + t.name, DType::F32, dims, ck.adam_v.data() + t.offset);
    }
    w.write_string(kOrder, order);
    w.write_string(kConfig, ck.config_text);
    w.write_string(kIdentity, ck.model_identity);

    const auto& s = ck.state;
    w.write(kStep, DType::I64, {}, &s.step);
    w.write(kTokensSeen, DType::I64, {}, &s.tokens_seen);
    w.write(kSkippedSteps, DType::I64, {}, &s.skipped_steps);
    w.write(kLossScale, DType::F64, {}, &s.loss_scale);
    w.write(kScalerGoodSteps, DType::I64, {}, &s.scaler_good_steps);
    w.write(kBestEvalLoss, DType::F64, {}, &s.best_eval_loss);
    w.write(kEpoch, DType::I64, {}, &s.cursor.epoch);
    w.write(kPosition, DType::I64, {}, &s.cursor.position);
    // uint64 counters stored bit for bit as int64 (HDF5 would clip a value >= 2^63 when converting).
    std::vector<std::int64_t> rng(s.rank_rng.size());
    if (!rng.empty()) std::memcpy(rng.data(), s.rank_rng.data(), rng.size() * sizeof(std::int64_t));
    w.write(kRng, DType::I64, {rng.size()}, rng.data());
    if (!ck.extra.empty()) w.write_string(kExtra, ck.extra);

    w.attr("/", "format", kFormat);
    w.attr("/", "format_version", kFormatVersion);
    w.attr("/", "mgrl_version", ck.mgrl_version.empty() ? std::string(build_info().version) : ck.mgrl_version);
    w.attr("/", "step", s.step);
    w.commit();
  } catch (const FatalError& e) {
    // A failed HDF5 write here is the file system's doing (full disk, quota, I/O error); the writer's
    // destructor removes the temporary file, and nothing under the final name was touched.
    throw UserError(path + ": cannot write the checkpoint (disk full or I/O error?): " + e.what());
  }
}

std::optional<std::string> newest_checkpoint(const std::string& dir) {
  const auto found = list_checkpoints(dir);
  if (found.empty()) return std::nullopt;
  return found.back().second;
}

Checkpoint read_checkpoint(const std::string& path, const std::string& expected_identity) {
  io::H5Reader r(path);  // UserError naming the path: missing, not HDF5, truncated
  try {
    return read_file(r, expected_identity);
  } catch (const UserError&) {
    throw;
  } catch (const FatalError& e) {
    // A failing HDF5 call on a file that opened means a damaged file.
    throw UserError(path + ": corrupt checkpoint (an HDF5 read failed: " + e.what() + ")");
  } catch (const std::exception& e) {
    // Damaged metadata can claim absurd sizes (a string of 2^60 bytes): std::length_error, std::bad_alloc.
    throw UserError(path + ": corrupt checkpoint (or too large to read: " + e.what() + ")");
  }
}

void prune_checkpoints(const std::string& dir, int keep_last) {
  if (keep_last <= 0) return;
  const auto found = list_checkpoints(dir);
  const std::size_t keep = static_cast<std::size_t>(keep_last);
  if (found.size() <= keep) return;
  for (std::size_t i = 0; i + keep < found.size(); ++i) {
    std::error_code ec;
    fs::remove(found[i].second, ec);
    if (ec) log::warn(found[i].second + ": cannot remove the old checkpoint (" + ec.message() + ")");
  }
}

std::string model_identity(const std::string& architecture, const std::vector<TensorEntry>& tensors) {
  std::string out = "architecture: " + architecture + "\n";
  for (const auto& t : tensors) out += t.name + " " + io::shape_str(t.shape) + "\n";
  return out;
}

}  // namespace mgrl::train
