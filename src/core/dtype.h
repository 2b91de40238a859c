// dtype.h: element types of tensors and communication buffers.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mgrl {

enum class DType : std::uint8_t { F32, F16, BF16, F64, I32, I64, U8 };  // U8: packed NF4 codes

std::size_t dtype_size(DType t);
const char* dtype_name(DType t);
bool dtype_is_float(DType t);

}  // namespace mgrl
