// nf4_tensor.h: one NF4-quantized weight matrix on the host (bitsandbytes' layout: packed 4-bit codes, absmax plain
// or double-quantized), and reading it from a model directory that transformers saved in bitsandbytes 4-bit form.
//
// A bnb-4bit weight W of a saved model is six tensors (kernels/cpu/nf4.h describes the layout):
//   W.weight                                U8 [(n+1)/2, 1]   packed codes, element 2i in the high nibble
//   W.weight.absmax                         F32 [blocks], or U8 [blocks] when double-quantized
//   W.weight.quant_map                      F32 [16]          the NF4 code values
//   W.weight.nested_absmax                  F32 [groups]      (double-quantized only)
//   W.weight.nested_quant_map               F32 [256]         (double-quantized only)
//   W.weight.quant_state.bitsandbytes__nf4  U8 [len]          JSON: quant_type, blocksize, dtype, shape,
//                                                             nested_blocksize, nested_dtype, nested_offset
// Reading copies the codes and statistics; nothing is dequantized.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace mgrl::io {

struct Nf4Tensor {
  std::int64_t rows = 0, cols = 0;
  std::int64_t blocksize = 64;
  std::vector<std::uint8_t> codes;  // (rows * cols + 1) / 2
  std::vector<float> code;          // 16 values (quant_map)
  bool double_quant = false;
  std::vector<float> absmax;        // plain: [blocks]; empty when double_quant
  std::vector<std::uint8_t> qabsmax;  // double_quant: [blocks]
  std::vector<float> nested_absmax;   // double_quant: [ceil(blocks / nested_blocksize)]
  std::vector<float> nested_code;     // double_quant: 256 values (nested_quant_map)
  std::int64_t nested_blocksize = 256;
  float offset = 0.0f;

  std::int64_t numel() const { return rows * cols; }
  std::int64_t blocks() const { return (numel() + blocksize - 1) / blocksize; }
};

// True when the directory holds `name` (e.g. "model.layers.0.mlp.up_proj.weight") in bitsandbytes 4-bit form.
bool has_bnb_nf4(const SafetensorsModel& m, const std::string& name);

// Reads `name` in bitsandbytes 4-bit form, checking every companion tensor (dtype, size) and the quant_state JSON
// against shape [rows, cols]. UserError naming the directory, the tensor and what is wrong: a missing companion,
// quant_type other than nf4, a blocksize other than 64, a shape other than expected, sizes that disagree.
Nf4Tensor read_bnb_nf4(const SafetensorsModel& m, const std::string& name, std::int64_t rows, std::int64_t cols);
// The same with the shape its quant_state gives (a matrix), for readers that do not know it (export's merge).
Nf4Tensor read_bnb_nf4(const SafetensorsModel& m, const std::string& name);

// True for the tensors bitsandbytes stores beside a 4-bit weight W.weight (W.weight.absmax, .quant_map,
// .nested_absmax, .nested_quant_map, .quant_state.bitsandbytes__nf4): not model parameters of their own.
bool is_bnb_companion(const std::string& name);

}  // namespace mgrl::io
