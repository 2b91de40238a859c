// checkpoint.cpp: writing, finding, reading (with every consistency check) and pruning the HDF5 training
// checkpoints `<dir>/step_<8 digits>.h5`; the layout is documented in docs/checkpoint.md.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "core/build_info.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "io/hdf5_file.h"
#include "io/hdf5_seal.h"

namespace mgrl::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "mgrl-checkpoint";
// 1: no checksums (mgrl before 0.2); 2: a "checksum" attribute on every dataset.
constexpr std::int64_t kFormatVersion = 2;
constexpr std::int64_t kFirstVersionWithChecksums = 2;
const char* const kChecksumAttr = "checksum";

// Dataset names of the layout.
const std::string kTrainable = "/trainable";
const std::string kExpAvg = "/optimizer/exp_avg";
const std::string kExpAvgSq = "/optimizer/exp_avg_sq";
const std::string kOrder = "/trainable_order";
const std::string kConfig = "/config";
const std::string kIdentity = "/model_identity";
const std::string kBase = "/base_fingerprint";  // absent in files written before 2026-11-28
const std::string kNumerics = "/numerics";       // absent in files written before 2026-11-28 (and their seal)
const std::string kData = "/data_fingerprint";   // the same
const std::string kLogPosition = "/log_position";  // the same
const std::string kLoraConfig = "/lora_config";    // the same
const std::string kReference = "/reference";       // absent in files written before 2026-11-29 (and their seal)
const std::string kReferenceWeights = "/reference_weights";  // a synced reference's weights (sync_ref_model) only
const std::string kStep = "/state/step";
const std::string kTokensSeen = "/state/tokens_seen";
const std::string kSkippedSteps = "/state/skipped_steps";
const std::string kOverflowSteps = "/state/overflow_steps";  // absent in files older than the loss scaler: 0
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

// A UserError that holds for every checkpoint of the run (another model, a newer format): not a damaged file.
class NotForThisRun : public UserError {
 public:
  explicit NotForThisRun(const std::string& what) : UserError(what) {}
};

// "PATH: checkpoint of another model: it has 'a' where this run has 'b'" for the first differing line.
void check_identity(const std::string& path, const std::string& found, const std::string& expected) {
  if (found == expected) return;
  const auto have = split_lines(found), want = split_lines(expected);
  std::size_t i = 0;
  while (i < have.size() && i < want.size() && have[i] == want[i]) ++i;
  const auto quoted = [](const std::vector<std::string>& lines, std::size_t k) {
    return k < lines.size() ? "'" + lines[k] + "'" : std::string("nothing more");
  };
  throw NotForThisRun(path + ": checkpoint of another model: it has " + quoted(have, i) + " where this run has " +
                  quoted(want, i));
}

// Validates what the caller hands to write_checkpoint (a violation is a bug in mgrl, not bad input).
void check_writable(const Checkpoint& ck) {
  MGRL_CHECK(ck.state.step >= 0, "checkpoint of a negative step");
  MGRL_CHECK(ck.adam_m.size() == ck.params.size() && ck.adam_v.size() == ck.params.size(),
             "params (" + std::to_string(ck.params.size()) + "), exp_avg (" + std::to_string(ck.adam_m.size()) +
                 ") and exp_avg_sq (" + std::to_string(ck.adam_v.size()) + ") differ in size");
  MGRL_CHECK(ck.reference_params.empty() || ck.reference_params.size() == ck.params.size(),
             "reference weights (" + std::to_string(ck.reference_params.size()) + ") and params (" +
                 std::to_string(ck.params.size()) + ") differ in size");
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
  throw CorruptCheckpoint(r.path() + ": corrupt checkpoint: " + what);
}

void require(const io::H5Reader& r, const std::string& name) {
  if (!r.has(name)) throw CorruptCheckpoint(r.path() + ": incomplete checkpoint: no dataset '" + name + "'");
}

// Compares the stored checksum of a dataset with that of the bytes read (required from format version 2 on;
// checked whenever present).
void verify(const io::H5Reader& r, std::int64_t version, const std::string& name, const void* data,
            std::size_t nbytes) {
  if (!r.has_attr(name, kChecksumAttr)) {
    if (version >= kFirstVersionWithChecksums) corrupt(r, "'" + name + "' has no checksum");
    return;
  }
  const std::string stored = r.attr_string(name, kChecksumAttr);
  const std::string actual = io::checksum_hex(data, nbytes);
  if (stored != actual)
    throw CorruptCheckpoint(r.path() + ": damaged checkpoint: the data of '" + name + "' do not match their checksum (" +
                            actual + ", stored " + stored + ")");
}

std::int64_t read_i64(const io::H5Reader& r, std::int64_t version, const std::string& name) {
  require(r, name);
  if (!r.shape(name).empty()) corrupt(r, "'" + name + "' is not a scalar");
  std::int64_t v = 0;
  r.read(name, DType::I64, &v);
  verify(r, version, name, &v, sizeof v);
  return v;
}

double read_f64(const io::H5Reader& r, std::int64_t version, const std::string& name) {
  require(r, name);
  if (!r.shape(name).empty()) corrupt(r, "'" + name + "' is not a scalar");
  double v = 0;
  r.read(name, DType::F64, &v);
  verify(r, version, name, &v, sizeof v);
  return v;
}

std::string read_text(const io::H5Reader& r, std::int64_t version, const std::string& name) {
  require(r, name);
  std::string s = r.read_string(name);
  verify(r, version, name, s.data(), s.size());
  return s;
}

// The first non-finite value of data, as "nan at index 3" / "inf at index 0"; "" when all are finite.
std::string first_non_finite(const float* data, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(data[i]))
      return std::string(std::isnan(data[i]) ? "nan" : (data[i] > 0 ? "inf" : "-inf")) + " at index " +
             std::to_string(i);
  return "";
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

// Reads every tensor of one group into a flat buffer laid out by `tensors`, verifying checksums and finiteness.
std::vector<float> read_flat(const io::H5Reader& r, std::int64_t version, const std::string& group,
                             const std::vector<TensorEntry>& tensors, std::size_t total) {
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
    const auto n = static_cast<std::size_t>(io::shape_numel(t.shape));
    float* out = flat.data() + t.offset;
    if (n > 0) r.read(name, DType::F32, out);
    verify(r, version, name, out, n * sizeof(float));
    const std::string bad = first_non_finite(out, n);
    if (!bad.empty()) corrupt(r, "tensor '" + name + "' holds a non-finite value (" + bad + ")");
  }
  return flat;
}

// r: a verified sealed file, or (sealed false) one written before seals.
Checkpoint read_file(const io::H5Reader& r, bool sealed, const std::string& expected_identity) {
  const std::string& path = r.path();
  Checkpoint ck;

  std::string format;
  try {
    format = r.attr_string("/", "format");
  } catch (const UserError&) {
    throw CorruptCheckpoint(path + ": not an mgrl checkpoint (no 'format' attribute on '/')");
  }
  if (format != kFormat) corrupt(r, "not an mgrl checkpoint (format '" + format + "')");
  try {
    ck.mgrl_version = r.attr_string("/", "mgrl_version");
  } catch (const UserError&) {
    ck.mgrl_version = "unknown";
  }
  const std::int64_t version = r.attr_int("/", "format_version");
  if (version > kFormatVersion)
    throw NotForThisRun(path + ": checkpoint format version " + std::to_string(version) + " (written by mgrl " +
                    ck.mgrl_version + ") is newer than version " + std::to_string(kFormatVersion) +
                    ", the one this mgrl (" + build_info().version + ") reads");
  if (version < 1) corrupt(r, "unknown format_version " + std::to_string(version));

  ck.model_identity = read_text(r, version, kIdentity);
  if (!expected_identity.empty()) check_identity(path, ck.model_identity, expected_identity);
  ck.config_text = read_text(r, version, kConfig);
  if (r.has(kBase)) ck.base_fingerprint = read_text(r, version, kBase);
  if (r.has(kNumerics)) ck.numerics = read_text(r, version, kNumerics);
  if (r.has(kData)) ck.data = read_text(r, version, kData);
  if (r.has(kLogPosition)) ck.log_position = read_text(r, version, kLogPosition);
  if (r.has(kLoraConfig)) ck.lora_config = read_text(r, version, kLoraConfig);
  if (r.has(kReference)) ck.reference = read_text(r, version, kReference);

  auto& s = ck.state;
  s.step = read_i64(r, version, kStep);
  s.tokens_seen = read_i64(r, version, kTokensSeen);
  s.skipped_steps = read_i64(r, version, kSkippedSteps);
  s.overflow_steps = r.has(kOverflowSteps) ? read_i64(r, version, kOverflowSteps) : 0;
  if (s.skipped_steps < 0 || s.overflow_steps < 0 || s.overflow_steps > s.skipped_steps)
    corrupt(r, "skipped_steps = " + std::to_string(s.skipped_steps) + " and overflow_steps = " +
                   std::to_string(s.overflow_steps) + " disagree");
  s.loss_scale = read_f64(r, version, kLossScale);
  s.scaler_good_steps = read_i64(r, version, kScalerGoodSteps);
  s.best_eval_loss = read_f64(r, version, kBestEvalLoss);
  s.cursor.epoch = read_i64(r, version, kEpoch);
  s.cursor.position = read_i64(r, version, kPosition);
  if (s.step < 0) corrupt(r, "negative step " + std::to_string(s.step));
  // A file named step_<N>.h5 must hold step N (a renamed or copied-over file would resume at the wrong step).
  const auto slash = path.find_last_of('/');
  const std::int64_t named = step_of_name(slash == std::string::npos ? path : path.substr(slash + 1));
  if (named >= 0 && named != s.step)
    corrupt(r, "the file name says step " + std::to_string(named) + " but it holds step " + std::to_string(s.step));
  if (r.attr_int("/", "step") != s.step)
    corrupt(r, "attribute step = " + std::to_string(r.attr_int("/", "step")) + " but " + kStep + " = " +
                   std::to_string(s.step));
  require(r, kRng);
  const auto rng_dims = r.shape(kRng);
  if (rng_dims.size() != 1) corrupt(r, "'" + kRng + "' is not one-dimensional");
  if (rng_dims[0] > r.file_size() / 8) corrupt(r, "'" + kRng + "' claims more values than the file holds");
  const auto rng = r.read_all<std::int64_t>(kRng, DType::I64);
  verify(r, version, kRng, rng.data(), rng.size() * sizeof(std::int64_t));
  s.rank_rng.resize(rng.size());
  if (!rng.empty()) std::memcpy(s.rank_rng.data(), rng.data(), rng.size() * sizeof(std::uint64_t));

  // Tensors: names in flat-buffer order from /trainable_order, shapes from /trainable, offsets rebuilt packed.
  const auto names = split_lines(read_text(r, version, kOrder));
  std::set<std::string> seen;
  std::size_t total = 0;
  for (const auto& name : names) {
    if (name.empty() || name.find('/') != std::string::npos) corrupt(r, "bad tensor name '" + name + "' in " + kOrder);
    if (!seen.insert(name).second) corrupt(r, "tensor '" + name + "' is listed twice in " + kOrder);
    const std::string ds = kTrainable + "/" + name;
    require(r, ds);
    const auto dims = r.shape(ds);
    io::Shape shape;
    // Sizes are checked against the file before anything is allocated: the three copies of every tensor
    // (weights, two moments) are stored uncompressed, so together they cannot exceed the file.
    const std::uint64_t room = r.file_size() / (3 * sizeof(float));
    std::uint64_t numel = 1;
    for (const auto d : dims) {
      if (d > room || (d > 0 && numel > room / d))
        corrupt(r, "'" + ds + "' claims a shape of more values than the file holds");
      numel *= d;
      shape.push_back(static_cast<std::int64_t>(d));
    }
    ck.tensors.push_back({name, shape, total});
    total += static_cast<std::size_t>(numel);
    if (total > room) corrupt(r, "the tensors up to '" + ds + "' claim more values than the file holds");
  }
  check_members(r, kTrainable, names);
  check_members(r, kExpAvg, names);
  check_members(r, kExpAvgSq, names);
  ck.params = read_flat(r, version, kTrainable, ck.tensors, total);
  ck.adam_m = read_flat(r, version, kExpAvg, ck.tensors, total);
  ck.adam_v = read_flat(r, version, kExpAvgSq, ck.tensors, total);
  if (r.has(kReferenceWeights)) {
    check_members(r, kReferenceWeights, names);
    ck.reference_params = read_flat(r, version, kReferenceWeights, ck.tensors, total);
  }
  if (r.has(kExtra)) ck.extra = read_text(r, version, kExtra);
  // Said once the file is read (a damaged one gets its error line alone).
  if (version < kFirstVersionWithChecksums)
    log::warn_once(path + ": a checkpoint of format version " + std::to_string(version) + " (mgrl " +
                   ck.mgrl_version + ") has no checksums: its data are read without verification");
  else if (!sealed)
    log::warn_once(path + ": a checkpoint without whole-file checksums (mgrl " + ck.mgrl_version +
                   ", before checkpoints were sealed): HDF5 has parsed it before its data could be verified");
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
  remove_stale_temporaries(dir);
  // The file is sealed (io/hdf5_seal.h): its user block gets checksums of all its bytes, one per dataset, so that
  // a reader verifies the whole file before libhdf5 parses it. The user block is sized for these datasets.
  std::vector<std::string> datasets;
  for (const auto& t : ck.tensors)
    for (const auto* group : {&kTrainable, &kExpAvg, &kExpAvgSq, &kReferenceWeights})
      if (group != &kReferenceWeights || !ck.reference_params.empty()) datasets.push_back(*group + "/" + t.name);
  // Every dataset written below, the optional ones included (until 2026-11-29 six of them were left out of the sum:
  // a checkpoint whose other names summed to just under a power of two failed to seal at its first write).
  for (const auto* name : {&kOrder, &kConfig, &kIdentity, &kStep, &kTokensSeen, &kSkippedSteps, &kOverflowSteps,
                           &kLossScale, &kScalerGoodSteps, &kBestEvalLoss, &kEpoch, &kPosition, &kRng, &kExtra})
    datasets.push_back(*name);
  for (const auto& [name, value] : {std::pair{&kBase, &ck.base_fingerprint}, std::pair{&kNumerics, &ck.numerics},
                                    std::pair{&kData, &ck.data}, std::pair{&kLogPosition, &ck.log_position},
                                    std::pair{&kLoraConfig, &ck.lora_config}, std::pair{&kReference, &ck.reference}})
    if (!value->empty()) datasets.push_back(*name);
  io::H5Writer w(path, io::seal_userblock_size(datasets));  // UserError naming the path when it cannot be created
  // A failed HDF5 write here is the file system's doing (full disk, quota, I/O error); the writer removes the
  // temporary file (io::H5Writer), and nothing under the final name was touched.
  io::write_or_explain(path, "the checkpoint", [&] {
    // Every dataset gets a checksum attribute over the bytes of its values (docs/checkpoint.md#integrity).
    const auto put = [&w](const std::string& name, DType type, const std::vector<std::uint64_t>& dims,
                          const void* data, std::size_t nbytes) {
      w.write(name, type, dims, data);
      w.attr(name, kChecksumAttr, io::checksum_hex(data, nbytes));
    };
    const auto put_string = [&w](const std::string& name, const std::string& value) {
      w.write_string(name, value);
      w.attr(name, kChecksumAttr, io::checksum_hex(value.data(), value.size()));
    };
    const auto put_i64 = [&put](const std::string& name, const std::int64_t& v) {
      put(name, DType::I64, {}, &v, sizeof v);
    };
    const auto put_f64 = [&put](const std::string& name, const double& v) { put(name, DType::F64, {}, &v, sizeof v); };
    std::string order;
    for (const auto& t : ck.tensors) {
      if (!order.empty()) order += '\n';
      order += t.name;
      const auto dims = dims_of(t.shape);
      const std::size_t nbytes = static_cast<std::size_t>(io::shape_numel(t.shape)) * sizeof(float);
      put(kTrainable + "/" + t.name, DType::F32, dims, ck.params.data() + t.offset, nbytes);
      put(kExpAvg + "/" + t.name, DType::F32, dims, ck.adam_m.data() + t.offset, nbytes);
      put(kExpAvgSq + "/" + t.name, DType::F32, dims, ck.adam_v.data() + t.offset, nbytes);
      if (!ck.reference_params.empty())
        put(kReferenceWeights + "/" + t.name, DType::F32, dims, ck.reference_params.data() + t.offset, nbytes);
    }
    fault::point("checkpoint_write", 0, ck.state.step);  // tests: fail half way through the file (core/fault.h)
    put_string(kOrder, order);
    put_string(kConfig, ck.config_text);
    put_string(kIdentity, ck.model_identity);
    if (!ck.base_fingerprint.empty()) put_string(kBase, ck.base_fingerprint);
    if (!ck.numerics.empty()) put_string(kNumerics, ck.numerics);
    if (!ck.data.empty()) put_string(kData, ck.data);
    if (!ck.log_position.empty()) put_string(kLogPosition, ck.log_position);
    if (!ck.lora_config.empty()) put_string(kLoraConfig, ck.lora_config);
    if (!ck.reference.empty()) put_string(kReference, ck.reference);

    const auto& s = ck.state;
    put_i64(kStep, s.step);
    put_i64(kTokensSeen, s.tokens_seen);
    put_i64(kSkippedSteps, s.skipped_steps);
    put_i64(kOverflowSteps, s.overflow_steps);
    put_f64(kLossScale, s.loss_scale);
    put_i64(kScalerGoodSteps, s.scaler_good_steps);
    put_f64(kBestEvalLoss, s.best_eval_loss);
    put_i64(kEpoch, s.cursor.epoch);
    put_i64(kPosition, s.cursor.position);
    // uint64 counters stored bit for bit as int64 (HDF5 would clip a value >= 2^63 when converting).
    std::vector<std::int64_t> rng(s.rank_rng.size());
    if (!rng.empty()) std::memcpy(rng.data(), s.rank_rng.data(), rng.size() * sizeof(std::int64_t));
    put(kRng, DType::I64, {rng.size()}, rng.data(), rng.size() * sizeof(std::int64_t));
    if (!ck.extra.empty()) put_string(kExtra, ck.extra);

    w.attr("/", "format", kFormat);
    w.attr("/", "format_version", kFormatVersion);
    w.attr("/", "mgrl_version", ck.mgrl_version.empty() ? std::string(build_info().version) : ck.mgrl_version);
    w.attr("/", "step", s.step);
    w.commit();
  });
}

std::optional<std::string> newest_checkpoint(const std::string& dir) {
  const auto found = list_checkpoints(dir);
  if (found.empty()) return std::nullopt;
  return found.back().second;
}

std::int64_t checkpoint_step(const std::string& path) {
  const auto slash = path.rfind('/');
  return step_of_name(slash == std::string::npos ? path : path.substr(slash + 1));
}

std::vector<std::string> checkpoints_newest_first(const std::string& dir) {
  const auto found = list_checkpoints(dir);
  std::vector<std::string> out;
  for (auto it = found.rbegin(); it != found.rend(); ++it) out.push_back(it->second);
  return out;
}

Checkpoint read_checkpoint(const std::string& path, const std::string& expected_identity) {
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // O_NONBLOCK: a FIFO does not block here
    if (fd < 0) {
      const int e = errno;
      throw CheckpointUnreadable(
          path + ": cannot open (" + std::strerror(e) + ")" +
          (e == ENOENT ? ": it is not there for this process (every rank must see one checkpoint.dir: a shared "
                         "file system, not a node-local directory; or it was deleted while being read)"
                       : ": not read, so not known to be damaged; left as it is"));
    }
    ::close(fd);
  }
  try {
    // Every byte is verified against the seal before libhdf5 parses the file (it reads out of bounds on some
    // damaged files). A file without a seal that starts with the HDF5 signature was written before seals: it is
    // read as before (checksums of every dataset's values, after libhdf5 has parsed it), with a warning.
    const bool sealed = io::verify_seal(path, "checkpoint") == io::SealState::sealed;
    io::H5Reader r(path);  // UserError naming the path: missing, not HDF5, truncated
    return read_file(r, sealed, expected_identity);
  } catch (const CorruptCheckpoint&) {
    throw;
  } catch (const NotForThisRun& e) {
    throw UserError(e.what());
  } catch (const io::NewerSeal& e) {
    throw UserError(e.what());
  } catch (const UserError& e) {
    // The reader's own errors (cannot open, not HDF5, a dataset of the wrong kind, a failed read): damage.
    throw CorruptCheckpoint(e.what());
  } catch (const FatalError& e) {
    // A failing HDF5 call on a file that opened means a damaged file.
    throw CorruptCheckpoint(path + ": corrupt checkpoint (an HDF5 read failed: " + e.what() + ")");
  } catch (const std::exception& e) {
    // Damaged metadata can claim absurd sizes (a string of 2^60 bytes): std::length_error, std::bad_alloc.
    throw CorruptCheckpoint(path + ": corrupt checkpoint (or too large to read: " + e.what() + ")");
  }
}

int remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  const fs::path root = dir.empty() ? fs::path(".") : fs::path(dir);
  if (!fs::is_directory(root, ec)) return 0;
  fs::directory_iterator it(root, ec);
  if (ec) return 0;
  int removed = 0;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    // Our temporaries are "step_<digits>.h5.tmp.<pid>" (io::H5Writer).
    const std::string name = it->path().filename().string();
    const auto tmp = name.find(".h5.tmp.");
    if (tmp == std::string::npos || step_of_name(name.substr(0, tmp + 3)) < 0) continue;
    const std::string pid_text = name.substr(tmp + 8);
    if (pid_text.empty() || pid_text.size() > 9 ||
        pid_text.find_first_not_of("0123456789") != std::string::npos)
      continue;
    // A writer still running on this host (e.g. another job writing here) keeps its file.
    if (io::writer_may_be_running(std::stol(pid_text))) continue;
    std::error_code file_ec;
    if (!fs::is_regular_file(it->path(), file_ec)) continue;
    if (fs::remove(it->path(), file_ec)) {
      ++removed;
      log::info("removed " + join_path(dir, name) + ", the temporary file of an interrupted write");
    }
  }
  return removed;
}

std::string checkpoint_damage(const std::string& path) {
  try {
    read_checkpoint(path);
  } catch (const CorruptCheckpoint& e) {
    return e.what();
  } catch (const UserError&) {
    // not damage (a newer format): the file counts as a checkpoint
  }
  return "";
}

std::string set_aside_damaged(const std::string& path, std::string* why) {
  // An earlier damaged file of the same step keeps its name: the first free one of .damaged, .damaged.2, ...
  std::string target = path + ".damaged";
  std::error_code ec;
  for (int n = 2; fs::exists(fs::symlink_status(target, ec)); ++n) target = path + ".damaged." + std::to_string(n);
  fs::rename(path, target, ec);
  if (ec) {
    *why = ec.message();
    return "";
  }
  return target;
}

void prune_checkpoints(const std::string& dir, int keep_last, KnownCheckpoints& known) {
  if (keep_last <= 0) return;
  const auto found = list_checkpoints(dir);
  int kept = 0;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const std::string& path = it->second;
    if (known.damaged.count(path)) continue;  // a damaged file left in place: neither kept nor deleted
    if (kept < keep_last) {
      if (!known.intact.count(path)) {
        const std::string damage = checkpoint_damage(path);
        if (!damage.empty()) {
          std::string why;
          const std::string aside = set_aside_damaged(path, &why);
          if (aside.empty()) known.damaged.insert(path);
          log::warn_once(damage + (aside.empty() ? "; it cannot be set aside (" + why + "): left in place, not counted"
                                            : "; set aside as " + aside) +
                    " (pruning to the newest " + std::to_string(keep_last) + " intact checkpoints)");
          continue;
        }
        known.intact.insert(path);
      }
      ++kept;
      continue;
    }
    std::error_code ec;
    fs::remove(path, ec);
    if (ec) log::warn(path + ": cannot remove the old checkpoint (" + ec.message() + ")");
    known.intact.erase(path);
  }
}

void prune_checkpoints(const std::string& dir, int keep_last) {
  KnownCheckpoints none;
  prune_checkpoints(dir, keep_last, none);
}

std::string model_identity(const std::string& architecture, const std::vector<TensorEntry>& tensors) {
  std::string out = "architecture: " + architecture + "\n";
  for (const auto& t : tensors) out += t.name + " " + io::shape_str(t.shape) + "\n";
  return out;
}

}  // namespace mgrl::train
