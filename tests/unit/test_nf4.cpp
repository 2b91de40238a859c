// test_nf4.cpp: the NF4 kernels (kernels/cpu/nf4) against what bitsandbytes wrote (tests/data/nf4/blocks.safetensors):
// identical code bytes, absmax (plain and double-quantized) and dequantized floats.
#include <limits>
#include <functional>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "io/nf4_tensor.h"
#include "io/safetensors.h"
#include "kernels/cpu/nf4.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace {

using namespace mgrl;
using mgrl::test::error_of;
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

TEST(Nf4, ParallelQuantizeGivesTheSameBytes) {
  const std::int64_t n = 64 * 5000 + 37;  // several chunks, a tail block, an odd count
  std::vector<float> x(static_cast<std::size_t>(n));
  std::uint32_t h = 12345;
  for (auto& v : x) {
    h = h * 1664525u + 1013904223u;
    v = (static_cast<float>(h >> 8) / 16777216.0f - 0.5f) * ((h & 0xff) == 0 ? 8.0f : 1.0f);
  }
  std::vector<std::uint8_t> c1(static_cast<std::size_t>(cpu::nf4_code_bytes(n))), c4(c1.size());
  std::vector<float> a1(static_cast<std::size_t>(cpu::nf4_blocks(n))), a4(a1.size());
  cpu::nf4_quantize(x.data(), n, c1.data(), a1.data());
  cpu::nf4_quantize_parallel(x.data(), n, c4.data(), a4.data(), 4);
  EXPECT_EQ(c1, c4);
  EXPECT_TRUE(same_bits(a1, a4));
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

// ---- a model directory saved by transformers + bitsandbytes (tests/data/nf4/llama_nf4) ----

namespace {

const std::string kNf4Model = MGRL_TEST_DATA_DIR "/nf4/llama_nf4";
const std::string kDenseModel = MGRL_TEST_DATA_DIR "/nf4/llama_dense";

TEST(Nf4Model, ConfigHasBitsandbytes4bit) {
  const io::ModelConfig c = io::parse_hf_config(kNf4Model + "/config.json");
  ASSERT_TRUE(c.bnb4bit.has_value());
  EXPECT_TRUE(c.bnb4bit->double_quant);
  EXPECT_EQ(c.bnb4bit->compute_dtype, "float32");
  EXPECT_FALSE(io::parse_hf_config(kDenseModel + "/config.json").bnb4bit.has_value());
}

// Every projection of the saved model: read without dequantizing, and equal to what quantizing the bf16 source
// here gives (codes, 8-bit absmax, nested absmax); the embeddings, norms and lm_head stay dense.
TEST(Nf4Model, ReadsEveryProjectionAndMatchesQuantizingTheSource) {
  const io::ModelConfig c = io::parse_hf_config(kNf4Model + "/config.json");
  const io::SafetensorsModel m(kNf4Model), dense(kDenseModel);
  int projections = 0, dense_weights = 0, own_offset_diffs = 0;
  for (const io::TensorSpec& spec : io::expected_tensors(c)) {
    SCOPED_TRACE(spec.name);
    if (!io::has_bnb_nf4(m, spec.name)) {
      ++dense_weights;
      EXPECT_EQ(m.get(spec.name).dtype, DType::F32);
      continue;
    }
    ++projections;
    ASSERT_EQ(spec.shape.size(), 2u);
    const io::Nf4Tensor t = io::read_bnb_nf4(m, spec.name, spec.shape[0], spec.shape[1]);
    EXPECT_TRUE(t.double_quant);
    EXPECT_TRUE(same_bits(t.code, std::vector<float>(cpu::nf4_code(), cpu::nf4_code() + 16)));
    EXPECT_TRUE(same_bits(t.nested_code, std::vector<float>(cpu::dynamic_code(), cpu::dynamic_code() + 256)));
    const std::vector<float> w = io::to_f32(dense.get(spec.name, spec.shape));
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(cpu::nf4_code_bytes(t.numel())));
    std::vector<float> absmax(static_cast<std::size_t>(t.blocks()));
    cpu::nf4_quantize(w.data(), t.numel(), codes.data(), absmax.data());
    EXPECT_EQ(codes, t.codes);
    std::vector<std::uint8_t> q(absmax.size());
    std::vector<float> nested(t.nested_absmax.size());
    float offset = t.offset;
    cpu::nf4_double_quantize(absmax.data(), t.blocks(), q.data(), nested.data(), &offset, true);
    EXPECT_EQ(q, t.qabsmax);
    EXPECT_TRUE(same_bits(nested, t.nested_absmax));
    float own = 0;
    cpu::nf4_double_quantize(absmax.data(), t.blocks(), q.data(), nested.data(), &own);
    own_offset_diffs += own != t.offset;
    // dequantized: within the NF4 step of the source
    std::vector<float> am(absmax.size()), deq(w.size());
    cpu::nf4_absmax_dequantize(t.qabsmax.data(), t.nested_absmax.data(), t.offset, t.nested_code.data(), t.blocks(),
                               am.data());
    cpu::nf4_dequantize(t.codes.data(), am.data(), t.code.data(), t.numel(), deq.data());
    for (std::size_t i = 0; i < w.size(); ++i)
      ASSERT_LE(std::fabs(deq[i] - w[i]), 0.17f * am[i / 64] + 1e-6f) << i;
  }
  EXPECT_EQ(projections, 2 * 7);
  EXPECT_EQ(dense_weights, 1 + 2 * 2 + 1 + 1);  // embed, 2 norms a layer, final norm, lm_head
  std::printf("own offsets one ulp from torch's mean: %d of %d\n", own_offset_diffs, projections);
}

TEST(Nf4Model, BadFilesAreOneClearLine) {
  const io::SafetensorsModel m(kNf4Model);
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  EXPECT_NE(error_of([&] { io::read_bnb_nf4(m, name, 64, 32); }).find("shape [64, 64], expected [64, 32]"),
            std::string::npos);
  // a copy without the nested_absmax of q_proj
  const std::string dir = test::temp_path("nf4_broken");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kNf4Model + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const io::SafetensorsFile f(kNf4Model + "/model.safetensors");
  std::vector<io::TensorToWrite> keep;
  for (const io::TensorInfo& t : f.tensors())
    if (t.name != name + ".nested_absmax") keep.push_back({t.name, t.dtype, t.shape, t.data});
  io::write_safetensors(dir + "/model.safetensors", keep);
  const io::SafetensorsModel broken(dir);
  EXPECT_EQ(error_of([&] { io::read_bnb_nf4(broken, name, 64, 64); }),
            dir + ": tensor '" + name + "' is bitsandbytes 4-bit but '" + name + ".nested_absmax' is missing");
  // configs mgrl refuses: the fixture's config.json with another quantization_config
  const auto with_quant = [&](const std::string& file, const nlohmann::json& q) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(kNf4Model + "/config.json"));
    j["quantization_config"] = q;
    return test::write_temp(file, j.dump());
  };
  const std::string fp4 = with_quant(
      "nf4_fp4.json", {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}, {"bnb_4bit_quant_type", "fp4"}});
  EXPECT_EQ(error_of([&] { io::parse_hf_config(fp4); }),
            fp4 + ": key 'quantization_config.bnb_4bit_quant_type' is 'fp4': mgrl reads NF4 only (not fp4)");
  const std::string int8 = with_quant("nf4_int8.json", {{"quant_method", "bitsandbytes"}, {"load_in_8bit", true}});
  EXPECT_NE(error_of([&] { io::parse_hf_config(int8); }).find("not 8-bit ones"), std::string::npos);
  const std::string gptq = with_quant("nf4_gptq.json", {{"quant_method", "gptq"}, {"bits", 4}});
  EXPECT_EQ(error_of([&] { io::parse_hf_config(gptq); }),
            gptq + ": key 'quantization_config.quant_method' is 'gptq': mgrl reads bitsandbytes 4-bit (NF4) models only");
}

// A quant state with fields of the wrong type, and non-finite scales: one line naming the tensor, never a JSON
// library message (exit 1) nor NaN weights trained on (found by a user-error hunt, 2026-11-28).
TEST(Nf4Model, MistypedStateAndNonFiniteScalesAreOneClearLine) {
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  const std::string state_name = name + ".quant_state.bitsandbytes__nf4";
  const io::SafetensorsFile f(kNf4Model + "/model.safetensors");
  // A copy of the fixture whose q_proj quant state is edit(state) and whose tensor `poison` gets a NaN first value.
  int copies = 0;
  const auto copy = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& poison) {
    const std::string dir = test::temp_path("nf4_state_" + std::to_string(copies++));
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(kNf4Model + "/config.json", dir + "/config.json",
                               std::filesystem::copy_options::overwrite_existing);
    std::vector<io::TensorToWrite> keep;
    std::vector<std::vector<std::uint8_t>> held;
    for (const io::TensorInfo& t : f.tensors()) {
      const auto* bytes = reinterpret_cast<const std::uint8_t*>(t.data);
      held.emplace_back(bytes, bytes + t.nbytes);
      if (t.name == state_name) {
        nlohmann::json j = nlohmann::json::parse(std::string(held.back().begin(), held.back().end()));
        edit(j);
        const std::string text = j.dump();
        held.back().assign(text.begin(), text.end());
        keep.push_back({t.name, t.dtype, {static_cast<std::int64_t>(text.size())}, held.back().data()});
        continue;
      }
      if (t.name == poison) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(held.back().data(), &nan, sizeof nan);
      }
      keep.push_back({t.name, t.dtype, t.shape, held.back().data()});
    }
    io::write_safetensors(dir + "/model.safetensors", keep);
    return dir;
  };
  const auto error = [&](const std::string& dir) {
    const io::SafetensorsModel m(dir);
    return error_of([&] { io::read_bnb_nf4(m, name, 64, 64); });
  };
  const auto unchanged = [](nlohmann::json&) {};
  const std::string a = copy([](nlohmann::json& j) { j["quant_type"] = 4; }, "");
  EXPECT_EQ(error(a), a + ": tensor '" + state_name + "': 'quant_type' must be a string");
  const std::string b = copy([](nlohmann::json& j) { j["nested_blocksize"] = "256"; }, "");
  EXPECT_EQ(error(b), b + ": tensor '" + state_name + "': 'nested_blocksize' must be an integer");
  const std::string c = copy([](nlohmann::json& j) { j["nested_dtype"] = 1; }, "");
  EXPECT_EQ(error(c), c + ": tensor '" + state_name + "': 'nested_dtype' must be a string");
  const std::string d = copy([](nlohmann::json& j) { j["nested_offset"] = 1e300; }, "");
  EXPECT_EQ(error(d), d + ": tensor '" + state_name + "': 'nested_offset' is not a finite float32");
  const std::string e = copy(unchanged, name + ".nested_absmax");
  EXPECT_EQ(error(e), e + ": tensor '" + name + ".nested_absmax': a non-finite value at element 0 (a damaged quantized model?)");
  const std::string g = copy(unchanged, name + ".quant_map");
  EXPECT_EQ(error(g), g + ": tensor '" + name + ".quant_map': a non-finite value at element 0 (a damaged quantized model?)");
  const std::string h = copy(unchanged, "");  // the copy itself reads
  EXPECT_NO_THROW({
    const io::SafetensorsModel m(h);
    io::read_bnb_nf4(m, name, 64, 64);
  });
}

}  // namespace

// ---- the op of the CPU backend (Ops::dequantize_nf4), on bitsandbytes' double-quantized fixture ----

namespace {

TEST(Nf4Ops, CpuBackendDequantizesDoubleQuantizedRanges) {
  io::SafetensorsFile f(kBlocks);
  const std::vector<std::uint8_t> codes = u8(f, "nested.codes"), q = u8(f, "nested.dq.absmax");
  const std::vector<float> nested = f32(f, "nested.dq.nested_absmax"), want = f32(f, "nested.dq.dequant");
  const std::vector<float> absmax = f32(f, "nested.absmax");
  auto ops = kernels::make_cpu_ops();
  kernels::Nf4Weight w;
  w.codes = codes.data();
  w.code = cpu::nf4_code();
  w.qabsmax = q.data();
  w.nested_absmax = nested.data();
  w.nested_code = cpu::dynamic_code();
  w.offset = f32(f, "nested.dq.offset")[0];
  const std::int64_t cols = 832, n = static_cast<std::int64_t>(want.size());
  for (const auto& [b, e] : {std::pair<std::int64_t, std::int64_t>{0, n}, {3 * cols, 11 * cols}, {77, 16601}, {257 * 64 + 5, n}}) {  // the last: in the 2nd nested block
    std::vector<float> got(static_cast<std::size_t>(e - b));
    ops->dequantize_nf4(got.data(), w, b, e);
    EXPECT_TRUE(same_bits(got, std::vector<float>(want.begin() + b, want.begin() + e))) << b << ".." << e;
  }
  // plain absmax: the plain fixture
  kernels::Nf4Weight p;
  p.codes = codes.data();
  p.code = cpu::nf4_code();
  p.absmax = absmax.data();
  std::vector<float> got(want.size());
  ops->dequantize_nf4(got.data(), p, 0, n);
  EXPECT_TRUE(same_bits(got, f32(f, "nested.dequant")));
}

}  // namespace
