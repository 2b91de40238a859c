// fuzz_checkpoint.cpp: the checkpoint reader's own checks (train::read_checkpoint) on well-formed HDF5 files with
// fuzzed contents: the tensor order list, tensor shapes and values, checksum attributes (right, wrong, missing),
// the format attributes, the configuration, model identity and round state strings, the training state scalars.
// Byte-level damage of the HDF5 structure itself is libhdf5's parser, not ours (unit.checkpoint covers what
// reaches us from such damage: 200 random byte mutations, every 29th byte flipped); fuzzing it here would report
// libhdf5's bugs.
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "io/checksum.h"
#include "io/hdf5_file.h"
#include "train/checkpoint.h"

namespace {
// Reads the input front to back; past the end everything is 0 / empty.
struct Bytes {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  std::int64_t i64() {
    std::int64_t v = 0;
    for (int k = 0; k < 8; ++k) v = (v << 8) | u8();
    return v;
  }
  std::string str() {  // up to the next NUL
    std::string s;
    while (n && *p) s += static_cast<char>(u8());
    u8();
    return s;
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using mgrl::DType;
  Bytes in{data, size};
  const std::uint8_t flags = in.u8();
  const std::string order = in.str(), config = in.str(), identity = in.str(), extra = in.str();
  const std::string path = mgrl::fuzz::temp_dir() + "/step_00000001.h5";
  try {
    mgrl::io::H5Writer w(path);
    auto put = [&](const std::string& name, DType type, const std::vector<std::uint64_t>& dims, const void* v,
                   std::size_t nbytes) {
      w.write(name, type, dims, v);
      const std::uint8_t mode = in.u8() % 4;  // 0, 1: right checksum; 2: wrong; 3: none
      if (mode < 2) w.attr(name, "checksum", mgrl::io::checksum_hex(v, nbytes));
      if (mode == 2) w.attr(name, "checksum", in.str());
    };
    std::size_t start = 0;
    for (int t = 0; t < 8 && start <= order.size(); ++t) {  // at most 8 tensors
      const std::size_t end = std::min(order.find('\n', start), order.size());
      const std::string name = order.substr(start, end - start);
      start = end + 1;
      if (name.empty() || name.find_first_of("/.") != std::string::npos) continue;
      const std::vector<std::uint64_t> dims = {in.u8() % 5u, in.u8() % 5u};
      std::vector<float> v(dims[0] * dims[1]);
      for (auto& x : v) {
        std::uint32_t bits = 0;
        for (int k = 0; k < 4; ++k) bits = (bits << 8) | in.u8();
        std::memcpy(&x, &bits, 4);
      }
      for (const char* group : {"/trainable/", "/optimizer/exp_avg/", "/optimizer/exp_avg_sq/"})
        if (!(flags & 1) || in.u8() % 8) put(group + name, DType::F32, dims, v.data(), v.size() * 4);
    }
    auto put_text = [&](const std::string& name, const std::string& s) {
      w.write_string(name, s);
      const std::uint8_t mode = in.u8() % 4;
      if (mode < 2) w.attr(name, "checksum", mgrl::io::checksum_hex(s.data(), s.size()));
      if (mode == 2) w.attr(name, "checksum", in.str());
    };
    put_text("/trainable_order", order);
    put_text("/config", config);
    put_text("/model_identity", identity);
    if (flags & 4) put_text("/state/extra", extra);
    for (const char* name : {"/state/step", "/state/tokens_seen", "/state/skipped_steps", "/state/scaler_good_steps",
                             "/state/data/epoch", "/state/data/position"}) {
      const std::int64_t v = in.i64();
      if (!(flags & 8) || in.u8() % 8) put(name, DType::I64, {}, &v, sizeof v);
    }
    for (const char* name : {"/state/loss_scale", "/state/best_eval_loss"}) {
      const std::int64_t bits = in.i64();
      double v;
      std::memcpy(&v, &bits, 8);
      put(name, DType::F64, {}, &v, sizeof v);
    }
    const std::int64_t rng[2] = {in.i64(), in.i64()};
    const std::uint64_t n_rng = in.u8() % 3;
    put("/state/rng", DType::I64, {n_rng}, rng, n_rng * 8);
    w.attr("/", "format", (flags & 16) ? std::string("mgrl-checkpoint") : in.str());
    w.attr("/", "format_version", static_cast<std::int64_t>(in.u8() % 4));
    w.attr("/", "step", (flags & 32) ? std::int64_t{1} : in.i64());
    w.commit();
  } catch (...) {
    return 0;  // an input the writer cannot express as HDF5: not a reader test
  }
  mgrl::fuzz::refused_ok([&] { (void)mgrl::train::read_checkpoint(path, (flags & 64) ? identity : std::string()); });
  return 0;
}
