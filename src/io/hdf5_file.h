// hdf5_file.h: small HDF5 file access for checkpoints, score outputs and rollout buffers:
// a writer that builds a file under a temporary name and renames it into place when complete
// (fsync'ed, so a crash never leaves a half-written file under the final name), and a reader.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/hdf5_seal.h"

namespace mgrl::io {

// Runs `write`: an H5Writer's writes and commit for `path`. A failed write there is the file system's doing (a full
// disk, a quota, an I/O error; the writer has removed its temporary and nothing under `path` was touched):
// UserError "<path>: cannot write <what> (disk full or I/O error?): <why>" (exit 2, as any unwritable output).
void write_or_explain(const std::string& path, const std::string& what, const std::function<void()>& write);

class H5Writer {
 public:
  // Creates "<path>.tmp.<pid>" next to path; nothing exists under path until commit(). A userblock size > 0
  // (io::seal_userblock_size of the names of the datasets to be written) seals the file at commit: the user block
  // gets checksums of every byte of the file, verified by io::verify_seal before libhdf5 reads it (io/hdf5_seal.h).
  explicit H5Writer(std::string path, std::uint64_t userblock = 0);
  ~H5Writer();  // without commit(): the temporary file is removed
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;

  // A dataset at `name` ("a/b/c": groups are created as needed). shape {} is a scalar.
  void write(const std::string& name, DType type, const std::vector<std::uint64_t>& shape, const void* data);
  void write_i8(const std::string& name, const std::vector<std::uint64_t>& shape, const std::int8_t* data);
  void write_string(const std::string& name, const std::string& value);  // a scalar string dataset
  // Attributes on an existing object ("/" for the file).
  void attr(const std::string& object, const std::string& name, const std::string& value);
  void attr(const std::string& object, const std::string& name, std::int64_t value);
  void attr(const std::string& object, const std::string& name, const std::vector<std::string>& values);  // 1-D
  // Flushes, closes, seals (when asked), fsyncs and renames the file to its final path. FatalError naming the path
  // when the file cannot be written (a full disk, an I/O error); the temporary is removed then.
  void commit();

 private:
  void write_native(const std::string& name, std::int64_t h5type, const std::vector<std::uint64_t>& shape,
                    const void* data);
  // Remembers where a dataset's values lie and their checksum, for the seal.
  void remember(const std::string& name, std::int64_t dataset, const void* data, std::size_t nbytes);
  int descriptor() const noexcept;      // libhdf5's descriptor of the open file (sec2 driver), or -1
  void discard() noexcept;              // closes the file without letting libhdf5 write to the disk, removes it
  [[noreturn]] void fail(const std::string& why);  // discard(), then FatalError "PATH: why"
  [[noreturn]] void failed_write(const std::string& dataset);  // fail() with the system's reason (a full disk)
  std::string path_, tmp_;
  std::int64_t file_ = -1;
  std::uint64_t userblock_ = 0;
  std::vector<SealEntry> sealed_;
};

class H5Reader {
 public:
  // Throws UserError naming the path when it is missing or not an HDF5 file.
  explicit H5Reader(std::string path);
  ~H5Reader();
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;

  bool has(const std::string& name) const;
  std::vector<std::uint64_t> shape(const std::string& name) const;
  DType dtype(const std::string& name) const;
  // Reads the whole dataset converted to `type` into out (prod(shape) elements).
  void read(const std::string& name, DType type, void* out) const;
  template <typename T>
  std::vector<T> read_all(const std::string& name, DType type) const {
    std::size_t n = 1;
    for (auto d : shape(name)) n *= static_cast<std::size_t>(d);
    std::vector<T> v(n);
    read(name, type, v.data());
    return v;
  }
  std::string read_string(const std::string& name) const;
  std::string attr_string(const std::string& object, const std::string& name) const;
  std::int64_t attr_int(const std::string& object, const std::string& name) const;
  bool has_attr(const std::string& object, const std::string& name) const;
  // Names of the members of a group, sorted.
  std::vector<std::string> list(const std::string& group) const;
  const std::string& path() const { return path_; }
  // Bytes of the file when it was opened. mgrl writes no compressed datasets, so no dataset of one of its
  // files can hold more: readers compare claimed sizes with it before allocating (a damaged file can claim
  // any size).
  std::uint64_t file_size() const { return file_size_; }

 private:
  std::int64_t open_dataset(const std::string& name) const;
  std::string path_;
  std::int64_t file_ = -1;
  std::uint64_t file_size_ = 0;
};

}  // namespace mgrl::io
