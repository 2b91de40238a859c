// random.h: counter-based random numbers (splitmix64), the same on the host and in CUDA kernels,
// so that a value depends only on (seed, counter) and never on the backend or the thread layout.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace mgrl {

inline constexpr std::uint64_t kGolden64 = 0x9E3779B97F4A7C15ull;

// splitmix64: a well-mixed 64-bit value of x.
MGRL_HOST_DEVICE inline std::uint64_t splitmix64(std::uint64_t x) {
  std::uint64_t z = x + kGolden64;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The counter-th value of the stream `seed`.
MGRL_HOST_DEVICE inline std::uint64_t random_bits(std::uint64_t seed, std::uint64_t counter) {
  return splitmix64(seed + kGolden64 * counter);
}

// Uniform in [0, 1) with 53 random bits.
MGRL_HOST_DEVICE inline double random_uniform(std::uint64_t seed, std::uint64_t counter) {
  return static_cast<double>(random_bits(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace mgrl
