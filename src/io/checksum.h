// checksum.h: a fast 64-bit checksum of bytes, stored beside every dataset of a checkpoint so that damaged
// data is detected on reading (docs/checkpoint.md#integrity). Not cryptographic: it detects accidents
// (flipped bits, overwritten or zeroed blocks, truncation), not tampering.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mgrl::io {

// 64-bit checksum of n bytes: four independent lanes of 8-byte words (multiply-rotate mixing), merged and
// finalised with an avalanche step; the length is part of the result. Several GB/s on one core.
std::uint64_t checksum64(const void* data, std::size_t n);

// The checksum as 16 lower-case hex digits (how checkpoints store it).
std::string checksum_hex(const void* data, std::size_t n);

// A checksum of a byte stream fed in pieces of any size, in bounded memory: checksum64 of every block of
// kBlock bytes (the last one shorter), then checksum64 of those block checksums (little-endian) followed by the
// total length. Any way of cutting the same bytes into pieces gives the same result. Used for whole files
// (io/hdf5_seal.h), where the data can be larger than memory should hold twice.
class BlockChecksum {
 public:
  static constexpr std::size_t kBlock = std::size_t{1} << 20;
  void update(const void* data, std::size_t n);
  std::uint64_t digest() const;  // of everything fed so far (update may continue after it)
  std::uint64_t length() const { return total_; }

 private:
  std::string partial_;                // the bytes of the current, incomplete block
  std::string block_sums_;             // the checksums of the complete blocks, 8 bytes each
  std::uint64_t total_ = 0;
};

// The BlockChecksum of one buffer.
std::uint64_t block_checksum(const void* data, std::size_t n);

}  // namespace mgrl::io
