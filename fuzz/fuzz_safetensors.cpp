// fuzz_safetensors.cpp: the safetensors reader: the 8-byte header length, the JSON header (dtypes, shapes, data
// offsets, __metadata__) checked against the file, and the conversion of every tensor to fp32.
#include <vector>

#include "fuzz/fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = mgrl::fuzz::write_input("model.safetensors", data, size);
  mgrl::fuzz::refused_ok([&] {
    mgrl::io::SafetensorsFile f(path);
    for (const auto& t : f.tensors()) {
      if (t.numel() > (1 << 20)) continue;  // a valid header may name large tensors; converting them proves nothing
      std::vector<float> out(static_cast<std::size_t>(t.numel()));
      mgrl::io::copy_to_f32(t, out.data());
    }
  });
  return 0;
}
