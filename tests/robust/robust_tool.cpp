// robust_tool.cpp: makes the damaged inputs of the robust catalogue (tests/robust/cases.sh) from good ones.
//   robust_tool damage-dataset FILE.h5 DATASET        flips one byte in the middle of a dataset's stored values
//                                                     (located by the seal of a sealed file, else by H5Dget_offset)
//   robust_tool damage-seal FILE.h5 header|metadata   flips one byte of a sealed file's seal (in its user block) or
//                                                     of its HDF5 metadata (the superblock after the user block)
//   robust_tool nonfinite FILE.safetensors TENSOR nan|inf   sets element 0 of a tensor (F32/BF16/F16) in place
//   robust_tool negate FILE.safetensors TENSOR        flips the sign of every value of a tensor in place
//   robust_tool json-set FILE POINTER JSON            sets the value at a JSON pointer ("/a/b") of a JSON file
//   robust_tool json-del FILE POINTER                 removes the value at a JSON pointer
//   robust_tool shard MODEL_DIR OUT_DIR               model.safetensors split into two shards + the index
//   robust_tool drop-tensor IN OUT NAME               a safetensors file without one tensor
//   robust_tool checkpoint-nan IN.h5 OUT_DIR          the checkpoint with its first weight NaN, written properly
// Exit code 0 on success, 1 with a message otherwise.
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "io/hdf5_seal.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"

using namespace mgrl;
using json = nlohmann::json;

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "robust_tool: %s\n", msg.c_str());
  std::exit(1);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spill(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) die(path + ": cannot write");
}

int damage_dataset(const std::string& file, const std::string& dataset) {
  // Where the values lie: from the seal of a sealed file (io/hdf5_seal.h), else from HDF5 itself.
  std::uint64_t offset = 0, size = 0;
  const auto sealed = io::read_seal_entries(file);
  for (const auto& e : sealed)
    if (e.name == dataset) offset = e.offset, size = e.size;
  if (sealed.empty()) {
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) die(file + ": cannot open as HDF5");
    const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
    if (d < 0) die(file + ": no dataset " + dataset);
    const haddr_t at = H5Dget_offset(d);
    size = H5Dget_storage_size(d);
    H5Dclose(d);
    H5Fclose(f);
    if (at == HADDR_UNDEF) die(dataset + ": no contiguous storage");
    offset = at;
  }
  if (size == 0) die(file + ": no stored values of " + dataset);
  std::string bytes = slurp(file);
  const std::size_t at = static_cast<std::size_t>(offset + size / 2);
  if (at >= bytes.size()) die("offset beyond the file");
  bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
  spill(file, bytes);
  std::printf("flipped byte %zu of %s (dataset %s, %llu bytes at %llu)\n", at, file.c_str(), dataset.c_str(),
              static_cast<unsigned long long>(size), static_cast<unsigned long long>(offset));
  return 0;
}

int damage_seal(const std::string& file, const std::string& where) {
  std::string bytes = slurp(file);
  if (bytes.size() < 64 || bytes.compare(0, 16, "mgrl-sealed-hdf5") != 0) die(file + ": not a sealed file");
  std::uint64_t userblock = 0;  // byte 24 of the seal, little-endian
  for (int i = 7; i >= 0; --i) userblock = (userblock << 8) | static_cast<unsigned char>(bytes[24 + static_cast<std::size_t>(i)]);
  std::size_t at = 0;
  if (where == "header") at = 60;  // the first entry's name
  else if (where == "metadata") at = static_cast<std::size_t>(userblock) + 9;  // the superblock's version fields
  else die("damage-seal: header or metadata, not '" + where + "'");
  if (at >= bytes.size()) die("offset beyond the file");
  bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
  spill(file, bytes);
  return 0;
}

// Where a tensor's values lie in the bytes of a safetensors file: [*begin, *end), and its dtype.
std::string locate_tensor(const std::string& bytes, const std::string& file, const std::string& tensor,
                          std::size_t* begin, std::size_t* end) {
  if (bytes.size() < 8) die(file + ": too short");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  const json h = json::parse(bytes.substr(8, n));
  if (!h.contains(tensor)) die(file + ": no tensor " + tensor);
  *begin = 8 + n + h[tensor]["data_offsets"][0].get<std::size_t>();
  *end = 8 + n + h[tensor]["data_offsets"][1].get<std::size_t>();
  return h[tensor]["dtype"].get<std::string>();
}

int nonfinite(const std::string& file, const std::string& tensor, const std::string& kind) {
  std::string bytes = slurp(file);
  std::size_t at = 0, end = 0;
  const std::string dtype = locate_tensor(bytes, file, tensor, &at, &end);
  const bool nan = kind == "nan";
  if (dtype == "F32") {
    const float v = nan ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    std::memcpy(&bytes[at], &v, 4);
  } else if (dtype == "BF16" || dtype == "F16") {
    const std::uint16_t v = dtype == "BF16" ? (nan ? 0x7fc0 : 0x7f80) : (nan ? 0x7e00 : 0x7c00);
    std::memcpy(&bytes[at], &v, 2);
  } else {
    die("dtype " + dtype + " not handled");
  }
  spill(file, bytes);
  return 0;
}

// Flips the sign of every value of a float tensor in place (other weights of the same shapes).
int negate(const std::string& file, const std::string& tensor) {
  std::string bytes = slurp(file);
  std::size_t begin = 0, end = 0;
  const std::string dtype = locate_tensor(bytes, file, tensor, &begin, &end);
  const std::size_t size = dtype == "F32" ? 4 : (dtype == "BF16" || dtype == "F16") ? 2 : 0;
  if (size == 0) die("dtype " + dtype + " not handled");
  for (std::size_t at = begin + size - 1; at < end; at += size) bytes[at] = static_cast<char>(bytes[at] ^ 0x80);
  spill(file, bytes);
  return 0;
}

int json_edit(const std::string& file, const std::string& pointer, const std::string* value) {
  json j = json::parse(slurp(file));
  const json::json_pointer p(pointer);
  if (value) j[p] = json::parse(*value);
  else j.at(p.parent_pointer()).erase(p.back());
  spill(file, j.dump(2) + "\n");
  return 0;
}

int shard(const std::string& dir, const std::string& out) {
  io::SafetensorsFile f(dir + "/model.safetensors");
  const auto& all = f.tensors();
  std::vector<io::TensorToWrite> a, b;
  json map = json::object();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const bool first = i < all.size() / 2;
    (first ? a : b).push_back({all[i].name, all[i].dtype, all[i].shape, all[i].data});
    map[all[i].name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  io::write_safetensors(out + "/model-00001-of-00002.safetensors", a);
  io::write_safetensors(out + "/model-00002-of-00002.safetensors", b);
  spill(out + "/model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", map}}.dump(2) + "\n");
  return 0;
}

int drop_tensor(const std::string& in, const std::string& out, const std::string& name) {
  io::SafetensorsFile f(in);
  std::vector<io::TensorToWrite> keep;
  for (const auto& t : f.tensors())
    if (t.name != name) keep.push_back({t.name, t.dtype, t.shape, t.data});
  if (keep.size() == f.tensors().size()) die(in + ": no tensor " + name);
  io::write_safetensors(out, keep);
  return 0;
}

int checkpoint_nan(const std::string& in, const std::string& dir) {
  train::Checkpoint ck = train::read_checkpoint(in);
  if (ck.params.empty()) die(in + ": no weights");
  ck.params[0] = std::numeric_limits<float>::quiet_NaN();
  train::write_checkpoint(dir, ck);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "damage-dataset" && argc == 4) return damage_dataset(argv[2], argv[3]);
    if (cmd == "damage-seal" && argc == 4) return damage_seal(argv[2], argv[3]);
    if (cmd == "nonfinite" && argc == 5) return nonfinite(argv[2], argv[3], argv[4]);
    if (cmd == "json-set" && argc == 5) {
      const std::string v = argv[4];
      return json_edit(argv[2], argv[3], &v);
    }
    if (cmd == "json-del" && argc == 4) return json_edit(argv[2], argv[3], nullptr);
    if (cmd == "shard" && argc == 4) return shard(argv[2], argv[3]);
    if (cmd == "drop-tensor" && argc == 5) return drop_tensor(argv[2], argv[3], argv[4]);
    if (cmd == "negate" && argc == 4) return negate(argv[2], argv[3]);
    if (cmd == "checkpoint-nan" && argc == 4) return checkpoint_nan(argv[2], argv[3]);
  } catch (const std::exception& e) {
    die(e.what());
  }
  die("bad usage (see the head of tests/robust/robust_tool.cpp)");
}
