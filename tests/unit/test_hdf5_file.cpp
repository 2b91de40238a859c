// test_hdf5_file.cpp: H5Writer / H5Reader round trips, atomic commit, errors on bad files; sealed files
// (io/hdf5_seal.h): where the seal puts what, and every kind of damage it reports.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>

#include "core/error.h"
#include "io/checksum.h"
#include "io/hdf5_file.h"
#include "io/hdf5_seal.h"
#include "tests/unit/test_util.h"

namespace mgrl::io {
namespace {

std::string tmp(const std::string& name) { return test::temp_path(name); }
bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }


TEST(Hdf5File, RoundTripOfEveryTypeStringsAndAttributes) {
  const auto path = tmp("round.h5");
  std::remove(path.c_str());
  const std::vector<float> f{1.5f, -2.0f, NAN, 4.0f, 5.0f, 6.0f};
  const std::vector<double> d{1e-300, 2.5};
  const std::vector<std::int32_t> i{-1, 7, 9};
  const std::int64_t big = std::int64_t{1} << 40;
  {
    H5Writer w(path);
    w.write("a/b/floats", DType::F32, {2, 3}, f.data());
    w.write("doubles", DType::F64, {2}, d.data());
    w.write("a/ints", DType::I32, {3}, i.data());
    w.write("scalar", DType::I64, {}, &big);
    w.write_string("config", "mode = \"info\"\n");
    w.attr("/", "format", "mgrl-test");
    w.attr("a/b/floats", "version", std::int64_t{3});
    EXPECT_FALSE(exists(path)) << "nothing under the final name before commit";
    w.commit();
  }
  ASSERT_TRUE(exists(path));
  H5Reader r(path);
  EXPECT_EQ(r.shape("a/b/floats"), (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(r.dtype("a/b/floats"), DType::F32);
  const auto f2 = r.read_all<float>("a/b/floats", DType::F32);
  for (std::size_t k = 0; k < f.size(); ++k) {
    if (std::isnan(f[k])) EXPECT_TRUE(std::isnan(f2[k]));
    else EXPECT_EQ(f2[k], f[k]);
  }
  EXPECT_EQ(r.read_all<double>("doubles", DType::F64), d);
  EXPECT_EQ(r.read_all<std::int32_t>("a/ints", DType::I32), i);
  EXPECT_EQ(r.dtype("a/ints"), DType::I32);
  EXPECT_TRUE(r.shape("scalar").empty());
  EXPECT_EQ(r.read_all<std::int64_t>("scalar", DType::I64), std::vector<std::int64_t>{big});
  EXPECT_EQ(r.read_string("config"), "mode = \"info\"\n");
  EXPECT_EQ(r.attr_string("/", "format"), "mgrl-test");
  EXPECT_EQ(r.attr_int("a/b/floats", "version"), 3);
  EXPECT_EQ(r.list("a"), (std::vector<std::string>{"b", "ints"}));
  EXPECT_TRUE(r.has("a/b"));
  EXPECT_FALSE(r.has("a/zzz/floats"));
  // Reading converts: ints as doubles.
  EXPECT_EQ(r.read_all<double>("a/ints", DType::F64), (std::vector<double>{-1, 7, 9}));
}

TEST(Hdf5File, UncommittedWriterLeavesNothing) {
  const auto path = tmp("never.h5");
  std::remove(path.c_str());
  {
    H5Writer w(path);
    const float x = 1;
    w.write("x", DType::F32, {1}, &x);
  }
  EXPECT_FALSE(exists(path));
  // No temporary left behind either.
  EXPECT_FALSE(exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST(Hdf5File, CommitReplacesAnOldFileOnlyWhenComplete) {
  const auto path = tmp("replace.h5");
  const float one = 1, two = 2;
  {
    H5Writer w(path);
    w.write("v", DType::F32, {1}, &one);
    w.commit();
  }
  {
    H5Writer w(path);
    w.write("v", DType::F32, {1}, &two);
    // Not committed yet: the old file is intact.
    H5Reader r(path);
    EXPECT_EQ(r.read_all<float>("v", DType::F32)[0], 1.0f);
    w.commit();
  }
  H5Reader r(path);
  EXPECT_EQ(r.read_all<float>("v", DType::F32)[0], 2.0f);
}

TEST(Hdf5File, BadFilesAreUserErrorsNamingThePath) {
  auto msg = test::error_of([] { H5Reader r(tmp("missing.h5")); });
  EXPECT_NE(msg.find("missing.h5: cannot open"), std::string::npos) << msg;
  const auto text = tmp("text.h5");
  std::ofstream(text) << "this is not hdf5\n";
  msg = test::error_of([&] { H5Reader r(text); });
  EXPECT_NE(msg.find("text.h5: not an HDF5 file"), std::string::npos) << msg;
  // A truncated file.
  const auto full = tmp("full.h5"), cut = tmp("cut.h5");
  {
    std::vector<float> big(4096, 1.0f);
    H5Writer w(full);
    w.write("big", DType::F32, {4096}, big.data());
    w.commit();
  }
  std::ifstream in(full, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  msg = test::error_of([&] {
    H5Reader r(cut);
    r.read_all<float>("big", DType::F32);
  });
  EXPECT_NE(msg.find("cut.h5"), std::string::npos) << msg;
  H5Reader ok(full);
  msg = test::error_of([&] { ok.shape("nope"); });
  EXPECT_NE(msg.find("full.h5: no dataset 'nope'"), std::string::npos) << msg;
}

// Runs body in a child process that has a tmpfs of `kib` KiB mounted at dir, in a mount namespace of its own (the
// mount ends with the child, whatever happens). Returns the child's exit code; 77 when no mount namespace can be
// made here (not root and no unprivileged user namespaces, or a container without the capability); -signal when
// the child was killed by a signal.
int with_small_disk(const std::string& dir, int kib, const std::function<int()>& body) {
  std::filesystem::create_directories(dir);
  std::cout.flush();
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    const auto put = [](const char* file, const std::string& text) {
      const int fd = ::open(file, O_WRONLY);
      const bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      if (fd >= 0) ::close(fd);
      return ok;
    };
    const uid_t uid = ::getuid();
    const gid_t gid = ::getgid();
    if (::unshare(CLONE_NEWNS) != 0) {  // not root: root of a user namespace of our own, if allowed
      if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) ::_exit(77);
      put("/proc/self/setgroups", "deny");
      if (!put("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
          !put("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"))
        ::_exit(77);
    }
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(77);
    const std::string size = "size=" + std::to_string(kib) + "k";
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, size.c_str()) != 0) ::_exit(77);
    const int code = body();
    std::cout.flush();
    std::fflush(nullptr);
    ::_exit(code);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

TEST(Hdf5File, FullDiskIsAnErrorThatLeavesNothingAndLibhdf5Intact) {
  // libhdf5 1.10 frees a file whose close fails but keeps its id, and crashes (SIGSEGV) when it shuts down and
  // closes that id again (at exit or MPI_Finalize). A full disk met at each place where libhdf5 writes must be an
  // error naming the file or the disk's reason, leave no file, and leave libhdf5 able to write and to shut down.
  const std::string dir = tmp("small_disk");
  const int code = with_small_disk(dir, 200, [&] {
    int failures = 0;
    const auto check = [&](bool ok, const std::string& what) {
      if (!ok) {
        std::cout << "FAILED: " << what << std::endl;
        ++failures;
      }
    };
    const auto listing = [&] {
      std::string names;
      for (const auto& e : std::filesystem::directory_iterator(dir)) names += e.path().filename().string() + " ";
      return names;
    };
    // Each: datasets of `floats` values, `count` of them, in a file sealed as checkpoints are.
    const auto full_disk = [&](const std::string& name, std::size_t floats, int count, const std::string& where) {
      const std::string path = dir + "/" + name;
      std::vector<float> values(floats, 0.25f);
      std::vector<std::string> names;
      for (int k = 0; k < count; ++k) names.push_back("t/" + std::to_string(k));
      std::string msg;
      try {
        H5Writer w(path, seal_userblock_size(names));
        for (const auto& n : names) w.write(n, DType::F32, {floats}, values.data());
        w.commit();
      } catch (const std::exception& e) {
        msg = e.what();
      }
      check(msg.find(where) != std::string::npos && msg.find("No space left on device") != std::string::npos,
            name + ": the error should say '" + where + "' and the disk's reason, not '" + msg + "'");
      check(listing().empty(), name + ": files left: " + listing());
    };
    // The dataset whose write fails is named (H5Dwrite's or, for values buffered until then, H5Dclose's failure).
    full_disk("large.h5", 100000, 2, "cannot write 't/0'");            // 400 KB at once: the write fails
    full_disk("buffered.h5", 6000, 20, "cannot write 't/");            // 24 KB each: buffered until the close
    full_disk("metadata.h5", 2, 2000, "cannot write the file");  // metadata only: left for the commit
    // A disk full before the file is created.
    {
      std::ofstream fill(dir + "/fill", std::ios::binary);
      const std::string block(4096, 'x');
      while (fill.write(block.data(), block.size())) {
      }
    }
    std::string msg;
    try {
      H5Writer w(dir + "/none.h5");
    } catch (const std::exception& e) {
      msg = e.what();
    }
    check(msg == dir + "/none.h5: cannot create the HDF5 file (No space left on device)", "no room at all: " + msg);
    check(listing() == "fill ", "no room at all: files left: " + listing());
    std::filesystem::remove(dir + "/fill");
    // libhdf5 still writes files, and shuts down.
    const float one = 1.0f;
    {
      H5Writer w(dir + "/fits.h5", seal_userblock_size({"x"}));
      w.write("x", DType::F32, {1}, &one);
      w.commit();
    }
    check(H5Reader(dir + "/fits.h5").read_all<float>("x", DType::F32) == std::vector<float>{1.0f}, "reading back");
    H5close();  // what exit and MPI_Finalize do: crashed here on a file whose close had failed
    return failures == 0 ? 0 : 1;
  });
  if (code == 77) GTEST_SKIP() << "cannot mount a tmpfs here (needs root or unprivileged user namespaces)";
  EXPECT_EQ(code, 0) << (code < 0 ? "killed by signal " + std::to_string(-code) : "see the FAILED lines above");
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spill(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(Hdf5Seal, BlockChecksumIsStableAndIndependentOfPieces) {
  // The values are part of the file format: a changed function would make every sealed file look damaged.
  std::string bytes(3 * BlockChecksum::kBlock + 12345, '\0');
  std::mt19937 gen(5);
  for (auto& c : bytes) c = static_cast<char>(gen());
  EXPECT_EQ(block_checksum("", 0), 0xb0d5801d6ad514a2ull);
  EXPECT_EQ(block_checksum("abc", 3), 0xe77155380d32ce9full);
  EXPECT_EQ(block_checksum(bytes.data(), bytes.size()), 0x9b0eaa6a41f36571ull);
  // Any cutting of the same bytes gives the same result.
  const std::uint64_t whole = block_checksum(bytes.data(), bytes.size());
  for (const std::size_t piece : {std::size_t{1} << 20, std::size_t{1000}, std::size_t{777777}, bytes.size()}) {
    BlockChecksum c;
    for (std::size_t at = 0; at < bytes.size(); at += piece) c.update(bytes.data() + at, std::min(piece, bytes.size() - at));
    EXPECT_EQ(c.digest(), whole) << "pieces of " << piece;
    EXPECT_EQ(c.length(), bytes.size());
  }
  // A change in any block, a moved block boundary (one byte less) and swapped blocks all change it.
  for (const std::size_t at : {std::size_t{0}, BlockChecksum::kBlock + 7, bytes.size() - 1}) {
    std::string x = bytes;
    x[at] = static_cast<char>(x[at] ^ 1);
    EXPECT_NE(block_checksum(x.data(), x.size()), whole) << "byte " << at;
  }
  EXPECT_NE(block_checksum(bytes.data(), bytes.size() - 1), whole);
  std::string swapped = bytes.substr(BlockChecksum::kBlock, BlockChecksum::kBlock) +
                        bytes.substr(0, BlockChecksum::kBlock) + bytes.substr(2 * BlockChecksum::kBlock);
  EXPECT_NE(block_checksum(swapped.data(), swapped.size()), whole);
}

// A sealed file of a few datasets: a float tensor, an empty one, a scalar, a string and an empty string.
std::string write_sealed(const std::string& name, std::vector<float>& values) {
  const auto path = tmp(name);
  std::remove(path.c_str());
  values.assign(3000, 0.0f);
  for (std::size_t k = 0; k < values.size(); ++k) values[k] = 0.5f + static_cast<float>(k);
  const std::int64_t scalar = 0x0102030405060708;
  H5Writer w(path, seal_userblock_size({"g/values", "g/empty", "scalar", "text", "none"}));
  w.write("g/values", DType::F32, {1000, 3}, values.data());
  w.write("g/empty", DType::F32, {0, 3}, values.data());
  w.write("scalar", DType::I64, {}, &scalar);
  w.write_string("text", "hello, seal");
  w.write_string("none", "");
  w.attr("/", "format", "mgrl-test");
  w.commit();
  return path;
}

TEST(Hdf5Seal, SealedFileListsWhereEveryValueLiesAndStaysPlainHdf5) {
  std::vector<float> values;
  const auto path = write_sealed("sealed.h5", values);
  EXPECT_FALSE(exists(path + ".tmp." + std::to_string(::getpid())));
  EXPECT_EQ(verify_seal(path, "file"), SealState::sealed);
  const std::string bytes = slurp(path);
  EXPECT_EQ(bytes.substr(0, 16), "mgrl-sealed-hdf5");
  EXPECT_EQ(bytes.substr(512, 8), std::string("\x89HDF\r\n\x1a\n", 8)) << "a 512-byte user block, then HDF5";
  // Every non-empty dataset, in the order written, with the offset of its values from the start of the file.
  const auto entries = read_seal_entries(path);
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].name, "g/values");
  EXPECT_EQ(entries[1].name, "scalar");
  EXPECT_EQ(entries[2].name, "text");
  EXPECT_EQ(entries[3].name, "none");
  EXPECT_EQ(entries[0].size, 12000u);
  EXPECT_EQ(std::memcmp(bytes.data() + entries[0].offset, values.data(), 12000), 0);
  EXPECT_EQ(entries[0].checksum, block_checksum(values.data(), 12000));
  EXPECT_EQ(bytes.substr(entries[1].offset, 8), std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8));
  EXPECT_EQ(bytes.substr(entries[2].offset, entries[2].size), "hello, seal");
  EXPECT_EQ(entries[3].size, 1u) << "an empty string is stored as one NUL";
  for (const auto& e : entries) EXPECT_GE(e.offset, 512u) << e.name;
  // libhdf5 (and h5py, h5dump) read it as any HDF5 file: the user block is skipped.
  H5Reader r(path);
  EXPECT_EQ(r.read_all<float>("g/values", DType::F32), values);
  EXPECT_EQ(r.read_string("text"), "hello, seal");
  EXPECT_EQ(r.shape("g/empty"), (std::vector<std::uint64_t>{0, 3}));
  // Without a user block the writer seals nothing.
  const auto plain = tmp("plain.h5");
  {
    H5Writer w(plain);
    w.write("v", DType::F32, {3}, values.data());
    w.commit();
  }
  EXPECT_EQ(verify_seal(plain, "file"), SealState::unsealed_hdf5);
  EXPECT_TRUE(read_seal_entries(plain).empty());
}

TEST(Hdf5Seal, UserBlockGrowsWithTheNamesInPowersOfTwo) {
  EXPECT_EQ(seal_userblock_size({}), 512u);
  EXPECT_EQ(seal_userblock_size(std::vector<std::string>(15, std::string(1, 'x'))), 512u);  // 56 + 15 * 29 = 491
  EXPECT_EQ(seal_userblock_size(std::vector<std::string>(16, std::string(1, 'x'))), 1024u);
  EXPECT_EQ(seal_userblock_size(std::vector<std::string>(1000, std::string(100, 'x'))), 131072u);
}

// The message of the UserError that verifying path throws ("" and a failure when none is).
std::string seal_error(const std::string& path) {
  try {
    verify_seal(path, "file");
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << "does not start with the path: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << path << " verified without error";
  return "";
}

TEST(Hdf5Seal, EveryKindOfDamageIsNamed) {
  std::vector<float> values;
  const auto path = write_sealed("damaged_src.h5", values);
  const std::string good = slurp(path);
  const auto entries = read_seal_entries(path);
  const auto bad = tmp("damaged.h5");
  const auto expect = [&](const std::string& bytes, const std::string& fragment) {
    spill(bad, bytes);
    const std::string msg = seal_error(bad);
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  };
  std::string b = good;
  b[entries[0].offset + 5000] ^= 0x20;  // a value
  expect(b, "damaged file: the data of 'g/values' do not match their checksum (");
  b = good;
  b[entries[2].offset] ^= 0x01;  // the string
  expect(b, "damaged file: the data of 'text' do not match their checksum");
  b = good;
  b[512 + 9] ^= 0x01;  // HDF5's superblock
  expect(b, "damaged file: its HDF5 metadata (the bytes outside the datasets' values) do not match their checksum");
  b = good;
  b[good.size() - 1] ^= 0x01;  // the last byte (here the empty string's NUL)
  expect(b, "damaged file: ");
  b = good;
  b[511] ^= 0x01;  // the unused end of the user block
  expect(b, "damaged file: its header (the HDF5 user block) does not match its checksum");
  b = good;
  b[50] ^= 0x01;  // the stored checksum of the user block itself
  expect(b, "its header (the HDF5 user block) does not match its checksum");
  b = good;
  b[24] = 0x03;  // the user block size: not a power of two
  expect(b, "damaged file: its header is damaged (it claims a user block of ");
  expect(good.substr(0, good.size() - 1), "truncated file: it has " + std::to_string(good.size() - 1) +
                                              " bytes, its header says " + std::to_string(good.size()));
  expect(good.substr(0, 300), "truncated file: it has 300 bytes, fewer than its header's 512");
  expect(good.substr(0, 20), "truncated file: it has 20 bytes, fewer than its header");
  expect(good + "x", "corrupt file: it has " + std::to_string(good.size() + 1) + " bytes, its header says " +
                         std::to_string(good.size()) + " (bytes appended?)");
  expect("", "not an HDF5 file (an empty file)");
  expect(good.substr(0, 7), "not an HDF5 file (neither an mgrl file header nor the HDF5 signature at its start)");
  b = good;
  b[0] = 'M';  // the magic
  expect(b, "not an HDF5 file (neither an mgrl file header nor the HDF5 signature at its start)");
  spill(bad, good);
  EXPECT_EQ(verify_seal(bad, "file"), SealState::sealed) << "the copy itself is intact";
  const std::string missing = seal_error(tmp("no_such.h5"));
  EXPECT_NE(missing.find("cannot open (No such file or directory)"), std::string::npos) << missing;
}

TEST(Hdf5Seal, NewerSealFormatIsNotDamage) {
  std::vector<float> values;
  const std::string good = slurp(write_sealed("newer_src.h5", values));
  // Version 2 with a correct checksum of the user block: written by a newer mgrl, not damaged.
  std::string b = good;
  b[16] = 2;
  std::memset(&b[48], 0, 8);
  const std::uint64_t sum = checksum64(b.data(), 512);
  for (int i = 0; i < 8; ++i) b[48 + i] = static_cast<char>(sum >> (8 * i));
  const auto path = tmp("newer.h5");
  spill(path, b);
  const std::string msg = test::error_of<NewerSeal>([&] { verify_seal(path, "file"); });
  EXPECT_NE(msg.find(path + ": its integrity header has format version 2 (written by a newer mgrl), newer than "
                            "version 1, the one this mgrl reads"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace mgrl::io
