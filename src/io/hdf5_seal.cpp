// hdf5_seal.cpp: writing and verifying the seal of an HDF5 file (see hdf5_seal.h) with plain POSIX file I/O.
// The seal, little-endian, at byte 0 of the user block (the rest of the user block is zero):
//   0  16 bytes  magic "mgrl-sealed-hdf5"
//  16  u32       seal format version (1)
//  20  u32       number of entries
//  24  u64       user block size (where HDF5's superblock starts)
//  32  u64       file length
//  40  u64       BlockChecksum of the metadata: the bytes from the user block's end to the file's end, less
//                every entry's range, in file order
//  48  u64       checksum64 of the whole user block with these 8 bytes zero
//  56  entries   u32 name length, the name, u64 offset, u64 size, u64 BlockChecksum of the bytes at that range
#include "io/hdf5_seal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "io/checksum.h"

namespace mgrl::io {
namespace {

constexpr char kMagic[16] = {'m', 'g', 'r', 'l', '-', 's', 'e', 'a', 'l', 'e', 'd', '-', 'h', 'd', 'f', '5'};
constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
constexpr std::uint32_t kSealVersion = 1;
constexpr std::size_t kHeader = 56;
constexpr std::size_t kChecksumAt = 48;
constexpr std::size_t kEntryFixed = 4 + 3 * 8;           // name length, offset, size, checksum
constexpr std::uint64_t kMaxUserblock = std::uint64_t{1} << 30;  // no seal of ours comes near it

void put_u32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// How a failure is reported: the writer's are FatalErrors (an I/O error while writing), the reader's UserErrors
// naming the file (a damaged or unreadable input).
struct Failure {
  std::string prefix;  // "PATH: " or "PATH: sealing the file: "
  bool fatal;
  [[noreturn]] void operator()(const std::string& why) const {
    if (fatal) throw FatalError(prefix + why);
    throw UserError(prefix + why);
  }
};

// Reads n bytes at offset; false when the file ends first.
bool read_at(int fd, std::uint64_t offset, void* buf, std::size_t n, const Failure& fail) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(std::string("cannot read (") + std::strerror(errno) + ")");
    if (got == 0) return false;
    p += got;
    offset += static_cast<std::uint64_t>(got);
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

// Feeds the bytes [from, to) of the file to sum, 1 MiB at a time.
void feed(int fd, std::uint64_t from, std::uint64_t to, BlockChecksum& sum, std::vector<unsigned char>& buf,
          const Failure& fail) {
  while (from < to) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(to - from, buf.size()));
    if (!read_at(fd, from, buf.data(), n, fail)) fail("the file ended early while being read (truncated meanwhile?)");
    sum.update(buf.data(), n);
    from += n;
  }
}

// The entries' indices in file order.
std::vector<std::size_t> file_order(const std::vector<SealEntry>& entries) {
  std::vector<std::size_t> order(entries.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return entries[a].offset < entries[b].offset; });
  return order;
}

// Whether every entry is a non-empty range after the user block and within the file, none overlapping; else
// names the first that is not.
bool ranges_fit(const std::vector<SealEntry>& entries, std::uint64_t userblock, std::uint64_t length,
                std::string* bad) {
  std::uint64_t end = userblock;
  for (const std::size_t i : file_order(entries)) {
    const auto& e = entries[i];
    if (e.size == 0 || e.offset < end || e.offset > length || e.size > length - e.offset) {
      *bad = "'" + e.name + "' at bytes " + std::to_string(e.offset) + " + " + std::to_string(e.size);
      return false;
    }
    end = e.offset + e.size;
  }
  return true;
}

// Checksums of the file's bytes from the user block's end to `length`: each entry's range (entries within the
// file, not overlapping: ranges_fit) and the rest (the metadata), reading the file once, front to back.
struct Scan {
  std::vector<std::uint64_t> entries;
  std::uint64_t metadata = 0;
};
Scan scan(int fd, std::uint64_t userblock, std::uint64_t length, const std::vector<SealEntry>& entries,
          const Failure& fail) {
  std::vector<unsigned char> buf(BlockChecksum::kBlock);
  Scan out;
  out.entries.resize(entries.size());
  BlockChecksum metadata;
  std::uint64_t at = userblock;
  for (const std::size_t i : file_order(entries)) {
    feed(fd, at, entries[i].offset, metadata, buf, fail);
    BlockChecksum values;
    feed(fd, entries[i].offset, entries[i].offset + entries[i].size, values, buf, fail);
    out.entries[i] = values.digest();
    at = entries[i].offset + entries[i].size;
  }
  feed(fd, at, length, metadata, buf, fail);
  out.metadata = metadata.digest();
  return out;
}

std::uint64_t userblock_checksum(std::vector<unsigned char> block) {
  std::memset(block.data() + kChecksumAt, 0, 8);
  return checksum64(block.data(), block.size());
}

bool valid_userblock(std::uint64_t ub) { return ub >= 512 && ub <= kMaxUserblock && (ub & (ub - 1)) == 0; }

// A seal as read: header fields and entries.
struct Seal {
  std::uint64_t userblock = 0, length = 0, metadata = 0;
  std::vector<SealEntry> entries;
};

// Reads the seal at the start of the file and verifies the user block's checksum (not yet the rest of the file).
// False when the file has no seal but starts with the HDF5 signature.
bool read_seal(int fd, std::uint64_t size, const std::string& noun, const Failure& fail, Seal& seal) {
  unsigned char head[kHeader];
  const std::size_t have = static_cast<std::size_t>(std::min<std::uint64_t>(size, kHeader));
  if (!read_at(fd, 0, head, have, fail)) fail("the file ended early while being read (truncated meanwhile?)");
  if (have < sizeof kMagic || std::memcmp(head, kMagic, sizeof kMagic) != 0) {
    if (have >= sizeof kHdf5Signature && std::memcmp(head, kHdf5Signature, sizeof kHdf5Signature) == 0) return false;
    if (size == 0) fail("not an HDF5 file (an empty file)");
    fail("not an HDF5 file (neither an mgrl " + noun + " header nor the HDF5 signature at its start)");
  }
  if (have < kHeader) fail("truncated " + noun + ": it has " + std::to_string(size) + " bytes, fewer than its header");
  const std::uint64_t ub = get_u64(head + 24);
  if (!valid_userblock(ub))
    fail("damaged " + noun + ": its header is damaged (it claims a user block of " + std::to_string(ub) + " bytes)");
  if (ub > size)
    fail("truncated " + noun + ": it has " + std::to_string(size) + " bytes, fewer than its header's " +
         std::to_string(ub));
  std::vector<unsigned char> block(static_cast<std::size_t>(ub));
  if (!read_at(fd, 0, block.data(), block.size(), fail))
    fail("the file ended early while being read (truncated meanwhile?)");
  const std::uint64_t stored = get_u64(block.data() + kChecksumAt), actual = userblock_checksum(block);
  if (stored != actual)
    fail("damaged " + noun + ": its header (the HDF5 user block) does not match its checksum (" + hex(actual) +
         ", stored " + hex(stored) + ")");
  const std::uint32_t version = get_u32(block.data() + 16);
  if (version > kSealVersion)
    throw NewerSeal(fail.prefix + "its integrity header has format version " + std::to_string(version) +
                    " (written by a newer mgrl), newer than version " + std::to_string(kSealVersion) +
                    ", the one this mgrl reads");
  if (version == 0) fail("corrupt " + noun + ": its integrity header has format version 0");
  seal.userblock = ub;
  seal.length = get_u64(block.data() + 32);
  seal.metadata = get_u64(block.data() + 40);
  const std::uint32_t count = get_u32(block.data() + 20);
  std::size_t at = kHeader;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (block.size() - at < kEntryFixed || block.size() - at - kEntryFixed < get_u32(block.data() + at))
      fail("corrupt " + noun + ": its header lists more entries than it holds");
    const std::uint32_t len = get_u32(block.data() + at);
    SealEntry e;
    e.name.assign(reinterpret_cast<const char*>(block.data() + at + 4), len);
    const unsigned char* p = block.data() + at + 4 + len;
    e.offset = get_u64(p);
    e.size = get_u64(p + 8);
    e.checksum = get_u64(p + 16);
    seal.entries.push_back(std::move(e));
    at += kEntryFixed + len;
  }
  return true;
}

// Opens path for verification: UserError naming it when missing, unreadable or not a regular file.
int open_for_reading(const std::string& path, std::uint64_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO: no wait, refused below
  if (fd < 0) throw UserError(path + ": cannot open (" + std::string(std::strerror(errno)) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError(path + ": not a regular file");
  }
  size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

}  // namespace

std::uint64_t seal_userblock_size(const std::vector<std::string>& dataset_names) {
  std::uint64_t need = kHeader;
  for (const auto& n : dataset_names) need += kEntryFixed + n.size();
  std::uint64_t ub = 512;
  while (ub < need) ub *= 2;
  return ub;
}

void seal_file(int fd, const std::string& path, std::uint64_t userblock, std::vector<SealEntry> entries) {
  const Failure fail{path + ": sealing the file: ", true};
  MGRL_CHECK(valid_userblock(userblock), "user block of " + std::to_string(userblock) + " bytes");
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(std::string("cannot stat (") + std::strerror(errno) + ")");
  const auto length = static_cast<std::uint64_t>(st.st_size);
  // H5Dget_offset counts from the start of the file in HDF5 1.10.8; a version that counts from the superblock is
  // recognised by the first entry (the writer's values must be found where the entry says).
  if (!entries.empty()) {
    const SealEntry& first = entries.front();
    std::vector<unsigned char> buf(BlockChecksum::kBlock);
    const auto found_at = [&](std::uint64_t offset) {
      if (offset > length || first.size > length - offset) return false;
      BlockChecksum sum;
      feed(fd, offset, offset + first.size, sum, buf, fail);
      return sum.digest() == first.checksum;
    };
    if (!found_at(first.offset)) {
      if (!found_at(first.offset + userblock))
        fail("the values of '" + first.name + "' are not where HDF5 says they are (an I/O error?)");
      for (auto& e : entries) e.offset += userblock;
    }
  }
  std::string bad;
  if (!ranges_fit(entries, userblock, length, &bad)) fail(bad + " lies outside the file or overlaps another dataset");
  const Scan sums = scan(fd, userblock, length, entries, fail);
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (sums.entries[i] != entries[i].checksum)
      fail("the values of '" + entries[i].name + "' do not read back as written (an I/O error?)");

  std::vector<unsigned char> block(static_cast<std::size_t>(userblock), 0);
  std::memcpy(block.data(), kMagic, sizeof kMagic);
  put_u32(block.data() + 16, kSealVersion);
  put_u32(block.data() + 20, static_cast<std::uint32_t>(entries.size()));
  put_u64(block.data() + 24, userblock);
  put_u64(block.data() + 32, length);
  put_u64(block.data() + 40, sums.metadata);
  std::size_t at = kHeader;
  for (const auto& e : entries) {
    if (block.size() - at < kEntryFixed + e.name.size())
      fail("the seal does not fit in the user block of " + std::to_string(userblock) + " bytes");
    put_u32(block.data() + at, static_cast<std::uint32_t>(e.name.size()));
    std::memcpy(block.data() + at + 4, e.name.data(), e.name.size());
    unsigned char* p = block.data() + at + 4 + e.name.size();
    put_u64(p, e.offset);
    put_u64(p + 8, e.size);
    put_u64(p + 16, e.checksum);
    at += kEntryFixed + e.name.size();
  }
  put_u64(block.data() + kChecksumAt, userblock_checksum(block));
  std::size_t done = 0;
  while (done < block.size()) {
    const ssize_t n = ::pwrite(fd, block.data() + done, block.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(std::string("cannot write the user block (") + std::strerror(n < 0 ? errno : EIO) + ")");
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail(std::string("fsync failed (") + std::strerror(errno) + ")");
}

SealState verify_seal(const std::string& path, const std::string& noun) {
  std::uint64_t size = 0;
  const Fd file{open_for_reading(path, size)};
  const Failure fail{path + ": ", false};
  Seal seal;
  if (!read_seal(file.fd, size, noun, fail, seal)) return SealState::unsealed_hdf5;
  if (size < seal.length)
    fail("truncated " + noun + ": it has " + std::to_string(size) + " bytes, its header says " +
         std::to_string(seal.length));
  if (size > seal.length)
    fail("corrupt " + noun + ": it has " + std::to_string(size) + " bytes, its header says " +
         std::to_string(seal.length) + " (bytes appended?)");
  std::string bad;
  if (!ranges_fit(seal.entries, seal.userblock, seal.length, &bad))
    fail("corrupt " + noun + ": its header places " + bad + " outside the file or over another dataset");
  const Scan sums = scan(file.fd, seal.userblock, seal.length, seal.entries, fail);
  for (std::size_t i = 0; i < seal.entries.size(); ++i)
    if (sums.entries[i] != seal.entries[i].checksum)
      fail("damaged " + noun + ": the data of '" + seal.entries[i].name + "' do not match their checksum (" +
           hex(sums.entries[i]) + ", stored " + hex(seal.entries[i].checksum) + ")");
  if (sums.metadata != seal.metadata)
    fail("damaged " + noun + ": its HDF5 metadata (the bytes outside the datasets' values) do not match their "
         "checksum (" + hex(sums.metadata) + ", stored " + hex(seal.metadata) + ")");
  return SealState::sealed;
}

std::vector<SealEntry> read_seal_entries(const std::string& path) {
  std::uint64_t size = 0;
  const Fd file{open_for_reading(path, size)};
  Seal seal;
  if (!read_seal(file.fd, size, "file", Failure{path + ": ", false}, seal)) return {};
  return seal.entries;
}

}  // namespace mgrl::io
