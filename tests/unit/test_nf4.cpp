// test_nf4.cpp: the NF4 kernels (kernels/cpu/nf4) against what bitsandbytes wrote (tests/data/nf4/blocks.safetensors):
// identical code bytes, absmax (plain and double-quantized) and dequantized floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kernels/cpu/nf4.h"

namespace {

using namespace mgrl;
namespace cpu = mgrl::kernels::cpu;

const std::string kBlocks = MGRL_TEST_DATA_DIR "/nf4/blocks.safetensors";

std::vector<float> f32(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo& t = f.get(name);
  EXPECT_EQ(t.dtype, DType::F32) << name;
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

std::vector<std::uint8_t> u8(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo& t = f.get(name);
  EXPECT_EQ(t.dtype, DType::U8) << name;
  std::vector<std::uint8_t> v(t.nbytes);
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

// Bitwise equality of float vectors; the first differing index in the message.
::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0)
      return ::testing::AssertionFailure() << "index " << i << ": " << got[i] << " vs " << want[i];
  }
  return ::testing::AssertionSuccess();
}

const char* const kCases[] = {"split_rows", "tail", "odd", "ties", "nested"};

TEST(Nf4, TablesAreBitsandbytes) {
  io::SafetensorsFile f(kBlocks);
  EXPECT_TRUE(same_bits(std::vector<float>(cpu::nf4_code(), cpu::nf4_code() + 16), f32(f, "nf4_code")));
  EXPECT_TRUE(same_bits(std::vector<float>(cpu::dynamic_code(), cpu::dynamic_code() + 256), f32(f, "dynamic_code")));
}

TEST(Nf4, QuantizeGivesBitsandbytesBytes) {
  io::SafetensorsFile f(kBlocks);
  for (const char* c : kCases) {
    SCOPED_TRACE(c);
    const std::string p = c;
    const std::vector<float> x = f32(f, p + ".input");
    const std::int64_t n = static_cast<std::int64_t>(x.size());
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(cpu::nf4_code_bytes(n)));
    std::vector<float> absmax(static_cast<std::size_t>(cpu::nf4_blocks(n)));
    cpu::nf4_quantize(x.data(), n, codes.data(), absmax.data());
    EXPECT_EQ(codes, u8(f, p + ".codes"));
    EXPECT_TRUE(same_bits(absmax, f32(f, p + ".absmax")));
  }
}

TEST(Nf4, DequantizeGivesBitsandbytesFloats) {
  io::SafetensorsFile f(kBlocks);
  for (const char* c : kCases) {
    SCOPED_TRACE(c);
    const std::string p = c;
    const std::vector<float> want = f32(f, p + ".dequant");
    const std::int64_t n = static_cast<std::int64_t>(want.size());
    std::vector<float> got(want.size());
    cpu::nf4_dequantize(u8(f, p + ".codes").data(), f32(f, p + ".absmax").data(), cpu::nf4_code(), n, got.data());
    EXPECT_TRUE(same_bits(got, want));
    // a row range of the same matrix
    const std::int64_t cols = f.get(p + ".input").shape[1];
    const std::int64_t rows = f.get(p + ".input").shape[0];
    if (rows > 2) {
      std::vector<float> part(static_cast<std::size_t>(cols * (rows - 2)));
      cpu::nf4_dequantize_range(u8(f, p + ".codes").data(), f32(f, p + ".absmax").data(), cpu::nf4_code(), cols,
                                cols * (rows - 1), part.data());
      EXPECT_TRUE(same_bits(part, std::vector<float>(want.begin() + cols, want.begin() + cols * (rows - 1))));
    }
  }
}

TEST(Nf4, DoubleQuantizationGivesBitsandbytesBytes) {
  io::SafetensorsFile f(kBlocks);
  int ulp_offsets = 0;
  for (const char* c : kCases) {
    SCOPED_TRACE(c);
    const std::string p = c;
    const std::vector<float> absmax = f32(f, p + ".absmax");
    const std::int64_t nb = static_cast<std::int64_t>(absmax.size());
    const std::int64_t groups = (nb + 255) / 256;
    const float bnb_offset = f32(f, p + ".dq.offset")[0];
    // with bitsandbytes' offset: every byte equal
    std::vector<std::uint8_t> q(absmax.size());
    std::vector<float> nested(static_cast<std::size_t>(groups));
    float offset = bnb_offset;
    cpu::nf4_double_quantize(absmax.data(), nb, q.data(), nested.data(), &offset, /*offset_given=*/true);
    EXPECT_EQ(q, u8(f, p + ".dq.absmax"));
    EXPECT_TRUE(same_bits(nested, f32(f, p + ".dq.nested_absmax")));
    // our own mean: within an ulp of torch's
    float own = 0;
    cpu::nf4_double_quantize(absmax.data(), nb, q.data(), nested.data(), &own);
    EXPECT_LE(std::fabs(own - bnb_offset), std::nextafter(bnb_offset, 1e30f) - bnb_offset) << own << " " << bnb_offset;
    ulp_offsets += own != bnb_offset;
    // dequantized absmax and weights
    std::vector<float> am(absmax.size());
    cpu::nf4_absmax_dequantize(u8(f, p + ".dq.absmax").data(), f32(f, p + ".dq.nested_absmax").data(), bnb_offset,
                               cpu::dynamic_code(), nb, am.data());
    EXPECT_TRUE(same_bits(am, f32(f, p + ".dq.absmax_f32")));
    const std::vector<float> want = f32(f, p + ".dq.dequant");
    std::vector<float> got(want.size());
    cpu::nf4_dequantize(u8(f, p + ".codes").data(), am.data(), cpu::nf4_code(), static_cast<std::int64_t>(got.size()),
                        got.data());
    EXPECT_TRUE(same_bits(got, want));
  }
  std::printf("offsets one ulp from torch's mean: %d of 5\n", ulp_offsets);
}

TEST(Nf4, StorageBytes) {
  // 4096 x 4096: 8 MiB of codes + 262144 blocks
  EXPECT_EQ(cpu::nf4_bytes(4096, 4096, false), 8388608 + 4 * 262144);
  EXPECT_EQ(cpu::nf4_bytes(4096, 4096, true), 8388608 + 262144 + 4 * 1024 + 4);
  // 3 x 7: 11 bytes of codes, one block
  EXPECT_EQ(cpu::nf4_bytes(3, 7, false), 11 + 4);
  EXPECT_EQ(cpu::nf4_bytes(3, 7, true), 11 + 1 + 4 + 4);
}

}  // namespace
