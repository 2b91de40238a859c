// safetensors.cpp: the safetensors reader (mmap + header checks), model directories, conversions, writer.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/jsonl.h"

namespace mgrl::io {

using json = nlohmann::json;

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (const std::int64_t d : s) n *= d;
  return n;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

bool parse_safetensors_dtype(const std::string& name, DType* out) {
  static const std::pair<const char*, DType> table[] = {{"F32", DType::F32}, {"F16", DType::F16},
                                                        {"BF16", DType::BF16}, {"F64", DType::F64},
                                                        {"I32", DType::I32}, {"I64", DType::I64},
                                                        {"U8", DType::U8}};
  for (const auto& [n, t] : table) {
    if (name == n) {
      *out = t;
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------------------------------------------------
// Scalar conversions

namespace {

std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf, NaN (payload kept)
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);  // +-0
  // Subnormal: value = mant * 2^-24. Shift the leading one up to bit 10 and lower the exponent to match.
  std::uint32_t e = 113;  // the biased fp32 exponent of 2^-14
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return bits_float(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

float bf16_to_float(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }

std::uint16_t float_to_half(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;  // NaN -> quiet NaN
  const int e = static_cast<int>(ax >> 23) - 127;
  const std::uint32_t mant = ax & 0x7fffffu;
  if (e > 15) return sign | 0x7c00u;  // inf, or too large: inf
  if (e >= -14) {                     // a normal half (or rounds up to inf: the carry runs into the exponent)
    std::uint32_t h = (static_cast<std::uint32_t>(e + 15) << 10) | (mant >> 13);
    const std::uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  if (e < -25) return sign;  // below half the smallest subnormal: +-0
  // Subnormal: h = value / 2^-24 = (1.mant * 2^23) >> shift, rounded to nearest even.
  const std::uint32_t m = mant | 0x800000u;
  const int shift = -e - 1;  // 14 (e = -15) .. 24 (e = -25)
  std::uint32_t h = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;  // h = 0x400 is the smallest normal: still right
  return static_cast<std::uint16_t>(sign | h);
}

std::uint16_t float_to_bf16(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

void copy_to_f32(const TensorInfo& t, float* out) {
  if (!dtype_is_float(t.dtype)) {
    throw UserError(t.file + ": tensor '" + t.name + "' has dtype " + safetensors_dtype_name(t.dtype) +
                    ", not a floating-point type");
  }
  const std::size_t n = static_cast<std::size_t>(t.numel());
  if (n == 0) return;
  const std::byte* p = t.data;
  switch (t.dtype) {
    case DType::F32: std::memcpy(out, p, n * 4); return;
    case DType::BF16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        out[i] = bf16_to_float(v);
      }
      return;
    case DType::F16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        out[i] = half_to_float(v);
      }
      return;
    case DType::F64:
      for (std::size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, p + 8 * i, 8);
        out[i] = static_cast<float>(v);
      }
      return;
    case DType::I32:
    case DType::I64:
    case DType::U8: break;  // refused above
  }
}

std::vector<float> to_f32(const TensorInfo& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  copy_to_f32(t, out.data());
  return out;
}

void copy_finite_to_f32(const TensorInfo& t, float* out) {
  copy_to_f32(t, out);
  const std::size_t n = static_cast<std::size_t>(t.numel());
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(out[i])) {
      throw UserError(t.file + ": tensor '" + t.name + "' holds a non-finite value (" +
                      (std::isnan(out[i]) ? "nan" : (out[i] > 0 ? "inf" : "-inf")) + " at index " + std::to_string(i) +
                      ")");
    }
  }
}

void check_shape(const TensorInfo& t, const Shape& expected, const std::string& where) {
  if (t.shape != expected) {
    throw UserError(where + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) + ", expected " +
                    shape_str(expected));
  }
}

// ---------------------------------------------------------------------------------------------------------
// SafetensorsFile

namespace {

// A non-negative JSON integer that fits std::uint64_t.
bool get_u64(const json& v, std::uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<std::uint64_t>();
  return true;
}

struct Entry {
  TensorInfo info;
  std::uint64_t begin = 0, end = 0;
};

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO: no wait, refused below
  if (fd < 0) throw UserError(path + ": cannot open the safetensors file (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError(path + ": not a regular file");
  }
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw UserError(path + ": not a safetensors file: " + std::to_string(size) +
                    " bytes, shorter than the 8-byte header length");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) throw UserError(path + ": cannot map the file (" + std::strerror(map_errno) + ")");
  map_ = map;
  map_size_ = size;

  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
    if (n > size - 8) {
      throw UserError(path + ": header length " + std::to_string(n) + " exceeds the file size (" +
                      std::to_string(size) + " bytes): not a safetensors file, or a truncated one");
    }
    const char* header = reinterpret_cast<const char*>(bytes + 8);
    json h;
    try {
      h = json::parse(header, header + n);
    } catch (const json::exception& e) {
      throw UserError(path + ": invalid JSON header: " + json_error_text(e));
    }
    if (!h.is_object()) throw UserError(path + ": the JSON header is not an object");

    const std::byte* data = reinterpret_cast<const std::byte*>(bytes + 8 + n);
    const std::uint64_t data_size = size - 8 - n;
    std::vector<Entry> entries;
    entries.reserve(h.size());
    for (const auto& [name, v] : h.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) throw UserError(path + ": \"__metadata__\" is not an object of strings");
        for (const auto& [k, s] : v.items()) {
          if (!s.is_string()) throw UserError(path + ": \"__metadata__\" value of '" + k + "' is not a string");
          metadata_[k] = s.get<std::string>();
        }
        continue;
      }
      const std::string where = path + ": tensor '" + name + "': ";
      if (!v.is_object()) throw UserError(where + "the entry is not an object");
      Entry e;
      e.info.name = name;
      e.info.file = path;
      const auto dt = v.find("dtype");
      if (dt == v.end() || !dt->is_string()) throw UserError(where + "no \"dtype\" string");
      if (!parse_safetensors_dtype(dt->get<std::string>(), &e.info.dtype)) {
        throw UserError(where + "dtype '" + dt->get<std::string>() +
                        "' is not supported (supported: F32, F16, BF16, F64, I32, I64, U8)");
      }
      const auto sh = v.find("shape");
      if (sh == v.end() || !sh->is_array()) throw UserError(where + "no \"shape\" list");
      // numel * element size must not overflow: every dimension is checked against what is left.
      std::uint64_t nbytes = dtype_size(e.info.dtype);
      bool zero = false;
      for (const auto& d : *sh) {
        std::uint64_t dim = 0;
        if (!get_u64(d, &dim) || dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
          throw UserError(where + "\"shape\" must be a list of non-negative integers");
        }
        e.info.shape.push_back(static_cast<std::int64_t>(dim));
        if (dim == 0) zero = true;
        if (!zero && nbytes > std::numeric_limits<std::uint64_t>::max() / dim) {
          throw UserError(where + "shape " + sh->dump() + " is too large");
        }
        if (!zero) nbytes *= dim;
      }
      if (zero) nbytes = 0;
      const auto off = v.find("data_offsets");
      if (off == v.end() || !off->is_array() || off->size() != 2 || !get_u64((*off)[0], &e.begin) ||
          !get_u64((*off)[1], &e.end)) {
        throw UserError(where + "\"data_offsets\" must be [begin, end] (non-negative integers)");
      }
      const std::string offsets = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
      if (e.begin > e.end || e.end > data_size) {
        throw UserError(where + "data_offsets " + offsets + " are out of range: the data section has " +
                        std::to_string(data_size) + " bytes (a truncated file?)");
      }
      if (e.end - e.begin != nbytes) {
        throw UserError(where + "data_offsets " + offsets + " hold " + std::to_string(e.end - e.begin) +
                        " bytes, but shape " + shape_str(e.info.shape) + " of " +
                        safetensors_dtype_name(e.info.dtype) + " needs " + std::to_string(nbytes));
      }
      e.info.data = data + e.begin;
      e.info.nbytes = static_cast<std::size_t>(nbytes);
      entries.push_back(std::move(e));
    }

    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    const Entry* last = nullptr;  // the non-empty tensor that ends furthest
    for (const Entry& e : entries) {
      if (e.begin == e.end) continue;
      if (last && e.begin < last->end) {
        throw UserError(path + ": tensor '" + e.info.name + "': data_offsets [" + std::to_string(e.begin) + ", " +
                        std::to_string(e.end) + "] overlap those of tensor '" + last->info.name + "'");
      }
      if (!last || e.end > last->end) last = &e;
    }
    tensors_.reserve(entries.size());
    for (Entry& e : entries) {
      index_.emplace(e.info.name, tensors_.size());
      tensors_.push_back(std::move(e.info));
    }
  } catch (...) {
    unmap();
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

bool SafetensorsFile::release_pages(const TensorInfo& t) const noexcept {
  const auto base = reinterpret_cast<std::uintptr_t>(map_), begin = reinterpret_cast<std::uintptr_t>(t.data);
  if (!map_ || !t.data || begin < base || begin - base > map_size_ || t.nbytes > map_size_ - (begin - base))
    return false;
  const long page = ::sysconf(_SC_PAGESIZE);
  if (page <= 0) return true;
  const auto p = static_cast<std::uintptr_t>(page);
  // whole pages only: a page shared with the tensor before or after stays (it is read still)
  const std::uintptr_t lo = (begin + p - 1) / p * p, hi = (begin + t.nbytes) / p * p;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  return true;
}

void SafetensorsFile::unmap() noexcept {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(other.map_),
      map_size_(other.map_size_),
      tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {
  other.map_ = nullptr;
  other.map_size_ = 0;
  other.tensors_.clear();
  other.index_.clear();
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = other.map_;
    map_size_ = other.map_size_;
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
    other.map_ = nullptr;
    other.map_size_ = 0;
    other.tensors_.clear();
    other.index_.clear();
  }
  return *this;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsFile::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw UserError(path_ + ": tensor '" + name + "' not found");
  return *t;
}

// ---------------------------------------------------------------------------------------------------------
// SafetensorsModel

namespace {

// Present (anything in its place: a directory or FIFO there is refused by name when opened, not taken for none).
bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace

SafetensorsModel::SafetensorsModel(const std::string& dir) : dir_(dir) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0) {
    throw UserError(dir_ + ": cannot open the model directory (" + std::strerror(errno) + ")");
  }
  if (!S_ISDIR(st.st_mode)) throw UserError(dir_ + ": not a directory (a model is a Hugging Face directory)");

  const std::string single = dir_ + "/model.safetensors";
  const std::string index = dir_ + "/model.safetensors.index.json";
  if (is_file(single)) {
    files_.emplace_back(single);
    for (const TensorInfo& t : files_.back().tensors()) by_name_.emplace(t.name, &t);
    return;
  }
  if (!is_file(index)) {
    throw UserError(dir_ + ": no model.safetensors or model.safetensors.index.json in the model directory");
  }

  const json j = read_json_file(index);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    throw UserError(index + ": no \"weight_map\" object");
  }
  const json& wm = j["weight_map"];
  std::set<std::string> shards;
  for (const auto& [name, f] : wm.items()) {
    if (!f.is_string()) throw UserError(index + ": weight_map entry of tensor '" + name + "' is not a file name");
    const std::string file = f.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      throw UserError(index + ": weight_map entry of tensor '" + name + "': '" + file +
                      "' is not a file name in the model directory");
    }
    shards.insert(file);
  }
  std::map<std::string, std::size_t> shard_index;
  files_.reserve(shards.size());
  for (const std::string& s : shards) {
    shard_index[s] = files_.size();
    files_.emplace_back(dir_ + "/" + s);
  }
  for (const auto& [name, f] : wm.items()) {
    const std::string file = f.get<std::string>();
    const TensorInfo* t = files_[shard_index.at(file)].find(name);
    if (!t) {
      throw UserError(index + ": tensor '" + name + "' is mapped to '" + file + "', which does not hold it");
    }
    by_name_.emplace(name, t);
  }
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

const TensorInfo* SafetensorsModel::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorInfo& SafetensorsModel::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw UserError(dir_ + ": tensor '" + stored_name(name) + "' not found");
  return *t;
}

std::size_t SafetensorsModel::rename_prefix(const std::string& stored, const std::string& as) {
  std::vector<std::pair<std::string, const TensorInfo*>> moved;
  for (auto it = by_name_.begin(); it != by_name_.end();) {
    if (it->first.compare(0, stored.size(), stored) == 0) {
      moved.emplace_back(as + it->first.substr(stored.size()), it->second);
      it = by_name_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [name, t] : moved)
    if (!by_name_.emplace(name, t).second)
      throw UserError(dir_ + ": holds both '" + t->name + "' and '" + name + "': two copies of one tensor");
  if (!moved.empty()) renamed_.emplace_back(as, stored);
  return moved.size();
}

std::string SafetensorsModel::stored_name(const std::string& name) const {
  for (const auto& [as, stored] : renamed_)
    if (name.compare(0, as.size(), as) == 0) {
      const auto it = by_name_.find(name);
      if (it != by_name_.end()) return it->second->name;
      return stored + name.substr(as.size());
    }
  return name;
}

void SafetensorsModel::release_pages(const TensorInfo& t) const noexcept {
  for (const auto& f : files_)
    if (f.release_pages(t)) return;
}

const TensorInfo& SafetensorsModel::get(const std::string& name, const Shape& expected_shape) const {
  const TensorInfo& t = get(name);
  check_shape(t, expected_shape, dir_);
  return t;
}

// ---------------------------------------------------------------------------------------------------------
// Writer

namespace {

void write_all(int fd, const void* data, std::size_t n, const std::string& tmp) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw UserError(tmp + ": cannot write (" + std::strerror(err) + ")");
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::vector<std::size_t> sizes;
  sizes.reserve(tensors.size());
  std::uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    MGRL_CHECK(!t.name.empty() && t.name != "__metadata__", "bad tensor name '" + t.name + "'");
    MGRL_CHECK(!header.contains(t.name), "tensor '" + t.name + "' given twice");
    for (const std::int64_t d : t.shape) MGRL_CHECK(d >= 0, "tensor '" + t.name + "': negative dimension");
    const std::size_t nbytes = static_cast<std::size_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    MGRL_CHECK(nbytes == 0 || t.data != nullptr, "tensor '" + t.name + "': no data");
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    sizes.push_back(nbytes);
  }
  std::string text = header.dump();  // compact, keys sorted
  while (text.size() % 8 != 0) text += ' ';
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(text.size()) >> (8 * i));

  struct stat existing {};
  if (::stat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode))
    throw UserError(path + ": exists and is not a regular file (an output file is written under a temporary name and "
                    "moved there)");
  // "<path>.tmp.<pid>", created anew (O_EXCL: a link left under that name is not followed).
  const std::string tmp = temporary_name(path);
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(tmp + ": cannot create (" + std::strerror(errno) + ")");
  write_all(fd, len, 8, tmp);
  write_all(fd, text.data(), text.size(), tmp);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (sizes[i] > 0) write_all(fd, tensors[i].data, sizes[i], tmp);
  }
  const int sync_rc = ::fsync(fd);
  const int sync_errno = errno;
  const int close_rc = ::close(fd);
  if (sync_rc != 0 || close_rc != 0) {
    const int err = sync_rc != 0 ? sync_errno : errno;
    ::unlink(tmp.c_str());
    throw UserError(tmp + ": cannot write (" + std::strerror(err) + ")");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw UserError(path + ": cannot rename " + tmp + " to it (" + std::strerror(err) + ")");
  }
  sync_parent_directory(path);  // the rename itself durable (best effort)
}

}  // namespace mgrl::io
