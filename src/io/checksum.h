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

}  // namespace mgrl::io
