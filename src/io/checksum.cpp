// checksum.cpp: checksum64 (see checksum.h). Bytes are read as little-endian 64-bit words with memcpy (any
// alignment); the result is the same on every little-endian host, which is what mgrl runs on.
#include "io/checksum.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace mgrl::io {
namespace {

// Odd 64-bit constants with well-spread bits (the fractional digits of the golden ratio and of sqrt(2), sqrt(3),
// sqrt(5), sqrt(7)); any odd constants with many set bits would do.
constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;
constexpr std::uint64_t kM1 = 0x6a09e667f3bcc909ull;
constexpr std::uint64_t kM2 = 0xbb67ae8584caa73bull;
constexpr std::uint64_t kM3 = 0x3c6ef372fe94f82bull | 1ull;
constexpr std::uint64_t kM4 = 0xa54ff53a5f1d36f1ull;

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline std::uint64_t load64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// One word into one lane: add, rotate, multiply (each step is invertible, so no two words collide in a lane).
inline std::uint64_t lane(std::uint64_t acc, std::uint64_t word) { return rotl(acc + word * kM2, 31) * kM1; }

// Final avalanche: every input bit affects every output bit.
inline std::uint64_t avalanche(std::uint64_t h) {
  h ^= h >> 33;
  h *= kM4;
  h ^= h >> 29;
  h *= kM3;
  h ^= h >> 32;
  return h;
}

}  // namespace

std::uint64_t checksum64(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + n;
  std::uint64_t a = kGolden, b = kM1, c = kM2, d = kM4;
  while (end - p >= 32) {
    a = lane(a, load64(p));
    b = lane(b, load64(p + 8));
    c = lane(c, load64(p + 16));
    d = lane(d, load64(p + 24));
    p += 32;
  }
  std::uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18);
  h = (h ^ lane(0, a)) * kM1 + kM4;
  h = (h ^ lane(0, b)) * kM1 + kM4;
  h = (h ^ lane(0, c)) * kM1 + kM4;
  h = (h ^ lane(0, d)) * kM1 + kM4;
  h += static_cast<std::uint64_t>(n) * kGolden;
  while (end - p >= 8) {
    h = rotl(h ^ lane(0, load64(p)), 27) * kM1 + kM4;
    p += 8;
  }
  while (p < end) {
    h = rotl(h ^ (static_cast<std::uint64_t>(*p) * kM3), 11) * kM1;
    ++p;
  }
  return avalanche(h);
}

namespace {
void append_u64(std::string& out, std::uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out.append(b, 8);
}
}  // namespace

void BlockChecksum::update(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (!partial_.empty()) {  // fill the current block first
    const std::size_t take = std::min(n, kBlock - partial_.size());
    partial_.append(reinterpret_cast<const char*>(p), take);
    p += take;
    n -= take;
    if (partial_.size() < kBlock) return;
    append_u64(block_sums_, checksum64(partial_.data(), partial_.size()));
    partial_.clear();
  }
  for (; n >= kBlock; p += kBlock, n -= kBlock) append_u64(block_sums_, checksum64(p, kBlock));  // whole blocks in place
  partial_.assign(reinterpret_cast<const char*>(p), n);
}

std::uint64_t BlockChecksum::digest() const {
  std::string sums = block_sums_;
  if (!partial_.empty()) append_u64(sums, checksum64(partial_.data(), partial_.size()));
  append_u64(sums, total_);
  return checksum64(sums.data(), sums.size());
}

std::uint64_t block_checksum(const void* data, std::size_t n) {
  BlockChecksum c;
  c.update(data, n);
  return c.digest();
}

std::string checksum_hex(const void* data, std::size_t n) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(checksum64(data, n)));
  return buf;
}

}  // namespace mgrl::io
