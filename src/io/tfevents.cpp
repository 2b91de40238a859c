// tfevents.cpp: TensorBoard event-file writer: CRC32C, TFRecord framing, and the protobuf wire encoding of
// tensorboard's Event / Summary messages written by hand.
//
// Event (tensorboard/compat/proto/event.proto): wall_time = 1 (double), step = 2 (int64),
//   oneof what { file_version = 3 (string), summary = 5 (Summary) }.
// Summary (tensorboard/compat/proto/summary.proto): repeated Value value = 1;
//   Value: tag = 1 (string), oneof value { simple_value = 2 (float) }.
// Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32; a key is (field << 3) | wire type.
#include "io/tfevents.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/log.h"

namespace mgrl::io {

namespace {

constexpr std::uint32_t kCastagnoliReflected = 0x82F63B78u;
constexpr std::uint32_t kMaskDelta = 0xa282ead8u;

std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kCastagnoliReflected : c >> 1;
    t[i] = c;
  }
  return t;
}

// ---- protobuf wire encoding ----
enum WireType : std::uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, std::uint32_t field, WireType type) { put_varint(out, (std::uint64_t{field} << 3) | type); }

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_double(std::string& out, std::uint32_t field, double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}

void put_float(std::string& out, std::uint32_t field, float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}

// int64 as a varint: negative values are their 64-bit two's complement (10 bytes), as protobuf does.
void put_int64(std::string& out, std::uint32_t field, std::int64_t v) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<std::uint64_t>(v));
}

void put_bytes(std::string& out, std::uint32_t field, const std::string& bytes) {
  put_key(out, field, kLen);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event fields.
constexpr std::uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
// Summary and Summary.Value fields.
constexpr std::uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2;

double now_seconds() {
  using namespace std::chrono;
  return static_cast<double>(duration_cast<microseconds>(system_clock::now().time_since_epoch()).count()) * 1e-6;
}

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc) {
  static const std::array<std::uint32_t, 256> table = make_crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return ~c;
}

std::uint32_t crc32c_mask(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

namespace tfevents_detail {

std::string tfrecord(const std::string& data) {
  std::string rec;
  rec.reserve(data.size() + 16);
  put_le(rec, data.size(), 8);
  put_le(rec, crc32c_mask(crc32c(rec.data(), 8)), 4);
  rec += data;
  put_le(rec, crc32c_mask(crc32c(data.data(), data.size())), 4);
  return rec;
}

std::string file_version_event(double wall_time, const std::string& version) {
  std::string ev;
  put_double(ev, kEventWallTime, wall_time);
  put_bytes(ev, kEventFileVersion, version);
  return ev;
}

std::string scalar_event(double wall_time, std::int64_t step, const std::string& tag, float value) {
  std::string val;  // Summary.Value; simple_value is a oneof member, so it is written even when 0
  put_bytes(val, kValueTag, tag);
  put_float(val, kValueSimpleValue, value);
  std::string summary;
  put_bytes(summary, kSummaryValue, val);
  std::string ev;
  put_double(ev, kEventWallTime, wall_time);
  if (step != 0) put_int64(ev, kEventStep, step);  // proto3 leaves a default-valued scalar out
  put_bytes(ev, kEventSummary, summary);
  return ev;
}

}  // namespace tfevents_detail

TfEventsWriter::TfEventsWriter(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw UserError(dir + ": cannot create the TensorBoard log directory (" +
                    (ec ? ec.message() : std::string("not a directory")) + ")");
  }
  const double t = now_seconds();
  char secs[32];
  std::snprintf(secs, sizeof secs, "%010lld", static_cast<long long>(t));
  const std::string base = (fs::path(dir) / ("events.out.tfevents." + std::string(secs) + "." + hostname())).string();
  path_ = base;
  for (int n = 1; fs::exists(path_, ec); ++n) path_ = base + "." + std::to_string(n);
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw UserError(path_ + ": cannot open for writing (" + std::strerror(errno) + ")");
  try {
    write_record(tfevents_detail::file_version_event(t, "brain.Event:2"));
    flush();  // the file is complete and readable from the start
  } catch (const UserError&) {
    // Its disk full: no file at all rather than an empty or cut one (left behind as 0 bytes until 2026-11-29).
    abandon();
    fs::remove(path_, ec);
    throw;
  }
}

TfEventsWriter::~TfEventsWriter() {
  if (!out_.is_open()) return;
  out_.flush();
  if (!out_) log::warn(path_ + ": writing TensorBoard events failed");
}

void TfEventsWriter::scalar(const std::string& tag, double value, std::int64_t step) {
  write_record(tfevents_detail::scalar_event(now_seconds(), step, tag, static_cast<float>(value)));
}

void TfEventsWriter::abandon() {
  out_.clear();
  out_.close();
  out_.clear();
}

void TfEventsWriter::flush() {
  out_.flush();
  if (!out_) throw UserError(path_ + ": cannot write (" + std::strerror(errno) + ")");
}

void TfEventsWriter::write_record(const std::string& data) {
  const std::string rec = tfevents_detail::tfrecord(data);
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  if (!out_) throw UserError(path_ + ": cannot write (" + std::strerror(errno) + ")");
}

}  // namespace mgrl::io
