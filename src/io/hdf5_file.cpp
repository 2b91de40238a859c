// hdf5_file.cpp: H5Writer (temporary file, optional seal, fsync, rename) and H5Reader over the HDF5 C API.
#include "io/hdf5_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/check_hdf5.h"
#include "io/checksum.h"

namespace mgrl::io {
namespace {

// HDF5 prints its error stack on every failure by default; mgrl reports its own one line.
void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

hid_t h5_type(DType t) {
  switch (t) {
    case DType::F32: return H5T_NATIVE_FLOAT;
    case DType::F64: return H5T_NATIVE_DOUBLE;
    case DType::I32: return H5T_NATIVE_INT32;
    case DType::I64: return H5T_NATIVE_INT64;
    case DType::U8: return H5T_NATIVE_UINT8;
    case DType::F16:
    case DType::BF16: break;
  }
  throw FatalError(std::string("HDF5 files hold no ") + dtype_name(t) + " data in mgrl");
}

// Closes an HDF5 handle at scope exit.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
  hid_t take() {  // the caller closes it (and checks the close)
    const hid_t h = id;
    id = -1;
    return h;
  }
};

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// A file in memory only that takes any write (sparse: ranges never written cost nothing), or -1.
int memory_file() {
#ifdef SYS_memfd_create
  const int fd = static_cast<int>(::syscall(SYS_memfd_create, "mgrl-hdf5-discard", 1u /* MFD_CLOEXEC */));
  if (fd >= 0) return fd;
#endif
  char name[] = "/dev/shm/mgrl-hdf5-discard-XXXXXX";
  const int fd2 = ::mkstemp(name);
  if (fd2 >= 0) ::unlink(name);
  return fd2;
}

}  // namespace

void write_or_explain(const std::string& path, const std::string& what, const std::function<void()>& write) {
  try {
    write();
  } catch (const OutOfMemory&) {
    throw;  // not the file system's doing
  } catch (const FatalError& e) {
    std::string why = e.what();
    if (why.compare(0, path.size() + 2, path + ": ") == 0) why.erase(0, path.size() + 2);  // named once
    throw UserError(path + ": cannot write " + what + " (disk full or I/O error?): " + why);
  }
}

H5Writer::H5Writer(std::string path, std::uint64_t userblock) : path_(std::move(path)), userblock_(userblock) {
  quiet_hdf5();
  // The finished file is renamed over path: never over a directory, a device (/dev/null) or a FIFO.
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw UserError(path_ + ": exists and is not a regular file (an output file is written under a temporary name "
                    "and moved there)");
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  Handle fcpl{H5_CHECK(H5Pcreate(H5P_FILE_CREATE)), H5Pclose};
  if (userblock_ > 0) H5_CHECK(H5Pset_userblock(fcpl.id, userblock_));
  file_ = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, fcpl.id, H5P_DEFAULT);
  if (file_ < 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_.c_str());  // created before libhdf5 failed to write its first bytes (a full disk)
    throw UserError(path_ + ": cannot create the HDF5 file (" + why + ")");
  }
}

H5Writer::~H5Writer() {
  if (file_ >= 0) discard();
}

// libhdf5 1.10 does not survive a failed H5Fclose: H5F__dest frees the file's structures but the id stays
// registered, and when the library shuts down (atexit, or MPI_Finalize in the parallel build) it closes that id
// again and reads the freed structures: SIGSEGV (HDFGroup/hdf5 issue 2257, fixed in 1.14.1). A close fails when
// its writes fail (a full disk) or after any failed flush (the metadata cache is left mid-flush: "slist already
// enabled?"). So a write that has failed must not end in a close that writes to the disk: libhdf5's descriptor
// is replaced (dup2) by one of a file in memory, where whatever the close still writes goes without failing, and
// the temporary on disk is removed. commit() makes a full disk show before its flush, where it can still discard.
void H5Writer::discard() noexcept {
  const int fd = descriptor();
  if (fd >= 0) {
    const int sink = memory_file();
    if (sink >= 0) {
      ::dup2(sink, fd);  // the descriptor keeps its number; libhdf5 closes it
      ::close(sink);
    }
  }
  H5Fclose(file_);
  file_ = -1;
  std::remove(tmp_.c_str());
}

void H5Writer::fail(const std::string& why) {
  discard();
  throw FatalError(path_ + ": " + why);
}

void H5Writer::failed_write(const std::string& dataset) {
  const std::string reason = hdf5_system_error();
  fail("cannot write '" + dataset + "' (" + (reason.empty() ? std::string("an HDF5 write failed") : reason) + ")");
}

int H5Writer::descriptor() const noexcept {
  const hid_t fapl = H5Fget_access_plist(file_);
  if (fapl < 0) return -1;
  void* handle = nullptr;
  const bool sec2 = H5Pget_driver(fapl) == H5FD_SEC2 && H5Fget_vfd_handle(file_, fapl, &handle) >= 0;
  H5Pclose(fapl);
  return sec2 && handle != nullptr ? *static_cast<int*>(handle) : -1;
}

void H5Writer::write(const std::string& name, DType type, const std::vector<std::uint64_t>& shape,
                     const void* data) {
  write_native(name, h5_type(type), shape, data);
}

void H5Writer::write_i8(const std::string& name, const std::vector<std::uint64_t>& shape, const std::int8_t* data) {
  write_native(name, H5T_NATIVE_INT8, shape, data);
}

void H5Writer::write_native(const std::string& name, std::int64_t h5type, const std::vector<std::uint64_t>& shape,
                            const void* data) {
  MGRL_CHECK(file_ >= 0, "write after commit");
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space{H5_CHECK(shape.empty() ? H5Screate(H5S_SCALAR)
                                      : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
               H5Sclose};
  Handle lcpl{H5_CHECK(H5Pcreate(H5P_LINK_CREATE)), H5Pclose};
  H5_CHECK(H5Pset_create_intermediate_group(lcpl.id, 1));
  Handle set{H5_CHECK(H5Dcreate2(file_, name.c_str(), h5type, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT)),
             H5Dclose};
  if (H5Dwrite(set.id, h5type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) failed_write(name);
  std::size_t n = H5Tget_size(h5type);
  for (const auto d : dims) n *= static_cast<std::size_t>(d);
  remember(name, set.id, data, n);
  // Small datasets' values wait in the dataset's buffer until it is closed: a failed write (a full disk) shows here.
  if (H5Dclose(set.take()) < 0) failed_write(name);
}

void H5Writer::remember(const std::string& name, std::int64_t dataset, const void* data, std::size_t nbytes) {
  if (userblock_ == 0) return;
  const hsize_t stored = H5Dget_storage_size(dataset);
  if (stored == 0 && nbytes == 0) return;  // an empty dataset has no values in the file
  MGRL_CHECK(stored == nbytes, "'" + name + "' stores " + std::to_string(stored) + " bytes for " +
                                   std::to_string(nbytes) + " bytes of values (a filter or a type conversion?)");
  const haddr_t offset = H5Dget_offset(dataset);
  MGRL_CHECK(offset != HADDR_UNDEF, "'" + name + "' has no contiguous storage");
  sealed_.push_back({name, static_cast<std::uint64_t>(offset), nbytes, block_checksum(data, nbytes)});
}

namespace {
hid_t string_type(std::size_t n) {
  const hid_t t = H5_CHECK(H5Tcopy(H5T_C_S1));
  H5_CHECK(H5Tset_size(t, std::max<std::size_t>(n, 1)));
  H5_CHECK(H5Tset_cset(t, H5T_CSET_UTF8));
  return t;
}
}  // namespace

void H5Writer::write_string(const std::string& name, const std::string& value) {
  MGRL_CHECK(file_ >= 0, "write after commit");
  Handle type{string_type(value.size()), H5Tclose};
  Handle space{H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose};
  Handle lcpl{H5_CHECK(H5Pcreate(H5P_LINK_CREATE)), H5Pclose};
  H5_CHECK(H5Pset_create_intermediate_group(lcpl.id, 1));
  Handle set{H5_CHECK(H5Dcreate2(file_, name.c_str(), type.id, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT)),
             H5Dclose};
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  if (H5Dwrite(set.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, padded.data()) < 0) failed_write(name);
  remember(name, set.id, padded.data(), padded.size());
  if (H5Dclose(set.take()) < 0) failed_write(name);  // as in write_native
}

void H5Writer::attr(const std::string& object, const std::string& name, const std::string& value) {
  Handle type{string_type(value.size()), H5Tclose};
  Handle space{H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose};
  Handle a{H5_CHECK(H5Acreate_by_name(file_, object.c_str(), name.c_str(), type.id, space.id, H5P_DEFAULT,
                                      H5P_DEFAULT, H5P_DEFAULT)),
           H5Aclose};
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  H5_CHECK(H5Awrite(a.id, type.id, padded.data()));
}

void H5Writer::attr(const std::string& object, const std::string& name, const std::vector<std::string>& values) {
  std::size_t width = 1;
  for (const auto& v : values) width = std::max(width, v.size());
  Handle type{string_type(width), H5Tclose};
  H5_CHECK(H5Tset_strpad(type.id, H5T_STR_NULLPAD));
  const hsize_t n = values.size();
  Handle space{H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose};
  Handle a{H5_CHECK(H5Acreate_by_name(file_, object.c_str(), name.c_str(), type.id, space.id, H5P_DEFAULT,
                                      H5P_DEFAULT, H5P_DEFAULT)),
           H5Aclose};
  std::string packed(width * values.size() + 1, '\0');
  for (std::size_t i = 0; i < values.size(); ++i) packed.replace(i * width, values[i].size(), values[i]);
  H5_CHECK(H5Awrite(a.id, type.id, packed.data()));
}

void H5Writer::attr(const std::string& object, const std::string& name, std::int64_t value) {
  Handle space{H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose};
  Handle a{H5_CHECK(H5Acreate_by_name(file_, object.c_str(), name.c_str(), H5T_NATIVE_INT64, space.id, H5P_DEFAULT,
                                      H5P_DEFAULT, H5P_DEFAULT)),
           H5Aclose};
  H5_CHECK(H5Awrite(a.id, H5T_NATIVE_INT64, &value));
}

void H5Writer::commit() {
  MGRL_CHECK(file_ >= 0, "commit twice");
  // A full disk must show before the flush, not inside it (see discard). libhdf5 writes nothing beyond the space it
  // has allocated in the file (its end of allocation, which H5Fget_filesize reports): that space is allocated on
  // the disk first. posix_fallocate keeps the bytes already written (where the file system has no fallocate, glibc
  // writes a zero byte into each block that reads zero: slow on a large file, but only there).
  hsize_t allocated = 0;
  if (H5Fget_filesize(file_, &allocated) < 0) fail("cannot get the size of the HDF5 file");
  const int fd = descriptor();
  if (fd >= 0 && allocated > 0) {
    const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(allocated));
    if (err != 0) fail("cannot write the file (" + std::string(std::strerror(err)) + ")");
  }
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) fail("writing the HDF5 file failed (an I/O error?)");
  // After the flush, the end of allocation is the file's length (the flush gives the space that its free-space
  // aggregators held back); the close leaves the file at that length when it was longer (the reservation above).
  hsize_t length = 0;
  if (H5Fget_filesize(file_, &length) < 0) fail("cannot get the size of the HDF5 file");
  const herr_t closed = H5Fclose(file_);
  file_ = -1;
  if (closed < 0) {
    std::remove(tmp_.c_str());
    throw FatalError(path_ + ": closing the HDF5 file failed");
  }
  struct stat st {};
  if (::stat(tmp_.c_str(), &st) == 0 && static_cast<hsize_t>(st.st_size) > length &&
      ::truncate(tmp_.c_str(), static_cast<off_t>(length)) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_.c_str());
    throw FatalError(tmp_ + ": cannot truncate (" + why + ")");
  }
  if (userblock_ > 0) {
    try {
      const int fd = ::open(tmp_.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) throw FatalError(tmp_ + ": cannot open to seal (" + std::string(std::strerror(errno)) + ")");
      try {
        seal_file(fd, tmp_, userblock_, std::move(sealed_));
      } catch (...) {
        ::close(fd);
        throw;
      }
      if (::close(fd) != 0) throw FatalError(tmp_ + ": closing failed (" + std::string(std::strerror(errno)) + ")");
    } catch (...) {
      std::remove(tmp_.c_str());
      throw;
    }
  } else {
    fsync_file(tmp_);
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_.c_str());
    throw UserError(path_ + ": cannot move the finished file into place (" + why + ")");
  }
  sync_parent_directory(path_);
}

H5Reader::H5Reader(std::string path) : path_(std::move(path)) {
  quiet_hdf5();
  if (::access(path_.c_str(), R_OK) != 0)
    throw UserError(path_ + ": cannot open (" + std::string(std::strerror(errno)) + ")");
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) throw UserError(path_ + ": not a regular file");
  file_size_ = static_cast<std::uint64_t>(st.st_size);
  if (H5Fis_hdf5(path_.c_str()) <= 0) throw UserError(path_ + ": not an HDF5 file (or a truncated one)");
  file_ = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) throw UserError(path_ + ": the HDF5 file cannot be opened (corrupt or truncated?)");
}

H5Reader::~H5Reader() {
  if (file_ >= 0) H5Fclose(file_);
}

bool H5Reader::has(const std::string& name) const {
  // Walk the path one link at a time: H5Lexists fails on a missing intermediate group.
  std::string partial;
  std::size_t start = name.front() == '/' ? 1 : 0;
  while (start <= name.size()) {
    const auto slash = name.find('/', start);
    partial = name.substr(0, slash);
    if (H5Lexists(file_, partial.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

std::int64_t H5Reader::open_dataset(const std::string& name) const {
  if (!has(name)) throw UserError(path_ + ": no dataset '" + name + "'");
  const hid_t d = H5Dopen2(file_, name.c_str(), H5P_DEFAULT);
  if (d < 0) throw UserError(path_ + ": '" + name + "' is not a readable dataset");
  return d;
}

std::vector<std::uint64_t> H5Reader::shape(const std::string& name) const {
  Handle set{open_dataset(name), H5Dclose};
  Handle space{H5_CHECK(H5Dget_space(set.id)), H5Sclose};
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space.id));
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5_CHECK(H5Sget_simple_extent_dims(space.id, dims.data(), nullptr));
  return std::vector<std::uint64_t>(dims.begin(), dims.end());
}

DType H5Reader::dtype(const std::string& name) const {
  Handle set{open_dataset(name), H5Dclose};
  Handle type{H5_CHECK(H5Dget_type(set.id)), H5Tclose};
  const auto cls = H5Tget_class(type.id);
  const auto size = H5Tget_size(type.id);
  if (cls == H5T_FLOAT) return size == 8 ? DType::F64 : DType::F32;
  if (cls == H5T_INTEGER) return size == 8 ? DType::I64 : DType::I32;
  throw UserError(path_ + ": dataset '" + name + "' is not numeric");
}

void H5Reader::read(const std::string& name, DType type, void* out) const {
  Handle set{open_dataset(name), H5Dclose};
  if (H5Dread(set.id, h5_type(type), H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    throw UserError(path_ + ": cannot read dataset '" + name + "' (corrupt or truncated?)");
}

std::string H5Reader::read_string(const std::string& name) const {
  Handle set{open_dataset(name), H5Dclose};
  Handle type{H5_CHECK(H5Dget_type(set.id)), H5Tclose};
  if (H5Tget_class(type.id) != H5T_STRING || H5Tis_variable_str(type.id) > 0)
    throw UserError(path_ + ": '" + name + "' is not a fixed-length string");
  const std::size_t size = H5Tget_size(type.id);
  if (size > file_size_)
    throw UserError(path_ + ": '" + name + "' claims a string of " + std::to_string(size) + " bytes, more than the file holds (corrupt?)");
  std::string s(size, '\0');
  H5_CHECK(H5Dread(set.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()));
  s.resize(std::strlen(s.c_str()));
  return s;
}

std::string H5Reader::attr_string(const std::string& object, const std::string& name) const {
  if (H5Aexists_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT) <= 0)
    throw UserError(path_ + ": no attribute '" + name + "' on '" + object + "'");
  Handle a{H5_CHECK(H5Aopen_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose};
  Handle type{H5_CHECK(H5Aget_type(a.id)), H5Tclose};
  if (H5Tget_class(type.id) != H5T_STRING || H5Tis_variable_str(type.id) > 0)
    throw UserError(path_ + ": attribute '" + name + "' is not a fixed-length string");
  const std::size_t size = H5Tget_size(type.id);
  if (size > file_size_)
    throw UserError(path_ + ": attribute '" + name + "' claims a string of " + std::to_string(size) + " bytes, more than the file holds (corrupt?)");
  std::string s(size, '\0');
  H5_CHECK(H5Aread(a.id, type.id, s.data()));
  s.resize(std::strlen(s.c_str()));
  return s;
}

std::int64_t H5Reader::attr_int(const std::string& object, const std::string& name) const {
  if (H5Aexists_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT) <= 0)
    throw UserError(path_ + ": no attribute '" + name + "' on '" + object + "'");
  Handle a{H5_CHECK(H5Aopen_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose};
  std::int64_t v = 0;
  H5_CHECK(H5Aread(a.id, H5T_NATIVE_INT64, &v));
  return v;
}

bool H5Reader::has_attr(const std::string& object, const std::string& name) const {
  return H5Aexists_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT) > 0;
}

std::vector<std::string> H5Reader::list(const std::string& group) const {
  if (!has(group) && group != "/") throw UserError(path_ + ": no group '" + group + "'");
  Handle g{H5_CHECK(H5Gopen2(file_, group.c_str(), H5P_DEFAULT)), H5Gclose};
  H5G_info_t info;
  H5_CHECK(H5Gget_info(g.id, &info));
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t n = H5Lget_name_by_idx(g.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    std::string s(static_cast<std::size_t>(n) + 1, '\0');
    H5Lget_name_by_idx(g.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, s.data(), s.size(), H5P_DEFAULT);
    s.resize(static_cast<std::size_t>(n));
    names.push_back(s);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace mgrl::io
