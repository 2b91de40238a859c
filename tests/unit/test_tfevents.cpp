// test_tfevents.cpp: TensorBoard event files: CRC32C against published vectors, exact protobuf bytes of the
// events, and written files read back by an independent TFRecord + protobuf reader that checks every frame.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/tfevents.h"
#include "tests/unit/test_util.h"

namespace mgrl::io {
namespace {

namespace fs = std::filesystem;

// ---- a small reader, written from the format description and independent of the writer's helpers ----

std::uint64_t le(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s.at(at + i));
  return v;
}

// CRC-32C bit by bit (reflected Castagnoli polynomial), independent of the writer's table-driven one.
std::uint32_t crc32c_bitwise(const char* p, std::size_t n) {
  std::uint32_t c = 0xffffffffu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= static_cast<unsigned char>(p[i]);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

// Undoes the TFRecord mask: crc = rotl(masked - delta, 15).
std::uint32_t unmask(std::uint32_t masked) {
  const std::uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

// Splits a TFRecord file into its records, checking the length CRC and the data CRC of every record.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_LE(at + 12, bytes.size()) << "truncated header at " << at;
    if (at + 12 > bytes.size()) break;
    const std::uint64_t len = le(bytes, at, 8);
    const auto len_crc = static_cast<std::uint32_t>(le(bytes, at + 8, 4));
    EXPECT_EQ(unmask(len_crc), crc32c_bitwise(bytes.data() + at, 8)) << "length crc of record " << records.size();
    EXPECT_LE(at + 12 + len + 4, bytes.size()) << "truncated record " << records.size();
    if (at + 12 + len + 4 > bytes.size()) break;
    std::string data = bytes.substr(at + 12, len);
    const auto data_crc = static_cast<std::uint32_t>(le(bytes, at + 12 + len, 4));
    EXPECT_EQ(unmask(data_crc), crc32c_bitwise(data.data(), data.size())) << "data crc of record " << records.size();
    records.push_back(std::move(data));
    at += 12 + len + 4;
  }
  return records;
}

struct Field {
  std::uint32_t number = 0;
  std::uint32_t wire = 0;
  std::uint64_t u = 0;  // varint, fixed64 or fixed32 bits
  std::string bytes;    // length-delimited
};

std::uint64_t read_varint(const std::string& s, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    const auto b = static_cast<unsigned char>(s.at(at++));
    v |= std::uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80)) return v;
  }
  ADD_FAILURE() << "varint longer than 10 bytes";
  return v;
}

std::vector<Field> parse_message(const std::string& s) {
  std::vector<Field> fields;
  std::size_t at = 0;
  while (at < s.size()) {
    Field f;
    const std::uint64_t key = read_varint(s, at);
    f.number = static_cast<std::uint32_t>(key >> 3);
    f.wire = static_cast<std::uint32_t>(key & 7);
    switch (f.wire) {
      case 0: f.u = read_varint(s, at); break;
      case 1: f.u = le(s, at, 8); at += 8; break;
      case 2: {
        const std::uint64_t n = read_varint(s, at);
        f.bytes = s.substr(at, n);
        EXPECT_EQ(f.bytes.size(), n) << "truncated field " << f.number;
        at += n;
        break;
      }
      case 5: f.u = le(s, at, 4); at += 4; break;
      default: ADD_FAILURE() << "unexpected wire type " << f.wire; return fields;
    }
    fields.push_back(std::move(f));
  }
  EXPECT_EQ(at, s.size());
  return fields;
}

struct Event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;
  bool has_scalar = false;
  std::string tag;
  float value = 0;
};

Event decode_event(const std::string& data) {
  Event ev;
  for (const Field& f : parse_message(data)) {
    if (f.number == 1) {
      EXPECT_EQ(f.wire, 1u);
      std::memcpy(&ev.wall_time, &f.u, 8);
    } else if (f.number == 2) {
      EXPECT_EQ(f.wire, 0u);
      ev.step = static_cast<std::int64_t>(f.u);
    } else if (f.number == 3) {
      EXPECT_EQ(f.wire, 2u);
      ev.file_version = f.bytes;
    } else if (f.number == 5) {
      EXPECT_EQ(f.wire, 2u);
      const auto values = parse_message(f.bytes);  // Summary: repeated Value value = 1
      EXPECT_EQ(values.size(), 1u);
      for (const Field& v : values) {
        EXPECT_EQ(v.number, 1u);
        EXPECT_EQ(v.wire, 2u);
        for (const Field& vf : parse_message(v.bytes)) {
          if (vf.number == 1) {
            EXPECT_EQ(vf.wire, 2u);
            ev.tag = vf.bytes;
          } else if (vf.number == 2) {
            EXPECT_EQ(vf.wire, 5u);
            const auto bits = static_cast<std::uint32_t>(vf.u);
            std::memcpy(&ev.value, &bits, 4);
            ev.has_scalar = true;
          } else {
            ADD_FAILURE() << "unexpected Summary.Value field " << vf.number;
          }
        }
      }
    } else {
      ADD_FAILURE() << "unexpected Event field " << f.number;
    }
  }
  return ev;
}

std::string hex(const std::string& s) {
  static const char* d = "0123456789ABCDEF";
  std::string h;
  for (unsigned char c : s) {
    if (!h.empty()) h += ' ';
    h += d[c >> 4];
    h += d[c & 15];
  }
  return h;
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = test::temp_path(name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  return dir;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().string());
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- CRC32C ----

TEST(Crc32c, KnownVectors) {
  // The CRC-32C check value, and the 32-byte vectors of RFC 3720 appendix B.4.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  unsigned char buf[32];
  std::memset(buf, 0, sizeof buf);
  EXPECT_EQ(crc32c(buf, 32), 0x8A9136AAu);
  std::memset(buf, 0xff, sizeof buf);
  EXPECT_EQ(crc32c(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(crc32c(buf, 32), 0x113FDB5Cu);
  EXPECT_EQ(crc32c_bitwise("123456789", 9), 0xE3069283u);  // the test reader's own CRC
}

TEST(Crc32c, ExtendsAcrossSplits) {
  const std::string s = "hello world, this is a longer string";
  for (std::size_t k = 0; k <= s.size(); ++k)
    EXPECT_EQ(crc32c(s.data() + k, s.size() - k, crc32c(s.data(), k)), crc32c(s.data(), s.size())) << k;
}

TEST(Crc32c, Mask) {
  EXPECT_EQ(crc32c_mask(0), 0xa282ead8u);
  EXPECT_EQ(crc32c_mask(0x00008000u), 0xa282ead9u);  // bit 15 rotates to bit 0
  EXPECT_EQ(crc32c_mask(0x00000001u), 0xa284ead8u);  // bit 0 rotates to bit 17
  for (std::uint32_t c : {0x12345678u, 0xE3069283u, 0xffffffffu}) EXPECT_EQ(unmask(crc32c_mask(c)), c);
}

// ---- exact bytes, derived by hand from the .proto field numbers and the protobuf wire format ----

TEST(TfEventsEncoding, ScalarEventBytes) {
  const std::string ev = tfevents_detail::scalar_event(1.0, 150, "loss", 1.0f);
  // 09 + double 1.0 (LE) | 10 96 01 (step 150) | 2A 0D (summary, 13 bytes) 0A 0B (value, 11 bytes)
  // 0A 04 "loss" | 15 + float 1.0 (LE)
  EXPECT_EQ(hex(ev),
            "09 00 00 00 00 00 00 F0 3F 10 96 01 2A 0D 0A 0B 0A 04 6C 6F 73 73 15 00 00 80 3F");
}

TEST(TfEventsEncoding, NegativeStepAndZeroValue) {
  const std::string ev = tfevents_detail::scalar_event(0.5, -1, "a", 0.0f);
  EXPECT_EQ(hex(ev),
            "09 00 00 00 00 00 00 E0 3F 10 FF FF FF FF FF FF FF FF FF 01 2A 0A 0A 08 0A 01 61 15 00 00 00 00");
  // Step 0 is left out (proto3 default); simple_value 0 stays (it is a oneof member).
  const std::string ev0 = tfevents_detail::scalar_event(0.5, 0, "a", 0.0f);
  EXPECT_EQ(hex(ev0), "09 00 00 00 00 00 00 E0 3F 2A 0A 0A 08 0A 01 61 15 00 00 00 00");
}

TEST(TfEventsEncoding, FileVersionEventBytes) {
  const std::string ev = tfevents_detail::file_version_event(2.0, "brain.Event:2");
  EXPECT_EQ(hex(ev), "09 00 00 00 00 00 00 00 40 1A 0D 62 72 61 69 6E 2E 45 76 65 6E 74 3A 32");
}

TEST(TfEventsEncoding, RecordFraming) {
  const std::string data = "123456789";
  const std::string rec = tfevents_detail::tfrecord(data);
  ASSERT_EQ(rec.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(hex(rec.substr(0, 8)), "09 00 00 00 00 00 00 00");
  EXPECT_EQ(unmask(static_cast<std::uint32_t>(le(rec, 8, 4))), crc32c_bitwise(rec.data(), 8));
  EXPECT_EQ(rec.substr(12, 9), data);
  EXPECT_EQ(unmask(static_cast<std::uint32_t>(le(rec, 21, 4))), 0xE3069283u);
}

// ---- files ----

TEST(TfEventsWriter, WritesReadableFile) {
  const std::string dir = fresh_dir("tfevents_dir") + "/nested/run";
  const double t0 = now_s();
  const std::string long_tag(200, 'x');  // a two-byte length varint
  std::string path;
  {
    TfEventsWriter w(dir);
    path = w.path();
    w.scalar("train/loss", 2.5, 0);
    w.scalar("train/loss", 0.1, 1);
    w.scalar("train/lr", 3e-4, 1);
    w.scalar(long_tag, -7.0, 123456789012LL);
    w.scalar("neg", 1e40, -5);  // beyond float range: +inf
    w.flush();
    // Everything is on disk after flush(), before the destructor.
    EXPECT_EQ(read_records(path).size(), 6u);
    w.scalar("after_flush", 42.0, 7);
  }
  const double t1 = now_s();

  const auto files = files_in(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0], path);
  const std::string name = fs::path(path).filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\..+)"))) << name;

  const auto records = read_records(path);
  ASSERT_EQ(records.size(), 7u);
  const Event first = decode_event(records[0]);
  EXPECT_EQ(first.file_version, "brain.Event:2");
  EXPECT_FALSE(first.has_scalar);
  EXPECT_GE(first.wall_time, t0 - 1);
  EXPECT_LE(first.wall_time, t1 + 1);
  EXPECT_EQ(name.substr(20, 10), std::to_string(static_cast<long long>(first.wall_time)));

  struct Want {
    std::string tag;
    std::int64_t step;
    float value;
  };
  const std::vector<Want> want = {{"train/loss", 0, 2.5f},
                                  {"train/loss", 1, 0.1f},
                                  {"train/lr", 1, 3e-4f},
                                  {long_tag, 123456789012LL, -7.0f},
                                  {"neg", -5, std::numeric_limits<float>::infinity()},
                                  {"after_flush", 7, 42.0f}};
  double last_time = first.wall_time;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const Event ev = decode_event(records[i + 1]);
    SCOPED_TRACE("scalar " + std::to_string(i));
    EXPECT_TRUE(ev.has_scalar);
    EXPECT_TRUE(ev.file_version.empty());
    EXPECT_EQ(ev.tag, want[i].tag);
    EXPECT_EQ(ev.step, want[i].step);
    EXPECT_EQ(ev.value, want[i].value);  // exact: the double is rounded to float once
    EXPECT_GE(ev.wall_time, last_time);
    EXPECT_LE(ev.wall_time, t1 + 1);
    last_time = ev.wall_time;
  }
  fs::remove_all(fs::path(dir).parent_path().parent_path());
}

TEST(TfEventsWriter, TwoWritersInOneDirGetTwoFiles) {
  const std::string dir = fresh_dir("tfevents_two");
  {
    TfEventsWriter a(dir);
    TfEventsWriter b(dir);
    EXPECT_NE(a.path(), b.path());
    a.scalar("a", 1, 1);
    b.scalar("b", 2, 2);
  }
  const auto files = files_in(dir);
  ASSERT_EQ(files.size(), 2u);
  for (const auto& f : files) {
    const auto records = read_records(f);
    ASSERT_EQ(records.size(), 2u) << f;
    EXPECT_EQ(decode_event(records[0]).file_version, "brain.Event:2");
  }
  fs::remove_all(dir);
}

TEST(TfEventsWriter, UncreatableDirectoryIsUserErrorNamingIt) {
  const std::string file = test::write_temp("tfevents_not_a_dir_" + std::to_string(getpid()), "x");
  const std::string dir = file + "/sub";
  const std::string msg = test::error_of([&] { TfEventsWriter w(dir); });
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
  const std::string msg2 = test::error_of([&] { TfEventsWriter w(file); });  // exists, but is a file
  EXPECT_NE(msg2.find(file), std::string::npos) << msg2;
  std::remove(file.c_str());
}

TEST(TfEventsWriter, UnwritableFileIsUserErrorNamingIt) {
  // A directory where no file can be created, even by root: /proc/self.
  if (!fs::is_directory("/proc/self")) GTEST_SKIP() << "no /proc";
  const std::string msg = test::error_of([&] { TfEventsWriter w("/proc/self"); });
  EXPECT_NE(msg.find("/proc/self/events.out.tfevents."), std::string::npos) << msg;
  if (geteuid() != 0) {  // permissions do not stop root
    const std::string dir = fresh_dir("tfevents_ro");
    fs::create_directories(dir);
    chmod(dir.c_str(), 0555);
    const std::string msg2 = test::error_of([&] { TfEventsWriter w(dir); });
    EXPECT_NE(msg2.find(dir + "/events.out.tfevents."), std::string::npos) << msg2;
    chmod(dir.c_str(), 0755);
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace mgrl::io
