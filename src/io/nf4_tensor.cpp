// nf4_tensor.cpp: reading an NF4 weight that transformers + bitsandbytes saved (nf4_tensor.h).
#include "io/nf4_tensor.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include <cstring>

#include "core/error.h"

namespace mgrl::io {

namespace {

constexpr const char* kStateSuffix = ".quant_state.bitsandbytes__nf4";

std::string where(const SafetensorsModel& m, const std::string& name) {
  return m.dir() + ": tensor '" + m.stored_name(name) + "'";
}

const TensorInfo& companion(const SafetensorsModel& m, const std::string& name, const std::string& suffix,
                            DType dtype, std::int64_t numel) {
  const TensorInfo* t = m.find(name + suffix);
  if (!t) throw UserError(where(m, name) + " is bitsandbytes 4-bit but '" + name + suffix + "' is missing");
  if (t->dtype != dtype)
    throw UserError(where(m, name + suffix) + " has dtype " + safetensors_dtype_name(t->dtype) + ", expected " +
                    safetensors_dtype_name(dtype));
  if (numel >= 0 && t->numel() != numel)
    throw UserError(where(m, name + suffix) + " has " + std::to_string(t->numel()) + " elements, expected " +
                    std::to_string(numel));
  return *t;
}

template <typename T>
std::vector<T> copy_of(const TensorInfo& t) {
  std::vector<T> v(static_cast<std::size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.data, v.size() * sizeof(T));
  return v;
}

}  // namespace

bool is_bnb_companion(const std::string& name) {
  static const char* const kSuffixes[] = {".weight.absmax", ".weight.quant_map", ".weight.nested_absmax",
                                          ".weight.nested_quant_map", ".weight.quant_state.bitsandbytes__nf4"};
  for (const char* suf : kSuffixes) {
    const std::size_t n = std::strlen(suf);
    if (name.size() > n && name.compare(name.size() - n, n, suf) == 0) return true;
  }
  return false;
}

bool has_bnb_nf4(const SafetensorsModel& m, const std::string& name) {
  return m.find(name + kStateSuffix) != nullptr;
}

namespace {
// The tensor's quant state, parsed once.
nlohmann::json quant_state(const SafetensorsModel& m, const std::string& name) {
  const TensorInfo& st = companion(m, name, kStateSuffix, DType::U8, -1);
  try {
    return nlohmann::json::parse(std::string(reinterpret_cast<const char*>(st.data), st.nbytes));
  } catch (const nlohmann::json::exception&) {
    throw UserError(where(m, name + kStateSuffix) + " is not the JSON of a bitsandbytes quant state");
  }
}

Nf4Tensor read_bnb_nf4(const SafetensorsModel& m, const std::string& name, const nlohmann::json& j, std::int64_t rows,
                       std::int64_t cols) {
  using nlohmann::json;
  const std::string state_name = name + kStateSuffix;
  auto bad = [&](const std::string& what) { return UserError(where(m, state_name) + ": " + what); };
  if (!j.is_object()) throw bad("not a JSON object");
  // Typed reads: a field of another type is the file's mistake, named (json::value would throw a library error).
  const auto text = [&](const char* key, const std::string& absent) {
    if (!j.contains(key)) return absent;
    if (!j[key].is_string()) throw bad(std::string("'") + key + "' must be a string");
    return j[key].get<std::string>();
  };
  const auto integer = [&](const char* key, std::int64_t absent) {
    if (!j.contains(key)) return absent;
    if (!j[key].is_number_integer()) throw bad(std::string("'") + key + "' must be an integer");
    return j[key].get<std::int64_t>();
  };
  // Scales of the dequantization: a non-finite one makes every weight of its block NaN or infinite.
  const auto finite = [&](const std::vector<float>& v, const std::string& what) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        throw UserError(where(m, name + what) + ": a non-finite value at element " + std::to_string(i) +
                        " (a damaged quantized model?)");
  };
  const std::string type = text("quant_type", std::string());
  if (type != "nf4") throw bad("quant_type is '" + type + "': mgrl reads NF4 only");
  if (!j.contains("blocksize") || !j["blocksize"].is_number_integer()) throw bad("no integer 'blocksize'");
  Nf4Tensor t;
  t.rows = rows;
  t.cols = cols;
  t.blocksize = j["blocksize"].get<std::int64_t>();
  if (t.blocksize != 64) throw bad("blocksize " + std::to_string(t.blocksize) + ": mgrl reads blocks of 64 only");
  if (!j.contains("shape") || !j["shape"].is_array()) throw bad("no 'shape' list");
  Shape shape;
  for (const json& d : j["shape"]) {
    if (!d.is_number_integer()) throw bad("'shape' must hold integers");
    shape.push_back(d.get<std::int64_t>());
  }
  if (shape != Shape{rows, cols})
    throw bad("shape " + shape_str(shape) + ", expected " + shape_str(Shape{rows, cols}));

  const std::int64_t n = rows * cols;
  const TensorInfo& w = m.get(name);
  if (w.dtype != DType::U8 || w.numel() != (n + 1) / 2)
    throw UserError(where(m, name) + " has dtype " + safetensors_dtype_name(w.dtype) + " and " +
                    std::to_string(w.numel()) + " elements; packed NF4 codes of " + shape_str(shape) + " are U8 x " +
                    std::to_string((n + 1) / 2));
  t.codes = copy_of<std::uint8_t>(w);
  m.release_pages(w);  // copied: the file's pages of it leave this process's memory
  t.code = copy_of<float>(companion(m, name, ".quant_map", DType::F32, 16));
  finite(t.code, ".quant_map");
  const std::int64_t blocks = t.blocks();
  t.double_quant = j.contains("nested_offset");
  if (!t.double_quant) {
    t.absmax = copy_of<float>(companion(m, name, ".absmax", DType::F32, blocks));
    finite(t.absmax, ".absmax");
    return t;
  }
  if (!j["nested_offset"].is_number()) throw bad("'nested_offset' must be a number");
  t.offset = j["nested_offset"].get<float>();
  if (!std::isfinite(t.offset)) throw bad("'nested_offset' is not a finite float32");
  t.nested_blocksize = integer("nested_blocksize", 256);
  if (t.nested_blocksize != 256)
    throw bad("nested_blocksize " + std::to_string(t.nested_blocksize) + ": mgrl reads groups of 256 only");
  const std::string nested_dtype = text("nested_dtype", "float32");
  if (nested_dtype != "float32") throw bad("nested_dtype is '" + nested_dtype + "': mgrl reads float32 only");
  t.qabsmax = copy_of<std::uint8_t>(companion(m, name, ".absmax", DType::U8, blocks));
  t.nested_absmax = copy_of<float>(
      companion(m, name, ".nested_absmax", DType::F32, (blocks + t.nested_blocksize - 1) / t.nested_blocksize));
  t.nested_code = copy_of<float>(companion(m, name, ".nested_quant_map", DType::F32, 256));
  finite(t.nested_absmax, ".nested_absmax");
  finite(t.nested_code, ".nested_quant_map");
  return t;
}
}  // namespace

Nf4Tensor read_bnb_nf4(const SafetensorsModel& m, const std::string& name, std::int64_t rows, std::int64_t cols) {
  return read_bnb_nf4(m, name, quant_state(m, name), rows, cols);
}

Nf4Tensor read_bnb_nf4(const SafetensorsModel& m, const std::string& name) {
  const nlohmann::json j = quant_state(m, name);
  const nlohmann::json* shape = j.is_object() && j.contains("shape") ? &j["shape"] : nullptr;
  if (!shape || !shape->is_array() || shape->size() != 2 || !(*shape)[0].is_number_integer() ||
      !(*shape)[1].is_number_integer())
    throw UserError(where(m, name + kStateSuffix) + ": 'shape' is not the [rows, cols] of a matrix");
  return read_bnb_nf4(m, name, j, (*shape)[0].get<std::int64_t>(), (*shape)[1].get<std::int64_t>());
}

}  // namespace mgrl::io
