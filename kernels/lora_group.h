// lora_group.h: a LoRA group, the adapters of 1 to 3 linear layers that read the same input x (q|k|v, gate|up), run
// as one stacked product where they touch x; shared by the op interface and both backends.
#pragma once
#include <cstddef>

namespace mgrl::kernels {

// Most members of a group (q, k, v).
inline constexpr int kMaxLoraGroup = 3;

// One member: its own adapter A [r, in] (f32, PEFT lora_A), B [out, r] (f32, PEFT lora_B), scale, the saved
// xa = x A^T [T, r] (f32, written by the forward, read by the backward), its output y [T, out] (forward, storage
// dtype, accumulated onto) or output gradient dy [T, out] (backward), and its gradients dA, dB (f32, accumulated;
// null: not wanted). The rank r and the input x [T, in] are the group's.
struct LoraMember {
  void* y = nullptr;
  const void* dy = nullptr;
  float* xa = nullptr;
  const float* A = nullptr;
  const float* B = nullptr;
  float* dA = nullptr;
  float* dB = nullptr;
  float scale = 1.0f;
  int out = 0;
};

// The f32 scratch a group op of n members over T rows of width in takes (CPU; the CUDA backend takes its own
// stream-ordered scratch and ignores the caller's): the stacked [T, n r] product and the stacked [n r, in] operand.
inline std::size_t lora_group_scratch_floats(int T, int in, int r, int n) {
  const std::size_t nr = static_cast<std::size_t>(n) * static_cast<std::size_t>(r);
  return static_cast<std::size_t>(T) * nr + nr * static_cast<std::size_t>(in);
}

}  // namespace mgrl::kernels
