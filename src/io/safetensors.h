// safetensors.h: safetensors files (memory-mapped reader, writer), sharded model directories, fp16/bf16 <-> fp32.
//
// Format: 8-byte little-endian u64 N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]},
// optional "__metadata__": {str: str}}, then the tensors' bytes (offsets count from the first byte after the
// JSON), little-endian, row-major. Every check failure is a UserError naming the file (and the tensor).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"

namespace mgrl::io {

using Shape = std::vector<std::int64_t>;

std::string shape_str(const Shape& s);  // "[2, 3]"
std::int64_t shape_numel(const Shape& s);  // 1 for []

// A tensor of a mapped file: a view of its bytes (valid while the file object lives).
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const std::byte* data = nullptr;  // not necessarily aligned to the element size
  std::size_t nbytes = 0;
  std::string file;  // path of the file that holds it (for messages)

  std::int64_t numel() const { return shape_numel(shape); }
};

// safetensors dtype names ("F32", "BF16", ...) <-> DType.
const char* safetensors_dtype_name(DType t);
bool parse_safetensors_dtype(const std::string& name, DType* out);

class SafetensorsFile {
 public:
  // Maps the file read-only and checks the header against the file. Throws UserError.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  const TensorInfo& get(const std::string& name) const;   // UserError "FILE: tensor 'x' not found"
  // Once a tensor of this file is copied out: its pages leave this process's resident memory (madvise MADV_DONTNEED
  // on the whole pages inside its bytes; read again, they are read from the file again), so that loading a model
  // holds one tensor of the file at a time beside the weights, not the whole file. False (nothing done) when t's
  // bytes are not of this file's mapping.
  bool release_pages(const TensorInfo& t) const noexcept;

 private:
  void unmap() noexcept;

  std::string path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face model directory: model.safetensors, or model.safetensors.index.json
// ({"weight_map": {tensor: shard file}}) and its shards.
class SafetensorsModel {
 public:
  explicit SafetensorsModel(const std::string& dir);  // throws UserError
  SafetensorsModel(const SafetensorsModel&) = delete;
  SafetensorsModel& operator=(const SafetensorsModel&) = delete;
  SafetensorsModel(SafetensorsModel&&) noexcept = default;
  SafetensorsModel& operator=(SafetensorsModel&&) noexcept = default;

  const std::string& dir() const { return dir_; }
  std::size_t num_files() const { return files_.size(); }
  std::vector<std::string> names() const;  // sorted
  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  const TensorInfo& get(const std::string& name) const;   // UserError "DIR: tensor 'x' not found"
  // get() plus a shape check: UserError "DIR: tensor 'x' has shape [..], expected [..]".
  const TensorInfo& get(const std::string& name, const Shape& expected_shape) const;
  // From here on the tensors stored under the name prefix `stored` are found (and listed by names()) with `as` in
  // its place, e.g. a vision-language checkpoint's "language_model.model." as "model."; TensorInfo::name and the
  // messages keep the stored names. UserError when a new name is taken already. Returns how many were renamed.
  std::size_t rename_prefix(const std::string& stored, const std::string& as);
  // The name a tensor is stored under (the inverse of rename_prefix; `name` itself when not renamed).
  std::string stored_name(const std::string& name) const;
  // SafetensorsFile::release_pages of the file that holds t (a tensor this model found).
  void release_pages(const TensorInfo& t) const noexcept;

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, const TensorInfo*> by_name_;
  std::vector<std::pair<std::string, std::string>> renamed_;  // (as, stored) prefixes
};

// UserError "WHERE: tensor 'x' has shape [..], expected [..]" when t.shape != expected.
void check_shape(const TensorInfo& t, const Shape& expected, const std::string& where);

// Scalar conversions. half: IEEE binary16 (subnormals, inf, NaN); bf16: the upper 16 bits of an fp32.
// float -> half/bf16 rounds to nearest even; NaN stays NaN (quiet).
float half_to_float(std::uint16_t h);
float bf16_to_float(std::uint16_t b);
std::uint16_t float_to_half(float f);
std::uint16_t float_to_bf16(float f);

// A tensor's values as fp32 (from F32, BF16, F16 or F64). Integer tensors: UserError naming file and tensor.
void copy_to_f32(const TensorInfo& t, float* out);  // out holds t.numel() floats
std::vector<float> to_f32(const TensorInfo& t);
// copy_to_f32, then one pass over the values: weights to load must be finite. UserError
// "FILE: tensor 'x' holds a non-finite value (nan at index 12)".
void copy_finite_to_f32(const TensorInfo& t, float* out);

// One tensor to write: data holds numel * dtype_size bytes, row-major, in the host's (little-endian) order.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;
};

// Writes a safetensors file: header keys sorted, header padded with spaces to a multiple of 8 bytes, data in
// the order given. Written to path + ".tmp", flushed to disk, then renamed to path. UserError on I/O failure;
// duplicate or empty names are FatalError (a caller's bug).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace mgrl::io
