// tfevents.h: TensorBoard event files (TFRecord framing, CRC32C, hand-encoded Event protobufs); no TensorFlow, no protobuf library.
#pragma once
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

namespace mgrl::io {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF). Pass a previous
// result as `crc` to extend it over more bytes: crc32c(b, nb, crc32c(a, na)) == crc32c(a+b).
std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0);

// The TFRecord mask of a CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
std::uint32_t crc32c_mask(std::uint32_t crc);

// The byte encodings, exposed for tests.
namespace tfevents_detail {
// One TFRecord: uint64 length (LE), uint32 masked crc32c of those 8 bytes, data, uint32 masked crc32c of data.
std::string tfrecord(const std::string& data);
// Event{wall_time, file_version} (the first record of every event file).
std::string file_version_event(double wall_time, const std::string& version);
// Event{wall_time, step, summary{value{tag, simple_value}}}.
std::string scalar_event(double wall_time, std::int64_t step, const std::string& tag, float value);
}  // namespace tfevents_detail

// Writes <dir>/events.out.tfevents.<10-digit unix seconds>.<hostname> (with ".<n>" appended if that name
// exists already), creating dir if needed. The first record is Event{file_version "brain.Event:2"}.
// Output is buffered: flush() and the destructor write it out. An uncreatable directory or an unwritable
// file is a UserError naming the path.
class TfEventsWriter {
 public:
  explicit TfEventsWriter(const std::string& dir);
  ~TfEventsWriter();
  TfEventsWriter(const TfEventsWriter&) = delete;
  TfEventsWriter& operator=(const TfEventsWriter&) = delete;

  // One scalar point; value is stored as float32 (Summary.Value.simple_value).
  void scalar(const std::string& tag, double value, std::int64_t step);
  void flush();
  // Closes the file without a word (after a failed write the caller has reported).
  void abandon();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::ofstream out_;
};

}  // namespace mgrl::io
