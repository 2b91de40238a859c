// nf4.h: NF4 4-bit weights in bitsandbytes' layout (QLoRA): quantize (bit-equal to bitsandbytes), dequantize, the
// double-quantized absmax, and the storage size.
//
// The layout (bitsandbytes 0.50, as transformers saves a bnb-4bit model):
// - The tensor is flattened row-major; blocks of kNf4Block = 64 consecutive values (the last block may be shorter,
//   and may straddle rows: blocks ignore the row structure).
// - absmax[b] = max |x| over block b (fp32). A value's code is the index of the nearest of the 16 NF4 values
//   (nf4_code(), sorted ascending, code 7 is 0.0) to x / absmax, clamped to [-1, 1].
// - Two codes per byte: element 2i in the HIGH nibble, element 2i+1 in the LOW nibble; an odd count pads the last
//   low nibble with code 7 (0.0). transformers stores the bytes as a uint8 tensor of shape [(n+1)/2, 1].
// - Double quantization (bnb_4bit_use_double_quant): offset = mean(absmax) (fp32); absmax - offset is quantized to
//   8 bits with bitsandbytes' signed dynamic code (dynamic_code(), 256 values) in blocks of kNf4NestedBlock = 256
//   absmax values, each with its own fp32 nested absmax. Dequantized: absmax[b] = dynamic_code[q[b]] *
//   nested_absmax[b / 256] + offset.
// - Dequantized value: nf4_code[code] * absmax[block], one fp32 multiply.
//
// Rounding (what makes the bytes equal to bitsandbytes' CPU path, which tests/unit/test_nf4.cpp checks):
// - 4-bit codes: full blocks scale by r = 1.0f / max(absmax, 1e-38f) and multiply; the tail block divides by
//   max(absmax, 1e-38f) (and stores that clamped absmax); a scaled value exactly on the fp32 midpoint
//   (c[i] + c[i+1]) / 2 of two codes takes the LOWER code.
// - 8-bit absmax codes: bitsandbytes' CPU quantizer multiplies by 1 / (its block's max |absmax - offset|) and
//   looks the result up in a 65536-entry table over [-1, 1] (nf4.cpp says how), which near a midpoint can pick
//   the farther code; nf4_double_quantize does the same.
// - The offset: bitsandbytes takes torch's fp32 mean, whose summation order depends on the CPU's vector width;
//   nf4_double_quantize sums in double. It can differ from torch's by an ulp, which can move an 8-bit absmax code
//   by one. Loading a saved bnb model uses the stored offset, so loading is always exact.
// bitsandbytes' CUDA quantizer (a model quantized on a GPU) uses decimal threshold constants for NF4 and another
// 8-bit search, so a GPU-quantized model can differ in rare codes from what quantizing here gives.
#pragma once
#include <cstdint>

namespace mgrl::kernels::cpu {

inline constexpr std::int64_t kNf4Block = 64;
inline constexpr std::int64_t kNf4NestedBlock = 256;

const float* nf4_code();      // the 16 NF4 values, ascending, [-1, 1]
const float* dynamic_code();  // bitsandbytes' signed 8-bit dynamic code (create_dynamic_map()), 256 values, ascending

inline std::int64_t nf4_blocks(std::int64_t n) { return (n + kNf4Block - 1) / kNf4Block; }
inline std::int64_t nf4_nested_blocks(std::int64_t n) {
  return (nf4_blocks(n) + kNf4NestedBlock - 1) / kNf4NestedBlock;
}
inline std::int64_t nf4_code_bytes(std::int64_t n) { return (n + 1) / 2; }

// Bytes an NF4 weight of rows x cols holds: the packed codes plus its absmax (fp32 per block; or, double-quantized,
// one byte per block + fp32 nested absmax per 256 blocks + the fp32 offset). The shared code tables (16 + 256
// floats per tensor in a saved file) are not counted.
std::int64_t nf4_bytes(std::int64_t rows, std::int64_t cols, bool double_quant);

// x[n] (finite) -> codes[nf4_code_bytes(n)], absmax[nf4_blocks(n)].
void nf4_quantize(const float* x, std::int64_t n, std::uint8_t* codes, float* absmax);
// The same on up to `threads` host threads (blocks are independent; the bytes are nf4_quantize's): quantizing a
// large model at load.
void nf4_quantize_parallel(const float* x, std::int64_t n, std::uint8_t* codes, float* absmax, int threads);

// absmax[nblocks] -> qabsmax[nblocks], nested_absmax[ceil(nblocks/256)], *offset. With offset_given, *offset is an
// input (bitsandbytes' own fp32 mean, for bit-equal results) instead of computed here.
void nf4_double_quantize(const float* absmax, std::int64_t nblocks, std::uint8_t* qabsmax, float* nested_absmax,
                         float* offset, bool offset_given = false);

// The inverse: absmax[b] = nested_code[qabsmax[b]] * nested_absmax[b / 256] + offset. nested_code: the 256-value
// table stored with the tensor (nested_quant_map), or dynamic_code().
void nf4_absmax_dequantize(const std::uint8_t* qabsmax, const float* nested_absmax, float offset,
                           const float* nested_code, std::int64_t nblocks, float* absmax);

// codes, absmax -> out[n] (fp32). code: the 16-value table (quant_map of a saved tensor, or nf4_code()).
// Elements [begin, end) only with the _range form (a row range of a matrix: begin = r0 * cols, end = r1 * cols),
// written to out[0 .. end - begin).
void nf4_dequantize(const std::uint8_t* codes, const float* absmax, const float* code, std::int64_t n, float* out);
void nf4_dequantize_range(const std::uint8_t* codes, const float* absmax, const float* code, std::int64_t begin,
                          std::int64_t end, float* out);

}  // namespace mgrl::kernels::cpu
