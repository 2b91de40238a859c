// test_checkpoint.cpp: training checkpoints (src/train/checkpoint.h): bit-exact round trips, the documented
// layout written by hand, finding the newest, pruning, every bad-file error, and that nothing on disk is damaged.
#include "train/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/build_info.h"
#include "core/error.h"
#include "io/checksum.h"
#include "io/hdf5_file.h"
#include "io/hdf5_seal.h"
#include "tests/unit/test_util.h"

namespace mgrl::train {
namespace {

namespace fs = std::filesystem;

// A fresh empty directory in GTest's temporary directory.
std::string fresh_dir(const std::string& name) {
  const std::string dir = test::temp_path("ck_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void touch(const std::string& path) { std::ofstream(path, std::ios::binary) << "x"; }

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const std::string kA = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
const std::string kB = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
const std::string kZ = "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight";

// Random finite bit patterns (denormals, -0, the largest float included): a round trip must keep every bit.
// (Non-finite values are refused on reading: NonFiniteValuesAreRefusedNamingTheTensor.)
std::vector<float> random_bits(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    do {
      const std::uint32_t bits = gen();
      std::memcpy(&x, &bits, sizeof x);
    } while (!std::isfinite(x));
  }
  if (n >= 4) {
    v[0] = -0.0f;
    v[1] = std::numeric_limits<float>::max();
    v[2] = std::numeric_limits<float>::denorm_min();
    v[3] = -std::numeric_limits<float>::denorm_min();
  }
  return v;
}

// A checkpoint of three tensors in a flat order that is not alphabetical (the layer-1 tensor first).
Checkpoint sample(std::int64_t step) {
  Checkpoint ck;
  ck.tensors = {{kZ, {2, 8}, 0}, {kA, {4, 60}, 16}, {kB, {60, 4}, 16 + 240}};
  const std::size_t n = 16 + 240 + 240;
  ck.params = random_bits(n, 1);
  ck.adam_m = random_bits(n, 2);
  ck.adam_v = random_bits(n, 3);
  auto& s = ck.state;
  s.step = step;
  s.tokens_seen = (std::int64_t{1} << 40) + 3;
  s.skipped_steps = 3;
  s.overflow_steps = 2;
  s.loss_scale = 1.0 / 3.0;
  s.scaler_good_steps = 17;
  s.best_eval_loss = std::numeric_limits<double>::infinity();
  s.cursor = {2, 12345};
  s.rank_rng = {0, 1, std::uint64_t{1} << 63, ~std::uint64_t{0}, ~std::uint64_t{0} - 1, 0x8000000000000001ull};
  ck.config_text = "mode = \"sft\"\n[model]\npath = \"/models/llama \\\"3\\\"\"  # comment 'quoted'\n\n"
                   "[train]\nlr = 1e-4\nname = \"caf\xc3\xa9 \xe2\x9c\x93\"\n";
  ck.model_identity = model_identity("LlamaForCausalLM", ck.tensors);
  return ck;
}

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what << " differ in some bit";
}

TEST(Checkpoint, PathHasEightDigits) {
  EXPECT_EQ(checkpoint_path("out/ck", 42), "out/ck/step_00000042.h5");
  EXPECT_EQ(checkpoint_path("out/ck/", 0), "out/ck/step_00000000.h5");
  EXPECT_EQ(checkpoint_path("d", 123456789), "d/step_123456789.h5");
}

TEST(Checkpoint, ModelIdentityText) {
  const std::vector<TensorEntry> t{{kA, {4, 60}, 0}, {kB, {60, 4}, 240}};
  EXPECT_EQ(model_identity("Qwen2ForCausalLM", t),
            "architecture: Qwen2ForCausalLM\n" + kA + " [4, 60]\n" + kB + " [60, 4]\n");
}

TEST(Checkpoint, RoundTripIsBitExact) {
  const std::string dir = test::temp_path("ck_round/nested/dirs");  // created by write_checkpoint
  fs::remove_all(test::temp_path("ck_round"));
  const Checkpoint ck = sample(42);
  write_checkpoint(dir, ck);
  const std::string path = dir + "/step_00000042.h5";
  ASSERT_TRUE(fs::exists(path));
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"step_00000042.h5"}) << "no temporary left behind";

  const Checkpoint r = read_checkpoint(path, ck.model_identity);
  ASSERT_EQ(r.tensors.size(), ck.tensors.size());
  for (std::size_t i = 0; i < ck.tensors.size(); ++i) {
    EXPECT_EQ(r.tensors[i].name, ck.tensors[i].name) << "flat order kept";
    EXPECT_EQ(r.tensors[i].shape, ck.tensors[i].shape);
    EXPECT_EQ(r.tensors[i].offset, ck.tensors[i].offset);
  }
  expect_bits_equal(r.params, ck.params, "params");
  expect_bits_equal(r.adam_m, ck.adam_m, "exp_avg");
  expect_bits_equal(r.adam_v, ck.adam_v, "exp_avg_sq");
  EXPECT_EQ(r.state.step, 42);
  EXPECT_EQ(r.state.tokens_seen, ck.state.tokens_seen);
  EXPECT_EQ(r.state.skipped_steps, 3);
  EXPECT_EQ(r.state.overflow_steps, 2);
  EXPECT_EQ(std::memcmp(&r.state.loss_scale, &ck.state.loss_scale, sizeof(double)), 0);
  EXPECT_EQ(r.state.scaler_good_steps, 17);
  EXPECT_TRUE(std::isinf(r.state.best_eval_loss) && r.state.best_eval_loss > 0);
  EXPECT_EQ(r.state.cursor.epoch, 2);
  EXPECT_EQ(r.state.cursor.position, 12345);
  EXPECT_EQ(r.state.rank_rng, ck.state.rank_rng);
  EXPECT_EQ(r.config_text, ck.config_text);
  EXPECT_EQ(r.model_identity, ck.model_identity);
  EXPECT_EQ(r.mgrl_version, build_info().version) << "an empty mgrl_version is written as this build's";
}

TEST(Checkpoint, FileHasTheDocumentedLayout) {
  const std::string dir = fresh_dir("layout");
  Checkpoint ck = sample(7);
  ck.mgrl_version = "9.9.9-test";
  write_checkpoint(dir, ck);
  // The seal in the user block lists every dataset with its values (docs/checkpoint.md#integrity).
  const auto entries = io::read_seal_entries(checkpoint_path(dir, 7));
  ASSERT_EQ(entries.size(), 9u + 13u);
  EXPECT_EQ(entries[0].name, "/trainable/" + kZ) << "in the order written";
  EXPECT_EQ(entries[0].size, 64u);
  EXPECT_EQ(read_bytes(checkpoint_path(dir, 7)).substr(entries[0].offset, 64),
            std::string(reinterpret_cast<const char*>(ck.params.data()), 64));
  EXPECT_EQ(entries.back().name, "/state/rng");
  io::H5Reader r(checkpoint_path(dir, 7));
  EXPECT_EQ(r.attr_string("/", "format"), "mgrl-checkpoint");
  EXPECT_EQ(r.attr_int("/", "format_version"), 2);
  // Every dataset carries the checksum of its values (16 hex digits).
  for (const std::string& name : {"/trainable/" + kA, "/optimizer/exp_avg/" + kB, "/optimizer/exp_avg_sq/" + kZ,
                                 std::string("/trainable_order"), std::string("/config"), std::string("/model_identity"),
                                 std::string("/state/step"), std::string("/state/rng"), std::string("/state/data/epoch"),
                                 std::string("/state/best_eval_loss")}) {
    ASSERT_TRUE(r.has_attr(name, "checksum")) << name;
    EXPECT_EQ(r.attr_string(name, "checksum").size(), 16u) << name;
  }
  EXPECT_EQ(r.attr_string("/", "mgrl_version"), "9.9.9-test");
  EXPECT_EQ(r.attr_int("/", "step"), 7);
  EXPECT_EQ(r.list("/"), (std::vector<std::string>{"config", "model_identity", "optimizer", "state", "trainable",
                                                   "trainable_order"}));
  EXPECT_EQ(r.list("/trainable"), (std::vector<std::string>{kA, kB, kZ}));
  EXPECT_EQ(r.list("/optimizer"), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(r.list("/optimizer/exp_avg_sq"), (std::vector<std::string>{kA, kB, kZ}));
  EXPECT_EQ(r.shape("/trainable/" + kA), (std::vector<std::uint64_t>{4, 60}));
  EXPECT_EQ(r.dtype("/trainable/" + kA), DType::F32);
  EXPECT_EQ(r.shape("/optimizer/exp_avg/" + kB), (std::vector<std::uint64_t>{60, 4}));
  EXPECT_EQ(r.read_string("/trainable_order"), kZ + "\n" + kA + "\n" + kB);
  EXPECT_EQ(r.list("/state"), (std::vector<std::string>{"best_eval_loss", "data", "loss_scale", "overflow_steps",
                                                        "rng", "scaler_good_steps", "skipped_steps", "step",
                                                        "tokens_seen"}));
  EXPECT_EQ(r.list("/state/data"), (std::vector<std::string>{"epoch", "position"}));
  EXPECT_EQ(r.dtype("/state/step"), DType::I64);
  EXPECT_TRUE(r.shape("/state/step").empty());
  EXPECT_EQ(r.dtype("/state/loss_scale"), DType::F64);
  EXPECT_EQ(r.dtype("/state/rng"), DType::I64);
  EXPECT_EQ(r.shape("/state/rng"), (std::vector<std::uint64_t>{6}));
  // uint64 counters stored bit for bit: 2^64 - 1 reads as int64 -1.
  EXPECT_EQ(r.read_all<std::int64_t>("/state/rng", DType::I64)[3], -1);
  EXPECT_EQ(r.read_string("/config"), ck.config_text);
  // The first tensor of the file's flat order holds the first 16 floats of params.
  const auto z = r.read_all<float>("/trainable/" + kZ, DType::F32);
  EXPECT_EQ(std::memcmp(z.data(), ck.params.data(), 16 * sizeof(float)), 0);
}

TEST(Checkpoint, EmptyRngFiniteLossAndNoTensors) {
  const std::string dir = fresh_dir("empty");
  Checkpoint ck;
  ck.state.step = 3;
  ck.state.best_eval_loss = 1.25;
  ck.model_identity = model_identity("LlamaForCausalLM", {});
  write_checkpoint(dir, ck);
  const Checkpoint r = read_checkpoint(checkpoint_path(dir, 3), ck.model_identity);
  EXPECT_TRUE(r.tensors.empty());
  EXPECT_TRUE(r.params.empty() && r.adam_m.empty() && r.adam_v.empty());
  EXPECT_TRUE(r.state.rank_rng.empty());
  EXPECT_EQ(r.state.best_eval_loss, 1.25);
  EXPECT_EQ(r.config_text, "");
}

TEST(Checkpoint, PaddedLayoutIsReadBackPacked) {
  // The writer accepts any in-bounds offsets; the reader returns the tensors packed in the same order.
  const std::string dir = fresh_dir("padded");
  Checkpoint ck;
  ck.state.step = 1;
  ck.tensors = {{kA, {2, 3}, 0}, {kB, {3, 2}, 8}};  // 2 floats of padding between them
  ck.params = {1, 2, 3, 4, 5, 6, -1, -1, 7, 8, 9, 10, 11, 12};
  ck.adam_m = ck.params;
  ck.adam_v = ck.params;
  write_checkpoint(dir, ck);
  const Checkpoint r = read_checkpoint(checkpoint_path(dir, 1));
  EXPECT_EQ(r.tensors[1].offset, 6u);
  EXPECT_EQ(r.params, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
}

TEST(Checkpoint, NewestIgnoresTemporariesAndOtherFiles) {
  const std::string dir = fresh_dir("newest");
  EXPECT_FALSE(newest_checkpoint(dir).has_value()) << "empty directory";
  EXPECT_FALSE(newest_checkpoint(dir + "/does/not/exist").has_value()) << "missing directory";
  for (const std::int64_t step : {5, 100, 20}) touch(checkpoint_path(dir, step));
  touch(checkpoint_path(dir, 300) + ".tmp.123");  // an interrupted writer's leftover
  touch(dir + "/step_1.h5");                       // not 8 digits
  touch(dir + "/step_00000400.h5.bak");
  touch(dir + "/notes.txt");
  fs::create_directories(checkpoint_path(dir, 500));  // a directory, not a file
  EXPECT_EQ(newest_checkpoint(dir), checkpoint_path(dir, 100));
  EXPECT_EQ(newest_checkpoint(dir + "/"), checkpoint_path(dir, 100));
  // Past 8 digits the number still orders the files.
  touch(checkpoint_path(dir, 123456789));
  EXPECT_EQ(newest_checkpoint(dir), checkpoint_path(dir, 123456789));
}

TEST(Checkpoint, PruneKeepsTheNewest) {
  const std::string dir = fresh_dir("prune");
  for (const std::int64_t step : {10, 50, 20, 40, 30}) write_checkpoint(dir, sample(step));
  const std::string tmp = checkpoint_path(dir, 60) + ".tmp.123";
  touch(tmp);
  touch(dir + "/notes.txt");
  prune_checkpoints(dir, 0);
  EXPECT_EQ(names_in(dir).size(), 7u) << "keep_last 0 keeps all";
  prune_checkpoints(dir, -1);
  EXPECT_EQ(names_in(dir).size(), 7u) << "keep_last < 0 keeps all";
  prune_checkpoints(dir, 9);
  EXPECT_EQ(names_in(dir).size(), 7u);
  prune_checkpoints(dir, 2);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"notes.txt", "step_00000040.h5", "step_00000050.h5",
                                                     "step_00000060.h5.tmp.123"}));
  prune_checkpoints(dir + "/missing", 2);  // nothing to do, no error
}

// Flips one byte in the middle of the stored values of the file's first dataset (as the seal lists them).
void damage(const std::string& path) {
  const auto entries = io::read_seal_entries(path);
  ASSERT_FALSE(entries.empty()) << path;
  std::string bytes = read_bytes(path);
  const std::size_t at = entries.front().offset + entries.front().size / 2;
  bytes[at] = static_cast<char>(bytes[at] ^ 0x5a);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(Checkpoint, PruneKeepsTheNewestIntactAndSetsDamagedAside) {
  // Issue 20: step 3 intact, step 5 damaged, keep_last 2 used to delete step 3 and keep step 5. A damaged checkpoint
  // does not count: it is set aside under a name that says so (never resumed from, never pruned), and the newest
  // keep_last intact ones are kept.
  const std::string dir = fresh_dir("prune_damaged");
  for (const std::int64_t step : {1, 2, 3, 4, 5, 6}) write_checkpoint(dir, sample(step));
  damage(checkpoint_path(dir, 5));
  damage(checkpoint_path(dir, 6));
  const std::string step3 = read_bytes(checkpoint_path(dir, 3));
  prune_checkpoints(dir, 2);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"step_00000003.h5", "step_00000004.h5", "step_00000005.h5.damaged",
                                                     "step_00000006.h5.damaged"}));
  EXPECT_TRUE(read_bytes(checkpoint_path(dir, 3)) == step3) << "the kept intact checkpoint is untouched";
  EXPECT_EQ(newest_checkpoint(dir), checkpoint_path(dir, 4)) << "a set-aside file is never a checkpoint again";
  EXPECT_FALSE(checkpoint_damage(checkpoint_path(dir, 5) + ".damaged").empty()) << "still the damaged file";
  // Another damaged step 5 later: the earlier set-aside file keeps its name.
  write_checkpoint(dir, sample(5));
  damage(checkpoint_path(dir, 5));
  prune_checkpoints(dir, 2);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"step_00000003.h5", "step_00000004.h5", "step_00000005.h5.damaged",
                                                     "step_00000005.h5.damaged.2", "step_00000006.h5.damaged"}));
  // What the writer knows: files known intact are not read again (a file it wrote is counted as such), and a damaged
  // file that could not be set aside is neither counted nor deleted.
  write_checkpoint(dir, sample(7));
  write_checkpoint(dir, sample(8));
  damage(checkpoint_path(dir, 7));
  KnownCheckpoints known;
  known.damaged.insert(checkpoint_path(dir, 7));
  known.intact.insert(checkpoint_path(dir, 8));
  prune_checkpoints(dir, 2, known);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"step_00000004.h5", "step_00000005.h5.damaged",
                                                     "step_00000005.h5.damaged.2", "step_00000006.h5.damaged",
                                                     "step_00000007.h5", "step_00000008.h5"}));
  EXPECT_EQ(known.intact, (std::set<std::string>{checkpoint_path(dir, 4), checkpoint_path(dir, 8)}))
      << "step 4 found intact and remembered, step 3 deleted and forgotten";
}

TEST(Checkpoint, SetAsideNamesTheFileAndSaysWhenItCannot) {
  const std::string dir = fresh_dir("set_aside");
  touch(checkpoint_path(dir, 2));
  std::string why;
  EXPECT_EQ(set_aside_damaged(checkpoint_path(dir, 2), &why), checkpoint_path(dir, 2) + ".damaged");
  EXPECT_EQ(set_aside_damaged(checkpoint_path(dir, 9), &why), "") << "no such file";
  EXPECT_NE(why.find("No such file"), std::string::npos) << why;
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"step_00000002.h5.damaged"});
}

// ---- errors: each a UserError whose message starts with the path ----

// The message of the UserError that reading path throws; fails the test on any other exception.
std::string read_error(const std::string& path, const std::string& identity = "") {
  try {
    read_checkpoint(path, identity);
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a UserError: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << path << " was read without error";
  return "";
}

// The message of the UserError that verifying the seal of path throws, "" when it verifies.
std::string seal_error(const std::string& path) {
  try {
    io::verify_seal(path, "checkpoint");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(path, msg, fragment)                                                     \
  do {                                                                                        \
    const std::string m_ = (msg);                                                             \
    EXPECT_TRUE(starts_with(m_, (path) + ": ")) << "does not start with the path: " << m_;    \
    EXPECT_NE(m_.find(fragment), std::string::npos) << m_;                                    \
  } while (0)

TEST(Checkpoint, TruncatedFilesAreUserErrors) {
  const std::string dir = fresh_dir("truncated");
  write_checkpoint(dir, sample(9));
  const std::string bytes = read_bytes(checkpoint_path(dir, 9));
  ASSERT_GT(bytes.size(), 4000u);
  for (const std::size_t len : {std::size_t{0}, std::size_t{7}, std::size_t{100}, std::size_t{700}, bytes.size() / 4,
                                bytes.size() / 2, bytes.size() - 100, bytes.size() - 1}) {
    const std::string cut = dir + "/cut_" + std::to_string(len) + ".h5";
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, len);
    // Found by the seal before libhdf5 sees the file: too short to hold the seal's magic, or shorter than the
    // seal says.
    const std::string msg = read_error(cut);
    EXPECT_ERROR(cut, msg, len < 16 ? "not an HDF5 file" : "truncated checkpoint: it has " + std::to_string(len) + " bytes");
    EXPECT_EQ(msg, seal_error(cut));
  }
}

// Everything a resumed run takes from a checkpoint, bit for bit ("" when equal, else what differs).
std::string difference(const Checkpoint& a, const Checkpoint& b) {
  const auto bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    // empty vectors (no synced reference) may hold null: memcmp of null is undefined even for 0 bytes (UBSan)
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  };
  if (!bits(a.params, b.params)) return "params";
  if (!bits(a.adam_m, b.adam_m)) return "exp_avg";
  if (!bits(a.adam_v, b.adam_v)) return "exp_avg_sq";
  if (!bits(a.reference_params, b.reference_params)) return "reference weights";
  if (a.tensors.size() != b.tensors.size()) return "tensor count";
  for (std::size_t i = 0; i < a.tensors.size(); ++i)
    if (a.tensors[i].name != b.tensors[i].name || a.tensors[i].shape != b.tensors[i].shape ||
        a.tensors[i].offset != b.tensors[i].offset)
      return "tensor " + a.tensors[i].name;
  const auto &s = a.state, &t = b.state;
  if (s.step != t.step || s.tokens_seen != t.tokens_seen || s.skipped_steps != t.skipped_steps ||
      s.overflow_steps != t.overflow_steps ||
      std::memcmp(&s.loss_scale, &t.loss_scale, sizeof(double)) != 0 || s.scaler_good_steps != t.scaler_good_steps ||
      std::memcmp(&s.best_eval_loss, &t.best_eval_loss, sizeof(double)) != 0 || s.cursor.epoch != t.cursor.epoch ||
      s.cursor.position != t.cursor.position || s.rank_rng != t.rank_rng)
    return "state";
  if (a.config_text != b.config_text) return "config";
  if (a.model_identity != b.model_identity) return "model identity";
  if (a.extra != b.extra) return "extra";
  return "";
}

// Where the bytes of a tensor's values lie in the file (found by their content: random bits are unique).
std::size_t offset_of(const std::string& file_bytes, const float* values, std::size_t n) {
  const std::string needle(reinterpret_cast<const char*>(values), n * sizeof(float));
  const auto at = file_bytes.find(needle);
  EXPECT_NE(at, std::string::npos) << "tensor bytes not found in the file";
  EXPECT_EQ(file_bytes.find(needle, at + 1), std::string::npos) << "tensor bytes found twice";
  return at;
}

TEST(Checkpoint, ChecksumIsStableAndSensitive) {
  // The values are part of the file format: a changed function would make every checkpoint look damaged.
  std::string bytes;
  for (int i = 0; i < 1000; ++i) bytes += static_cast<char>(i * 7 + 3);
  EXPECT_EQ(io::checksum_hex("", 0), "e76a9e4df2caf9c6");
  EXPECT_EQ(io::checksum_hex("abc", 3), "719817515d5d6b3d");
  EXPECT_EQ(io::checksum_hex(bytes.data(), bytes.size()), "7efbffc2c9d375c8");
  EXPECT_EQ(io::checksum_hex(bytes.data(), 999), "1b1ca4c8551047f8");
  // Every single-bit flip of 1000 bytes changes it, as does moving a byte (a swap) or zeroing a word.
  const std::uint64_t ref = io::checksum64(bytes.data(), bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i)
    for (int b = 0; b < 8; ++b) {
      std::string x = bytes;
      x[i] = static_cast<char>(x[i] ^ (1 << b));
      ASSERT_NE(io::checksum64(x.data(), x.size()), ref) << "byte " << i << " bit " << b;
    }
  std::string swapped = bytes;
  std::swap(swapped[10], swapped[500]);
  EXPECT_NE(io::checksum64(swapped.data(), swapped.size()), ref);
  std::string zeroed = bytes;
  std::fill(zeroed.begin() + 64, zeroed.begin() + 72, '\0');
  EXPECT_NE(io::checksum64(zeroed.data(), zeroed.size()), ref);
}

TEST(Checkpoint, DamagedTensorDataNameTheTensor) {
  // A byte in the middle of a tensor's values: HDF5 itself cannot notice; the checksum names the dataset.
  const std::string dir = fresh_dir("damaged_tensor");
  const Checkpoint ck = sample(9);
  write_checkpoint(dir, ck);
  const std::string good = read_bytes(checkpoint_path(dir, 9));
  struct Target {
    std::string dataset;
    const float* values;
    std::size_t n;
  };
  const std::vector<Target> targets{{"/trainable/" + kA, ck.params.data() + 16, 240},
                                    {"/optimizer/exp_avg/" + kB, ck.adam_m.data() + 256, 240},
                                    {"/optimizer/exp_avg_sq/" + kZ, ck.adam_v.data(), 16}};
  for (const auto& t : targets) {
    const std::size_t at = offset_of(good, t.values, t.n) + t.n * 2 + 1;  // the middle of the tensor's bytes
    for (const int flip : {0x01, 0x80, 0xff}) {
      std::string bytes = good;
      bytes[at] = static_cast<char>(bytes[at] ^ flip);
      const std::string bad = dir + "/step_00000009.h5";
      std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
      const std::string msg = test::error_of<CorruptCheckpoint>([&] { read_checkpoint(bad, ck.model_identity); });
      EXPECT_ERROR(bad, msg, "damaged checkpoint: the data of '" + t.dataset + "' do not match their checksum");
    }
  }
  // Zeroed blocks (a lost page) and a state scalar are caught the same way.
  std::string bytes = good;
  const std::size_t at = offset_of(good, ck.params.data(), 16);
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.begin() + static_cast<std::ptrdiff_t>(at + 64), '\0');
  const std::string bad = dir + "/zeroed.h5";
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_ERROR(bad, read_error(bad), "the data of '/trainable/" + kZ + "' do not match their checksum");
  bytes = good;
  const std::int64_t tokens = ck.state.tokens_seen;
  const auto pos = good.find(std::string(reinterpret_cast<const char*>(&tokens), 8));
  ASSERT_NE(pos, std::string::npos);
  bytes[pos] = static_cast<char>(bytes[pos] ^ 4);
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_ERROR(bad, read_error(bad), "the data of '/state/tokens_seen' do not match their checksum");
}

TEST(Checkpoint, FlippedBytesAreRefusedBeforeHdf5ParsesThem) {
  // A damaged byte anywhere in a checkpoint (the seal in the user block, HDF5's metadata, any dataset's values,
  // padding and free space too) is refused by the seal, that is before libhdf5 parses the file: the message is
  // the seal's own, and no byte reads back unnoticed.
  const std::string dir = fresh_dir("flipped");
  const Checkpoint ck = sample(9);
  write_checkpoint(dir, ck);
  const Checkpoint ref = read_checkpoint(checkpoint_path(dir, 9));
  ASSERT_EQ(difference(ref, ck), "");
  const std::string bytes = read_bytes(checkpoint_path(dir, 9));
  const std::string bad = dir + "/flipped.h5";
  int refused = 0;
  for (std::size_t pos = 0; pos < bytes.size(); pos += 29) {
    std::string b = bytes;
    b[pos] = static_cast<char>(b[pos] ^ 0x5a);
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << b;
    try {
      read_checkpoint(bad);
      ADD_FAILURE() << "byte " << pos << " flipped: read without error";
    } catch (const CorruptCheckpoint& e) {
      ++refused;
      EXPECT_TRUE(starts_with(e.what(), bad + ": ")) << "byte " << pos << ": " << e.what();
      EXPECT_EQ(e.what(), seal_error(bad)) << "byte " << pos << ": not refused by the seal";
    } catch (const std::exception& e) {
      ADD_FAILURE() << "byte " << pos << ": not a CorruptCheckpoint: " << e.what();
    }
  }
  EXPECT_EQ(refused, static_cast<int>((bytes.size() + 28) / 29));
  std::printf("%d of %zu flipped bytes refused by the seal\n", refused, (bytes.size() + 28) / 29);
}

// 200 random mutations (a random byte, a flipped bit, 16 zeroed bytes), each read in a child process so that a
// crash or a hang is a failure of its own: every one refused (CorruptCheckpoint naming the file, from the seal);
// never different data accepted.
TEST(Checkpoint, RandomMutationsNeverReadBackDifferentData) {
  const std::string dir = fresh_dir("mutations");
  Checkpoint ck = sample(12);
  ck.extra = "{\"round\": [1, 2, 3]}";
  write_checkpoint(dir, ck);
  const std::string bytes = read_bytes(checkpoint_path(dir, 12));
  std::mt19937_64 gen(20261122);
  int refused = 0, identical = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string b = bytes;
    const std::size_t pos = gen() % b.size();
    const int kind = trial % 3;
    if (kind == 0) {
      char c;
      do c = static_cast<char>(gen()); while (c == b[pos]);
      b[pos] = c;
    } else if (kind == 1) {
      b[pos] = static_cast<char>(b[pos] ^ (1 << (gen() % 8)));
    } else {
      bool changed = false;
      for (std::size_t i = pos; i < std::min(b.size(), pos + 16); ++i) {
        changed = changed || b[i] != '\0';
        b[i] = '\0';
      }
      if (!changed) b[pos] = 1;
    }
    const std::string bad = dir + "/step_00000012.h5";
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << b;
    std::fflush(nullptr);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::alarm(30);
      int code = 3;
      try {
        const Checkpoint got = read_checkpoint(bad, ck.model_identity);
        code = difference(got, ck).empty() ? 1 : 4;
      } catch (const CorruptCheckpoint& e) {
        code = !starts_with(e.what(), bad + ": ") ? 5 : (e.what() == seal_error(bad) ? 0 : 6);
      } catch (...) {
        code = 3;
      }
      ::_exit(code);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    const std::string what = "trial " + std::to_string(trial) + " (kind " + std::to_string(kind) + ", byte " +
                             std::to_string(pos) + ")";
    ASSERT_TRUE(WIFEXITED(status)) << what << ": the reader died of signal " << WTERMSIG(status);
    const int code = WEXITSTATUS(status);
    EXPECT_NE(code, 4) << what << ": different data read back without an error";
    EXPECT_NE(code, 3) << what << ": an error other than CorruptCheckpoint";
    EXPECT_NE(code, 5) << what << ": the message does not start with the path";
    EXPECT_NE(code, 6) << what << ": refused, but not by the seal";
    EXPECT_NE(code, 1) << what << ": read back without an error";
    if (code == 0) ++refused;
    if (code == 1) ++identical;
  }
  EXPECT_EQ(refused, 200);
  std::printf("200 random mutations: %d refused, %d read back identical, 0 different\n", refused, identical);
}

TEST(Checkpoint, NonFiniteValuesAreRefusedNamingTheTensor) {
  const std::string dir = fresh_dir("non_finite");
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    Checkpoint ck = sample(3);
    ck.adam_v[16 + 5] = bad;  // element 5 of kA's second moment
    write_checkpoint(dir, ck);  // written as given (with a valid checksum)
    const std::string path = checkpoint_path(dir, 3);
    const std::string msg = test::error_of<CorruptCheckpoint>([&] { read_checkpoint(path); });
    EXPECT_ERROR(path, msg, "tensor '/optimizer/exp_avg_sq/" + kA + "' holds a non-finite value (");
    EXPECT_NE(msg.find("at index 5)"), std::string::npos) << msg;
  }
}

TEST(Checkpoint, FileNameMustAgreeWithTheStepInside) {
  const std::string dir = fresh_dir("renamed");
  write_checkpoint(dir, sample(5));
  fs::copy_file(checkpoint_path(dir, 5), checkpoint_path(dir, 7));
  const std::string msg = test::error_of<CorruptCheckpoint>([&] { read_checkpoint(checkpoint_path(dir, 7)); });
  EXPECT_ERROR(checkpoint_path(dir, 7), msg, "the file name says step 7 but it holds step 5");
  // Any other name is not checked (a user's copy "best.h5").
  fs::copy_file(checkpoint_path(dir, 5), dir + "/best.h5");
  EXPECT_EQ(read_checkpoint(dir + "/best.h5").state.step, 5);
  EXPECT_EQ(checkpoints_newest_first(dir), (std::vector<std::string>{checkpoint_path(dir, 7), checkpoint_path(dir, 5)}));
}

TEST(Checkpoint, StaleTemporariesAreRemoved) {
  const std::string dir = fresh_dir("stale");
  write_checkpoint(dir, sample(1));
  // A pid that cannot be running (above pid_max), our own pid, and a live process (this one's parent).
  const std::string dead = checkpoint_path(dir, 2) + ".tmp.999999999";
  const std::string mine = checkpoint_path(dir, 3) + ".tmp." + std::to_string(::getpid());
  const std::string live = checkpoint_path(dir, 4) + ".tmp." + std::to_string(::getppid());
  for (const auto& p : {dead, mine, live}) touch(p);
  touch(dir + "/notes.tmp.1");       // not ours
  touch(dir + "/step_00000005.h5.tmp.x");  // not a pid
  EXPECT_EQ(remove_stale_temporaries(dir), 1);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(mine) && fs::exists(live));
  EXPECT_TRUE(fs::exists(dir + "/notes.tmp.1") && fs::exists(dir + "/step_00000005.h5.tmp.x"));
  EXPECT_EQ(remove_stale_temporaries(dir + "/missing"), 0);
  // A checkpoint write removes them too.
  touch(dead);
  write_checkpoint(dir, sample(6));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_EQ(read_checkpoint(checkpoint_path(dir, 1)).state.step, 1) << "checkpoints untouched";
}

TEST(Checkpoint, MissingAndGarbageFilesAreUserErrors) {
  const std::string dir = fresh_dir("garbage");
  const std::string missing = dir + "/step_00000001.h5";
  EXPECT_ERROR(missing, read_error(missing), "cannot open");
  const std::string garbage = dir + "/garbage.h5";
  std::string junk(4096, '\0');
  std::mt19937 gen(11);
  for (auto& c : junk) c = static_cast<char>(gen());
  std::ofstream(garbage, std::ios::binary) << junk;
  EXPECT_ERROR(garbage, read_error(garbage), "not an HDF5 file");
}

TEST(Checkpoint, AnotherHdf5FileIsNotACheckpoint) {
  const std::string dir = fresh_dir("other");
  const std::string plain = dir + "/plain.h5";
  {
    io::H5Writer w(plain);
    const float x = 1;
    w.write("x", DType::F32, {1}, &x);
    w.commit();
  }
  EXPECT_ERROR(plain, read_error(plain), "not an mgrl checkpoint");
  const std::string rollouts = dir + "/rollouts.h5";
  {
    io::H5Writer w(rollouts);
    const float x = 1;
    w.write("x", DType::F32, {1}, &x);
    w.attr("/", "format", "mgrl-rollouts");
    w.commit();
  }
  EXPECT_ERROR(rollouts, read_error(rollouts), "not an mgrl checkpoint (format 'mgrl-rollouts')");
}

// What to change when writing a checkpoint by hand from docs/checkpoint.md.
struct HandWritten {
  std::string skip;             // a dataset not to write
  std::int64_t format_version = 1;
  bool bad_moment_shape = false;
  bool extra_tensor = false;
  bool checksums = false;       // a checksum attribute on every dataset, as format version 2 has
};

// Writes the documented layout with H5Writer directly (two tensors kA [4, 6] and kB [6, 4]), without a seal, as
// mgrl wrote checkpoints before seals.
std::string write_by_hand(const std::string& path, const HandWritten& h) {
  io::H5Writer w(path);
  const std::vector<float> data(24, 0.5f);
  const auto sum = [&](const std::string& name, const void* values, std::size_t nbytes) {
    if (h.checksums) w.attr(name, "checksum", io::checksum_hex(values, nbytes));
  };
  const auto put = [&](const std::string& name, const std::vector<std::uint64_t>& shape) {
    if (name == h.skip) return;
    w.write(name, DType::F32, shape, data.data());
    sum(name, data.data(), shape[0] * shape[1] * sizeof(float));
  };
  for (const std::string group : {"/trainable/", "/optimizer/exp_avg/", "/optimizer/exp_avg_sq/"}) {
    put(group + kA, {4, 6});
    put(group + kB, (h.bad_moment_shape && group == "/optimizer/exp_avg/") ? std::vector<std::uint64_t>{4, 6}
                                                                             : std::vector<std::uint64_t>{6, 4});
  }
  if (h.extra_tensor) put("/trainable/" + kZ, {2, 2});
  const auto put_text = [&](const std::string& name, const std::string& text) {
    w.write_string(name, text);
    sum(name, text.data(), text.size());
  };
  put_text("/trainable_order", kA + "\n" + kB + "\n");
  put_text("/config", "mode = \"sft\"\n");
  put_text("/model_identity", "architecture: LlamaForCausalLM\n" + kA + " [4, 6]\n" + kB + " [6, 4]\n");
  const std::int64_t step = 5, zero = 0;
  const double one = 1.0, inf = std::numeric_limits<double>::infinity();
  const std::vector<std::int64_t> rng{1, -1};
  const auto put_value = [&](const std::string& name, DType type, const std::vector<std::uint64_t>& shape,
                             const void* values, std::size_t nbytes) {
    if (name == h.skip) return;
    w.write(name, type, shape, values);
    sum(name, values, nbytes);
  };
  for (const std::string name : {"/state/tokens_seen", "/state/skipped_steps", "/state/scaler_good_steps",
                                 "/state/data/epoch", "/state/data/position"})
    put_value(name, DType::I64, {}, &zero, 8);
  put_value("/state/step", DType::I64, {}, &step, 8);
  put_value("/state/loss_scale", DType::F64, {}, &one, 8);
  put_value("/state/best_eval_loss", DType::F64, {}, &inf, 8);
  put_value("/state/rng", DType::I64, {2}, rng.data(), 16);
  w.attr("/", "format", "mgrl-checkpoint");
  w.attr("/", "format_version", h.format_version);
  w.attr("/", "mgrl_version", "0.1.0");
  w.attr("/", "step", step);
  w.commit();
  return path;
}

TEST(Checkpoint, HandWrittenLayoutReads) {
  const std::string dir = fresh_dir("by_hand");
  const std::string path = write_by_hand(dir + "/good.h5", {});
  const Checkpoint ck = read_checkpoint(path);
  ASSERT_EQ(ck.tensors.size(), 2u);
  EXPECT_EQ(ck.tensors[0].name, kA);
  EXPECT_EQ(ck.tensors[1].offset, 24u);
  EXPECT_EQ(ck.params.size(), 48u);
  EXPECT_EQ(ck.state.step, 5);
  EXPECT_EQ(ck.state.overflow_steps, 0) << "files from before the loss scaler counted overflows have none: 0";
  EXPECT_EQ(ck.state.rank_rng, (std::vector<std::uint64_t>{1, ~std::uint64_t{0}}));
  EXPECT_EQ(ck.mgrl_version, "0.1.0");
}

TEST(Checkpoint, MissingOrInconsistentDatasetsAreUserErrors) {
  const std::string dir = fresh_dir("broken");
  std::string p = write_by_hand(dir + "/no_moment.h5", {"/optimizer/exp_avg_sq/" + kB});
  EXPECT_ERROR(p, read_error(p), "incomplete checkpoint: no dataset '/optimizer/exp_avg_sq/" + kB + "'");
  p = write_by_hand(dir + "/no_param.h5", {"/trainable/" + kA});
  EXPECT_ERROR(p, read_error(p), "no dataset '/trainable/" + kA + "'");
  p = write_by_hand(dir + "/no_rng.h5", {"/state/rng"});
  EXPECT_ERROR(p, read_error(p), "no dataset '/state/rng'");
  p = write_by_hand(dir + "/no_epoch.h5", {"/state/data/epoch"});
  EXPECT_ERROR(p, read_error(p), "no dataset '/state/data/epoch'");
  HandWritten bad_shape;
  bad_shape.bad_moment_shape = true;
  p = write_by_hand(dir + "/bad_shape.h5", bad_shape);
  EXPECT_ERROR(p, read_error(p), "'/optimizer/exp_avg/" + kB + "' has shape [4, 6] but");
  HandWritten extra;
  extra.extra_tensor = true;
  p = write_by_hand(dir + "/extra.h5", extra);
  EXPECT_ERROR(p, read_error(p), "'/trainable/" + kZ + "' is not listed in /trainable_order");
}

TEST(Checkpoint, Version1FilesWithoutChecksumsStillRead) {
  // Checkpoints of mgrl before checksums (format version 1) are read, with a warning, unverified.
  const std::string dir = fresh_dir("v1");
  const Checkpoint ck = read_checkpoint(write_by_hand(dir + "/old.h5", {}));
  EXPECT_EQ(ck.state.step, 5);
  // Version 2 requires a checksum on every dataset.
  HandWritten h;
  h.format_version = 2;
  const std::string p = write_by_hand(dir + "/v2_without.h5", h);
  EXPECT_ERROR(p, test::error_of<CorruptCheckpoint>([&] { read_checkpoint(p); }), "has no checksum");
}

TEST(Checkpoint, UnsealedCheckpointsOfEarlierMgrlStillRead) {
  // A checkpoint written before seals (format version 2, checksums on every dataset, no user block) is read with
  // one warning: libhdf5 parses it before anything can be verified. Its datasets' checksums are still verified.
  const std::string dir = fresh_dir("unsealed");
  HandWritten h;
  h.format_version = 2;
  h.checksums = true;
  const std::string path = write_by_hand(dir + "/step_00000005.h5", h);
  ASSERT_EQ(io::verify_seal(path, "checkpoint"), io::SealState::unsealed_hdf5);
  testing::internal::CaptureStderr();
  const Checkpoint ck = read_checkpoint(path);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(ck.state.step, 5);
  EXPECT_EQ(ck.params, std::vector<float>(48, 0.5f));
  EXPECT_EQ(err, "mgrl: warning: " + path + ": a checkpoint without whole-file checksums (mgrl 0.1.0, before "
                 "checkpoints were sealed): HDF5 has parsed it before its data could be verified\n");
  // Damaged values are found by the datasets' checksums, naming the dataset, as before.
  std::string bytes = read_bytes(path);
  const std::vector<float> values(24, 0.5f);
  const std::string needle(reinterpret_cast<const char*>(values.data()), 96);
  const auto at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 50] = static_cast<char>(bytes[at + 50] ^ 0x40);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  testing::internal::CaptureStderr();
  const std::string msg = test::error_of<CorruptCheckpoint>([&] { read_checkpoint(path); });
  testing::internal::GetCapturedStderr();
  EXPECT_ERROR(path, msg, "damaged checkpoint: the data of '/trainable/" + kA + "' do not match their checksum");
}

TEST(Checkpoint, NewerSealIsNotDamage) {
  // A seal of a format this mgrl does not know (a newer mgrl wrote it): exit 2, and resume does not pass over it.
  const std::string dir = fresh_dir("newer_seal");
  write_checkpoint(dir, sample(4));
  const std::string path = checkpoint_path(dir, 4);
  std::string b = read_bytes(path);
  std::size_t ub = 0;  // the user block's size, at byte 24 of the seal
  for (int i = 7; i >= 0; --i) ub = (ub << 8) | static_cast<unsigned char>(b[24 + static_cast<std::size_t>(i)]);
  ASSERT_TRUE(ub >= 512 && ub <= b.size()) << ub;
  b[16] = 7;
  std::memset(&b[48], 0, 8);
  const std::uint64_t sum = io::checksum64(b.data(), ub);
  for (int i = 0; i < 8; ++i) b[48 + i] = static_cast<char>(sum >> (8 * i));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
  EXPECT_ERROR(path, read_error(path), "its integrity header has format version 7 (written by a newer mgrl)");
  bool damage = false;
  try {
    read_checkpoint(path);
  } catch (const CorruptCheckpoint&) {
    damage = true;
  } catch (const UserError&) {
  }
  EXPECT_FALSE(damage);
}

TEST(Checkpoint, ManyTensorsGetALargerUserBlock) {
  // 3 datasets a tensor, each listed in the seal with its name: 400 tensors need 128 KiB.
  const std::string dir = fresh_dir("many");
  Checkpoint ck;
  ck.state.step = 2;
  for (int i = 0; i < 400; ++i)
    ck.tensors.push_back({"base_model.model.model.layers." + std::to_string(i / 14) + ".mlp.proj_" +
                              std::to_string(i % 14) + ".lora_A.weight",
                          {2, 3}, static_cast<std::size_t>(i) * 6});
  for (auto* v : {&ck.params, &ck.adam_m, &ck.adam_v}) *v = random_bits(2400, 7);
  ck.model_identity = model_identity("LlamaForCausalLM", ck.tensors);
  write_checkpoint(dir, ck);
  const std::string bytes = read_bytes(checkpoint_path(dir, 2));
  EXPECT_EQ(bytes.substr(0, 16), "mgrl-sealed-hdf5");
  std::uint64_t ub = 0;
  for (int i = 7; i >= 0; --i) ub = (ub << 8) | static_cast<unsigned char>(bytes[24 + static_cast<std::size_t>(i)]);
  EXPECT_EQ(ub, 131072u);
  EXPECT_EQ(io::read_seal_entries(checkpoint_path(dir, 2)).size(), 1200u + 12u) << "/state/rng is empty: no values";
  EXPECT_EQ(difference(read_checkpoint(checkpoint_path(dir, 2), ck.model_identity), ck), "");
}

TEST(Checkpoint, TheSealFitsWithEveryOptionalDataset) {
  // The user block is sized by the names of the datasets written: until 2026-11-29 the optional ones (the base and
  // data fingerprints, numerics, log position, LoRA config, overflow count) were left out of the sum, so a checkpoint
  // whose other names brought the sum just under a power of two failed to seal ("the seal does not fit"). Every name
  // length across the 1 KiB boundary, each optional dataset present.
  const std::string dir = fresh_dir("seal_fits");
  for (int len = 1; len <= 200; ++len) {
    Checkpoint ck;
    ck.state.step = len;
    ck.tensors = {{std::string(static_cast<std::size_t>(len), 'w'), {2, 3}, 0}};
    for (auto* v : {&ck.params, &ck.adam_m, &ck.adam_v}) *v = random_bits(6, 9);
    ck.state.rank_rng = {1, 2};
    ck.model_identity = model_identity("LlamaForCausalLM", ck.tensors);
    ck.config_text = "mode = \"dpo\"\n";
    ck.base_fingerprint = "model.embed_tokens.weight 0123456789abcdef\n";
    ck.numerics = "cpu, 2 threads, OpenBLAS";
    ck.data = "123 bytes, checksum 0123456789abcdef";
    ck.log_position = "12 /tmp/metrics.jsonl";
    ck.lora_config = "{\"r\": 4}";
    ck.reference = "base";
    ck.reference_params = random_bits(6, 10);  // a synced reference's weights (sync_ref_model)
    ck.extra = "{}";
    ASSERT_NO_THROW(write_checkpoint(dir, ck)) << "a tensor name of " << len << " characters";
    const Checkpoint r = read_checkpoint(checkpoint_path(dir, len), ck.model_identity);
    EXPECT_EQ(difference(r, ck), "") << len;
    EXPECT_EQ(r.reference, "base") << len;
    EXPECT_EQ(r.lora_config, ck.lora_config) << len;
  }
}

TEST(Checkpoint, SyncedReferenceWeightsRoundTripAndAreVerified) {
  // TR-DPO (sync_ref_model): the reference's weights move with training, a fourth copy of the trainable layout
  // (/reference_weights/<name>), read back bit for bit; absent from other checkpoints; a damaged byte of them names
  // the dataset; a size other than the weights' is a programming error.
  const std::string dir = fresh_dir("synced_reference");
  Checkpoint ck = sample(7);
  ck.reference_params = random_bits(ck.params.size(), 4);
  write_checkpoint(dir, ck);
  const Checkpoint r = read_checkpoint(checkpoint_path(dir, 7), ck.model_identity);
  expect_bits_equal(r.reference_params, ck.reference_params, "reference weights");
  EXPECT_EQ(difference(r, ck), "");
  write_checkpoint(dir, sample(8));
  EXPECT_TRUE(read_checkpoint(checkpoint_path(dir, 8), ck.model_identity).reference_params.empty());
  const std::string good = read_bytes(checkpoint_path(dir, 7));
  const std::size_t at = offset_of(good, ck.reference_params.data() + 16, 240) + 241;
  std::string bytes = good;
  bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
  const std::string bad = dir + "/step_00000007.h5";
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_ERROR(bad, read_error(bad), "the data of '/reference_weights/" + kA + "' do not match their checksum");
  Checkpoint wrong = sample(9);
  wrong.reference_params = random_bits(5, 4);
  EXPECT_THROW(write_checkpoint(dir, wrong), FatalError);
}

TEST(Checkpoint, FormatVersionFromTheFuture) {
  const std::string dir = fresh_dir("future");
  HandWritten h;
  h.format_version = 3;
  const std::string p = write_by_hand(dir + "/future.h5", h);
  EXPECT_ERROR(p, read_error(p), "checkpoint format version 3 (written by mgrl 0.1.0) is newer than version 2, the one this mgrl");
  bool damage = false;
  try {
    read_checkpoint(p);
  } catch (const CorruptCheckpoint&) {
    damage = true;
  } catch (const UserError&) {
  }
  EXPECT_FALSE(damage) << "not damage: resume does not pass over it to an older checkpoint";
}

TEST(Checkpoint, AnotherModelNamesTheFirstDifference) {
  const std::string dir = fresh_dir("identity");
  const Checkpoint ck = sample(4);
  write_checkpoint(dir, ck);
  const std::string path = checkpoint_path(dir, 4);
  auto other = ck.tensors;
  other[2].shape = {60, 8};
  EXPECT_ERROR(path, read_error(path, model_identity("LlamaForCausalLM", other)),
               "checkpoint of another model: it has '" + kB + " [60, 4]' where this run has '" + kB + " [60, 8]'");
  EXPECT_ERROR(path, read_error(path, model_identity("Qwen2ForCausalLM", ck.tensors)),
               "checkpoint of another model: it has 'architecture: LlamaForCausalLM' where this run has "
               "'architecture: Qwen2ForCausalLM'");
  other = ck.tensors;
  other.pop_back();
  EXPECT_ERROR(path, read_error(path, model_identity("LlamaForCausalLM", other)),
               "it has '" + kB + " [60, 4]' where this run has nothing more");
  other = ck.tensors;
  other.push_back({"extra.lora_A.weight", {1, 1}, 0});
  EXPECT_ERROR(path, read_error(path, model_identity("LlamaForCausalLM", other)),
               "it has nothing more where this run has 'extra.lora_A.weight [1, 1]'");
  EXPECT_NO_THROW(read_checkpoint(path, ck.model_identity));
  EXPECT_NO_THROW(read_checkpoint(path)) << "no expected identity: no check";
}

// ---- nothing already on disk is damaged ----

TEST(Checkpoint, UnwritableDirectoryIsAUserErrorAndKeepsTheOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  const std::string dir = fresh_dir("readonly");
  write_checkpoint(dir, sample(1));
  ASSERT_EQ(::chmod(dir.c_str(), 0500), 0);
  const std::string msg = test::error_of([&] { write_checkpoint(dir, sample(2)); });
  ::chmod(dir.c_str(), 0700);
  EXPECT_ERROR(checkpoint_path(dir, 2), msg, "cannot create");
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"step_00000001.h5"});
  EXPECT_EQ(read_checkpoint(checkpoint_path(dir, 1)).state.step, 1);
}

TEST(Checkpoint, DiskFullIsAUserErrorAndKeepsTheOldFiles) {
  // A disk that fills up while a checkpoint is written: a child process whose file size is limited (RLIMIT_FSIZE,
  // with SIGXFSZ ignored, so writes fail with EFBIG as they would with ENOSPC) writes a checkpoint larger than the
  // limit. It must fail with a UserError naming the file, leave no temporary, and keep the older checkpoint.
  // (The child ends with _exit, before libhdf5 shuts down: that part is Hdf5File.FullDiskIsAnError... in
  // test_hdf5_file.cpp, on a real full tmpfs; under RLIMIT_FSIZE even the memory file that takes a failed file's
  // close is limited.)
  const std::string dir = fresh_dir("disk_full");
  write_checkpoint(dir, sample(1));
  const std::string before = read_bytes(checkpoint_path(dir, 1));
  Checkpoint big = sample(2);
  for (auto* v : {&big.params, &big.adam_m, &big.adam_v}) v->resize(v->size() + 200000, 0.25f);
  big.tensors.push_back({"base_model.model.model.layers.2.mlp.up_proj.lora_A.weight", {1000, 200}, 496});
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const struct rlimit lim {256 * 1024, 256 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    const std::string msg = test::error_of([&] { write_checkpoint(dir, big); });
    const bool named = starts_with(msg, checkpoint_path(dir, 2) + ": cannot write the checkpoint");
    ::_exit(named ? 0 : (msg.empty() ? 11 : 12));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "11: the write succeeded; 12: another message";
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"step_00000001.h5"}) << "no temporary, no partial step 2";
  EXPECT_EQ(read_bytes(checkpoint_path(dir, 1)), before);
}

TEST(Checkpoint, DirectoryThatCannotBeCreatedIsAUserError) {
  const std::string dir = fresh_dir("not_a_dir");
  touch(dir + "/file");
  const std::string msg = test::error_of([&] { write_checkpoint(dir + "/file/sub", sample(1)); });
  EXPECT_ERROR(dir + "/file/sub", msg, "cannot create the checkpoint directory");
}

TEST(Checkpoint, InterruptedWriterLeavesNoCheckpoint) {
  const std::string dir = fresh_dir("interrupted");
  write_checkpoint(dir, sample(1));
  {
    io::H5Writer w(checkpoint_path(dir, 2));
    const float x = 1;
    w.write("/trainable/x", DType::F32, {1}, &x);
    EXPECT_EQ(newest_checkpoint(dir), checkpoint_path(dir, 1)) << "the temporary is not a checkpoint";
  }  // destroyed without commit, as when an exception unwinds the writer
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"step_00000001.h5"});
  EXPECT_EQ(newest_checkpoint(dir), checkpoint_path(dir, 1));
  // Rewriting an existing step replaces it whole.
  Checkpoint again = sample(1);
  again.state.tokens_seen = 99;
  write_checkpoint(dir, again);
  EXPECT_EQ(read_checkpoint(checkpoint_path(dir, 1)).state.tokens_seen, 99);
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"step_00000001.h5"});
}

}  // namespace
}  // namespace mgrl::train
