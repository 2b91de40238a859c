// sample_select.h: the radix selection of the CUDA sampler's top-k and top-p thresholds (sampling.cu) in plain
// C++, shared by the kernel and the CPU test tests/unit/test_sample_select.cpp, which checks it against the
// bit-by-bit search it replaces.
//
// Both thresholds are a 32-bit order key (order_key: a < b <=> key(a) < key(b)):
//   top-k: the largest K with count(key >= K) >= k, i.e. the key of the k-th largest logit;
//   top-p: the largest K with mass(key >= max(K, kmin)) >= top_p (0 when none), mass = sum of p over the tokens.
// Instead of 32 passes over the row (one per bit), 4 passes of 8 bits: pass j builds a 256-bin histogram (counts,
// or masses) of the tokens whose key agrees with the prefix chosen so far in its top 8j bits, by their next 8 bits,
// and picks that digit from the histogram alone.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace mgrl::kernels::cuda::sample_select {

inline constexpr int kRadixBins = 256;
inline constexpr int kRadixPasses = 4;

// Order-preserving key of a logit: a < b  <=>  order_key(a) < order_key(b) (not NaN); -0 and +0 share a key.
MGRL_HOST_DEVICE inline std::uint32_t order_key(float z) {
  if (z == 0.0f) z = 0.0f;
#if defined(__CUDA_ARCH__)
  const std::uint32_t u = __float_as_uint(z);
#else
  std::uint32_t u;
  std::memcpy(&u, &z, sizeof u);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The bit position of pass `pass`'s digit (24, 16, 8, 0).
MGRL_HOST_DEVICE inline int radix_shift(int pass) { return 24 - 8 * pass; }

// The histogram bin of `key` in pass `pass` (0 = the top 8 bits), or -1 when the key does not take part: below kmin,
// or its higher digits differ from `prefix` (the digits chosen by the passes before; its lower bits are 0).
MGRL_HOST_DEVICE inline int radix_bin(std::uint32_t key, std::uint32_t prefix, int pass, std::uint32_t kmin) {
  if (key < kmin) return -1;
  const int shift = radix_shift(pass);
  if (pass > 0 && (key >> (shift + 8)) != (prefix >> (shift + 8))) return -1;
  return static_cast<int>((key >> shift) & 0xffu);
}

// Top-k: the digit of the sought key from the counts H[256] of this pass; *rank (1-based, at most the sum of H) is
// the sought key's rank among the counted keys, largest first, and becomes its rank within the chosen bin.
MGRL_HOST_DEVICE inline int radix_pick_count(const int* H, int* rank) {
  for (int b = kRadixBins - 1; b > 0; --b) {
    if (*rank <= H[b]) return b;
    *rank -= H[b];
  }
  return 0;
}

// Top-p: the largest digit b with above + sum_{b' >= b} H[b'] >= top_p, from the masses H[256] of this pass;
// *above (the mass of the keys above the prefix) gains the bins above b. When no digit reaches top_p, 0 (the keys
// with the prefix and zero lower bits: the prefix an earlier pass accepted, or 0 at the first pass).
MGRL_HOST_DEVICE inline int radix_pick_mass(const double* H, double* above, double top_p) {
  double s = *above;
  for (int b = kRadixBins - 1; b > 0; --b) {
    const double with = s + H[b];
    if (with >= top_p) {
      *above = s;
      return b;
    }
    s = with;
  }
  *above = s;
  return 0;
}

// The prefix after a pass chose `digit`.
MGRL_HOST_DEVICE inline std::uint32_t radix_extend(std::uint32_t prefix, int pass, int digit) {
  return prefix | (static_cast<std::uint32_t>(digit) << radix_shift(pass));
}

}  // namespace mgrl::kernels::cuda::sample_select
