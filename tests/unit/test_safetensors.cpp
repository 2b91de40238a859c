// test_safetensors.cpp: safetensors writer/reader round trips, every corruption a UserError naming the file,
// sharded model directories, and the fp16/bf16 <-> fp32 conversions checked on all 65536 values.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "io/safetensors.h"
#include "tests/unit/test_util.h"

namespace mgrl::io {
namespace {

using Bytes = std::vector<unsigned char>;

std::string tmp_path(const std::string& name) { return test::temp_path("st_" + name); }

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// A file from a header text and data bytes (the header length is the text's length).
Bytes make_file(const std::string& header, const Bytes& data) {
  Bytes b(8 + header.size() + data.size());
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(n >> (8 * i));
  std::copy(header.begin(), header.end(), b.begin() + 8);
  std::copy(data.begin(), data.end(), b.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return b;
}


std::string header_text(const Bytes& file) {
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(file[i]) << (8 * i);
  return std::string(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(n));
}

// Test data of every dtype.
struct Sample {
  std::vector<float> f32{1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-20f};
  std::vector<std::uint16_t> f16{0x3c00, 0xc000, 0x0001, 0x7c00};  // 1, -2, smallest subnormal, inf
  std::vector<std::uint16_t> bf16{0x3f80, 0xbfc0, 0x4049, 0x0000, 0x8000, 0x7f80};
  std::vector<double> f64{3.141592653589793, -1e300};
  std::vector<std::int32_t> i32{1, -2, 3, 2147483647, -2147483647 - 1};
  std::vector<std::int64_t> i64{1, -1, 9007199254740993LL, -5};
  float scalar = 42.0f;

  std::vector<TensorToWrite> tensors() const {
    return {
        {"weights.f32", DType::F32, {2, 3}, f32.data()},
        {"a.f16", DType::F16, {4}, f16.data()},
        {"b.bf16", DType::BF16, {3, 1, 2}, bf16.data()},
        {"c.f64", DType::F64, {2}, f64.data()},
        {"d.i32", DType::I32, {5}, i32.data()},
        {"e.i64", DType::I64, {2, 2}, i64.data()},
        {"scalar", DType::F32, {}, &scalar},
        {"empty", DType::F32, {0, 3}, nullptr},
    };
  }
};

std::string write_sample(const std::string& name, const Sample& s) {
  const std::string p = tmp_path(name);
  write_safetensors(p, s.tensors(), {{"format", "pt"}, {"producer", "mgrl test"}});
  return p;
}

TEST(Safetensors, RoundTripEveryDtype) {
  const Sample s;
  const std::string p = write_sample("roundtrip.safetensors", s);
  const SafetensorsFile f(p);
  EXPECT_EQ(f.path(), p);
  const auto written = s.tensors();
  ASSERT_EQ(f.tensors().size(), written.size());
  for (const TensorToWrite& w : written) {
    SCOPED_TRACE(w.name);
    const TensorInfo* t = f.find(w.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, w.name);
    EXPECT_EQ(t->dtype, w.dtype);
    EXPECT_EQ(t->shape, w.shape);
    EXPECT_EQ(t->file, p);
    const std::size_t nbytes = static_cast<std::size_t>(shape_numel(w.shape)) * dtype_size(w.dtype);
    ASSERT_EQ(t->nbytes, nbytes);
    if (nbytes) {
      EXPECT_EQ(std::memcmp(t->data, w.data, nbytes), 0);
    }
  }
  EXPECT_EQ(f.get("scalar").numel(), 1);
  EXPECT_EQ(f.get("empty").numel(), 0);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("producer"), "mgrl test");
  EXPECT_EQ(f.find("nope"), nullptr);
  const std::string msg = test::error_of([&] { f.get("nope"); });
  EXPECT_EQ(msg, p + ": tensor 'nope' not found");
  // tensors() lists them in data order, which is the order they were written in.
  EXPECT_EQ(f.tensors().front().name, "weights.f32");
}

TEST(Safetensors, HeaderLayout) {
  const Sample s;
  const Bytes file = read_bytes(write_sample("layout.safetensors", s));
  const std::string h = header_text(file);
  // Padded with spaces to a multiple of 8, so the data starts 8-byte aligned.
  EXPECT_EQ(h.size() % 8, 0u);
  EXPECT_EQ(h.front(), '{');
  const std::size_t close = h.find_last_of('}');
  EXPECT_EQ(h.substr(close + 1), std::string(h.size() - close - 1, ' '));
  // Keys sorted: __metadata__ first, then tensors by name.
  std::vector<std::size_t> pos;
  for (const char* k : {"\"__metadata__\"", "\"a.f16\"", "\"b.bf16\"", "\"c.f64\"", "\"d.i32\"", "\"e.i64\"",
                        "\"empty\"", "\"scalar\"", "\"weights.f32\""}) {
    pos.push_back(h.find(k));
    ASSERT_NE(pos.back(), std::string::npos) << k;
  }
  EXPECT_TRUE(std::is_sorted(pos.begin(), pos.end()));
  // Data in the order given: weights.f32 first.
  EXPECT_NE(h.find("\"weights.f32\":{\"data_offsets\":[0,24],\"dtype\":\"F32\",\"shape\":[2,3]}"),
            std::string::npos)
      << h;
  // The total size is exactly header + data.
  std::size_t data = 0;
  for (const auto& t : s.tensors()) data += static_cast<std::size_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
  EXPECT_EQ(file.size(), 8 + h.size() + data);
}

TEST(Safetensors, WriterIsDeterministicAndLeavesNoTmp) {
  const Sample s;
  const std::string a = write_sample("det_a.safetensors", s);
  const std::string b = write_sample("det_b.safetensors", s);
  EXPECT_EQ(read_bytes(a), read_bytes(b));
  EXPECT_FALSE(exists(a + ".tmp"));
  EXPECT_FALSE(exists(b + ".tmp"));
  // Overwriting replaces the file whole.
  const float one = 1.0f;
  write_safetensors(a, {{"x", DType::F32, {1}, &one}});
  EXPECT_FALSE(exists(a + ".tmp"));
  const SafetensorsFile f(a);
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(to_f32(f.get("x")), std::vector<float>{1.0f});
}

TEST(Safetensors, WriterErrors) {
  const float one = 1.0f;
  const std::string p = ::testing::TempDir() + "no/such/dir/x.safetensors";
  const std::string msg = test::error_of([&] { write_safetensors(p, {{"x", DType::F32, {1}, &one}}); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_THROW(write_safetensors(tmp_path("dup.safetensors"),
                                 {{"x", DType::F32, {1}, &one}, {"x", DType::F32, {1}, &one}}),
               FatalError);
  EXPECT_THROW(write_safetensors(tmp_path("null.safetensors"), {{"x", DType::F32, {1}, nullptr}}), FatalError);
}

TEST(Safetensors, EmptyFileOfNoTensors) {
  const std::string p = tmp_path("none.safetensors");
  write_safetensors(p, {});
  const SafetensorsFile f(p);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(header_text(read_bytes(p)), "{}      ");
}

TEST(Safetensors, MoveKeepsTheMapping) {
  static_assert(!std::is_copy_constructible_v<SafetensorsFile>);
  static_assert(!std::is_copy_assignable_v<SafetensorsFile>);
  static_assert(std::is_nothrow_move_constructible_v<SafetensorsFile>);
  static_assert(!std::is_copy_constructible_v<SafetensorsModel>);
  const Sample s;
  SafetensorsFile a(write_sample("move.safetensors", s));
  const TensorInfo* before = a.find("c.f64");
  SafetensorsFile b(std::move(a));
  const TensorInfo* t = b.find("c.f64");
  EXPECT_EQ(t, before);  // the same entry, still pointing into the same mapping
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(std::memcmp(t->data, s.f64.data(), 16), 0);
  SafetensorsFile c(write_sample("move2.safetensors", s));
  c = std::move(b);
  EXPECT_EQ(std::memcmp(c.get("d.i32").data, s.i32.data(), 20), 0);
}

// ---- corrupt files: each a UserError naming the file (and the tensor) ----

// The message of opening the file made of these bytes; checks it names the file.
std::string open_error(const std::string& name, const Bytes& bytes) {
  const std::string p = tmp_path(name);
  write_bytes(p, bytes);
  const std::string msg = test::error_of([&] { SafetensorsFile f(p); });
  EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  return msg;
}

TEST(SafetensorsCorrupt, TruncatedAnywhere) {
  const Sample s;
  const Bytes good = read_bytes(write_sample("good.safetensors", s));
  const std::size_t n = header_text(good).size();
  for (const std::size_t cut : {std::size_t{0}, std::size_t{3}, std::size_t{7}, std::size_t{8}, 8 + n / 2,
                                8 + n - 1, 8 + n, 8 + n + 1, 8 + n + 24, good.size() - 1}) {
    SCOPED_TRACE(cut);
    const std::string msg = open_error("cut.safetensors", Bytes(good.begin(), good.begin() + cut));
    if (cut < 8) {
      EXPECT_NE(msg.find("shorter than the 8-byte header length"), std::string::npos) << msg;
    } else if (cut < 8 + n) {
      EXPECT_NE(msg.find("exceeds the file size"), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
      EXPECT_NE(msg.find("tensor '"), std::string::npos) << msg;
    }
  }
}

TEST(SafetensorsCorrupt, HeaderLength) {
  const Sample s;
  Bytes bad = read_bytes(write_sample("len.safetensors", s));
  bad[7] ^= 0x80;  // a huge length
  EXPECT_NE(open_error("len_huge.safetensors", bad).find("exceeds the file size"), std::string::npos);
  bad[7] ^= 0x80;
  bad[0] ^= 0x01;  // one byte off: the JSON is cut or has one byte too many
  const std::string msg = open_error("len_off.safetensors", bad);
  EXPECT_TRUE(msg.find("invalid JSON") != std::string::npos || msg.find("out of range") != std::string::npos ||
              msg.find("exceeds") != std::string::npos)
      << msg;
  Bytes zero = bad;
  for (int i = 0; i < 8; ++i) zero[i] = 0;  // empty header
  EXPECT_NE(open_error("len_zero.safetensors", zero).find("invalid JSON"), std::string::npos);
}

TEST(SafetensorsCorrupt, BadJson) {
  EXPECT_NE(open_error("json1.safetensors", make_file("{\"a\": {\"dtype\": ", {})).find("invalid JSON header"),
            std::string::npos);
  EXPECT_NE(open_error("json2.safetensors", make_file("not json", {})).find("invalid JSON header"),
            std::string::npos);
  EXPECT_NE(open_error("json3.safetensors", make_file("[1, 2]   ", {})).find("not an object"), std::string::npos);
  EXPECT_NE(open_error("json4.safetensors", make_file("{\"__metadata__\": {\"k\": 1}}", {}))
                .find("\"__metadata__\" value of 'k' is not a string"),
            std::string::npos);
}

TEST(SafetensorsCorrupt, BadEntries) {
  const Bytes data(64, 0);
  struct Case {
    const char* header;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"t": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}})", "tensor 't': dtype 'BOOL' is not supported"},
      {R"({"t": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})", "tensor 't': dtype 'F8_E4M3'"},
      {R"({"t": {"shape": [4], "data_offsets": [0, 16]}})", "tensor 't': no \"dtype\" string"},
      {R"({"t": {"dtype": "F32", "data_offsets": [0, 16]}})", "tensor 't': no \"shape\" list"},
      {R"({"t": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", "tensor 't': \"shape\" must be"},
      {R"({"t": {"dtype": "F32", "shape": [4.5], "data_offsets": [0, 16]}})", "tensor 't': \"shape\" must be"},
      {R"({"t": {"dtype": "F32", "shape": [4]}})", "tensor 't': \"data_offsets\" must be"},
      {R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0]}})", "tensor 't': \"data_offsets\" must be"},
      {R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [-16, 0]}})", "tensor 't': \"data_offsets\" must be"},
      {R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [60, 76]}})", "tensor 't': data_offsets [60, 76] are out of range"},
      {R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})", "tensor 't': data_offsets [16, 0] are out of range"},
      {R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}})", "tensor 't': data_offsets [0, 12] hold 12 bytes, but shape [4] of F32 needs 16"},
      {R"({"t": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 24]}})", "needs 12"},
      {R"({"t": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 16]}})", "tensor 't': shape [4611686018427387904,8] is too large"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
           "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", "tensor 'b': data_offsets [8, 24] overlap those of tensor 'a'"},
      {R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", "overlap those of tensor 'a'"},
      {R"({"t": [1, 2]})", "tensor 't': the entry is not an object"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    const std::string msg = open_error("entry" + std::to_string(i++) + ".safetensors", make_file(c.header, data));
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
}

TEST(SafetensorsCorrupt, AcceptsWhatIsValid) {
  const Bytes data(64, 0);
  // Unpadded headers, holes between tensors, empty tensors anywhere: all readable.
  const std::string p = tmp_path("valid.safetensors");
  write_bytes(p, make_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [32, 40]},
                                "e": {"dtype": "F16", "shape": [0], "data_offsets": [34, 34]},
                                "b": {"dtype": "I64", "shape": [1, 1], "data_offsets": [0, 8]}})",
                           data));
  const SafetensorsFile f(p);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "b");  // data order
  EXPECT_EQ(f.get("a").nbytes, 8u);
}

TEST(SafetensorsCorrupt, NotAFile) {
  const std::string missing = tmp_path("does_not_exist.safetensors");
  EXPECT_EQ(test::error_of([&] { SafetensorsFile f(missing); }).rfind(missing + ": cannot open", 0), 0u);
  const std::string dir = ::testing::TempDir();
  EXPECT_NE(test::error_of([&] { SafetensorsFile f(dir); }).find("not a regular file"), std::string::npos);
}

// ---- model directories ----

std::string make_dir(const std::string& name) {
  const std::string d = tmp_path(name);
  ::mkdir(d.c_str(), 0755);
  for (const char* f : {"/model.safetensors", "/model.safetensors.index.json", "/a.safetensors", "/b.safetensors"})
    ::unlink((d + f).c_str());
  return d;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(SafetensorsModel, SingleFile) {
  const std::string d = make_dir("model_single");
  const Sample s;
  write_safetensors(d + "/model.safetensors", s.tensors());
  const SafetensorsModel m(d + "/");
  EXPECT_EQ(m.dir(), d);
  EXPECT_EQ(m.num_files(), 1u);
  EXPECT_EQ(m.names().size(), s.tensors().size());
  EXPECT_EQ(m.get("c.f64", {2}).dtype, DType::F64);
  EXPECT_EQ(m.find("zzz"), nullptr);
  EXPECT_EQ(test::error_of([&] { m.get("x"); }), d + ": tensor 'x' not found");
  EXPECT_EQ(test::error_of([&] { m.get("weights.f32", {3, 2}); }),
            d + ": tensor 'weights.f32' has shape [2, 3], expected [3, 2]");
}

TEST(SafetensorsModel, Sharded) {
  const std::string d = make_dir("model_sharded");
  const std::vector<float> x{1, 2, 3, 4}, y{5, 6};
  const std::vector<std::uint16_t> z{0x3c00, 0x4000};
  write_safetensors(d + "/a.safetensors", {{"layer.0.w", DType::F32, {2, 2}, x.data()}});
  write_safetensors(d + "/b.safetensors",
                    {{"layer.1.w", DType::F32, {2}, y.data()}, {"layer.1.h", DType::F16, {2}, z.data()}});
  write_text(d + "/model.safetensors.index.json",
             R"({"metadata": {"total_size": 28}, "weight_map": {"layer.0.w": "a.safetensors",
                 "layer.1.w": "b.safetensors", "layer.1.h": "b.safetensors"}})");
  SafetensorsModel m(d);
  EXPECT_EQ(m.num_files(), 2u);
  EXPECT_EQ(m.names(), (std::vector<std::string>{"layer.0.w", "layer.1.h", "layer.1.w"}));
  EXPECT_EQ(to_f32(m.get("layer.0.w", {2, 2})), x);
  EXPECT_EQ(to_f32(m.get("layer.1.w")), y);
  EXPECT_EQ(to_f32(m.get("layer.1.h")), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(m.get("layer.1.h").file, d + "/b.safetensors");
  EXPECT_EQ(test::error_of([&] { m.get("layer.2.w"); }), d + ": tensor 'layer.2.w' not found");

  // A moved model keeps its tensors.
  const SafetensorsModel moved(std::move(m));
  EXPECT_EQ(to_f32(moved.get("layer.1.w")), y);
}

TEST(SafetensorsModel, BadDirectories) {
  const std::string missing = tmp_path("no_such_model");
  EXPECT_EQ(test::error_of([&] { SafetensorsModel m(missing); }).rfind(missing + ": cannot open", 0), 0u);

  const std::string empty = make_dir("model_empty");
  EXPECT_EQ(test::error_of([&] { SafetensorsModel m(empty); }),
            empty + ": no model.safetensors or model.safetensors.index.json in the model directory");

  const std::string d = make_dir("model_badindex");
  const std::string index = d + "/model.safetensors.index.json";
  write_text(index, "{\"weight_map\": ");
  EXPECT_EQ(test::error_of([&] { SafetensorsModel m(d); }).rfind(index + ": invalid JSON", 0), 0u);
  write_text(index, "{\"metadata\": {}}");
  EXPECT_EQ(test::error_of([&] { SafetensorsModel m(d); }), index + ": no \"weight_map\" object");
  write_text(index, R"({"weight_map": {"w": "../escape.safetensors"}})");
  EXPECT_NE(test::error_of([&] { SafetensorsModel m(d); }).find("is not a file name in the model directory"),
            std::string::npos);
  write_text(index, R"({"weight_map": {"w": "a.safetensors"}})");
  EXPECT_EQ(test::error_of([&] { SafetensorsModel m(d); }).rfind(d + "/a.safetensors: cannot open", 0), 0u);
  const float one = 1;
  write_safetensors(d + "/a.safetensors", {{"v", DType::F32, {1}, &one}});
  EXPECT_EQ(test::error_of([&] { SafetensorsModel m(d); }),
            index + ": tensor 'w' is mapped to 'a.safetensors', which does not hold it");
  // A corrupt shard is named.
  write_bytes(d + "/a.safetensors", Bytes{1, 2, 3});
  EXPECT_EQ(test::error_of([&] { SafetensorsModel m(d); }).rfind(d + "/a.safetensors: ", 0), 0u);
}

// ---- conversions ----

// Reference half -> double from the fields, by ldexp (no bit tricks).
double half_reference(std::uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<double>(1024 + mant), exp - 25);
  }
  return sign ? -v : v;
}

double bf16_reference(std::uint16_t b) {
  const int sign = (b >> 15) & 1, exp = (b >> 7) & 0xff, mant = b & 0x7f;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -133);
  } else if (exp == 255) {
    v = mant == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<double>(128 + mant), exp - 134);
  }
  return sign ? -v : v;
}

TEST(Conversion, AllHalfValues) {
  int nans = 0;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float got = half_to_float(h);
    const double want = half_reference(h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << i;
      ASSERT_EQ(std::signbit(got), (i & 0x8000) != 0) << std::hex << i;
      ++nans;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want) << std::hex << i;
    ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << i;  // -0 stays -0
    // And back, exactly.
    ASSERT_EQ(float_to_half(got), h) << std::hex << i;
  }
  EXPECT_EQ(nans, 2 * 1023);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(half_to_float(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0xfc00), -INFINITY);
}

TEST(Conversion, FloatToHalfRoundsToNearestEven) {
  // Between every pair of neighbouring finite halves: just below the midpoint rounds down, just above rounds
  // up, the midpoint itself goes to the even one.
  for (std::uint32_t i = 0; i < 0x7bff; ++i) {
    const auto lo = static_cast<std::uint16_t>(i), hi = static_cast<std::uint16_t>(i + 1);
    const double mid = (half_reference(lo) + half_reference(hi)) / 2;
    const float m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid);  // representable in fp32
    ASSERT_EQ(float_to_half(m), (lo & 1) ? hi : lo) << std::hex << i;
    ASSERT_EQ(float_to_half(std::nextafter(m, 0.0f)), lo) << std::hex << i;
    ASSERT_EQ(float_to_half(std::nextafter(m, INFINITY)), hi) << std::hex << i;
    ASSERT_EQ(float_to_half(-std::nextafter(m, INFINITY)), hi | 0x8000) << std::hex << i;
  }
  EXPECT_EQ(float_to_half(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // the midpoint to 65536 rounds to inf
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(-INFINITY), 0xfc00);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // half the smallest subnormal: to even (0)
  EXPECT_EQ(float_to_half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(float_to_half(1e-30f), 0x0000);
  EXPECT_EQ(float_to_half(-1e-30f), 0x8000);
  const std::uint16_t nan = float_to_half(NAN);
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
}

TEST(Conversion, AllBf16Values) {
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const float got = bf16_to_float(b);
    const double want = bf16_reference(b);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << i;
      ASSERT_TRUE(std::isnan(bf16_to_float(float_to_bf16(got)))) << std::hex << i;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want) << std::hex << i;
    ASSERT_EQ(float_to_bf16(got), b) << std::hex << i;
  }
  // Round to nearest even.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // midpoint, even below
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);  // midpoint, even above
  EXPECT_EQ(float_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(float_to_bf16(3.4e38f), 0x7f80);  // rounds up to inf
}

TEST(Conversion, TensorsToF32) {
  const Sample s;
  const SafetensorsFile f(write_sample("conv.safetensors", s));
  EXPECT_EQ(to_f32(f.get("weights.f32")), s.f32);
  EXPECT_EQ(to_f32(f.get("a.f16")), (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24), INFINITY}));
  EXPECT_EQ(to_f32(f.get("b.bf16")), (std::vector<float>{1.0f, -1.5f, 3.140625f, 0.0f, -0.0f, INFINITY}));
  EXPECT_EQ(to_f32(f.get("c.f64")), (std::vector<float>{3.14159265f, -INFINITY}));
  EXPECT_EQ(to_f32(f.get("scalar")), std::vector<float>{42.0f});
  EXPECT_TRUE(to_f32(f.get("empty")).empty());
  EXPECT_EQ(test::error_of([&] { to_f32(f.get("d.i32")); }),
            f.path() + ": tensor 'd.i32' has dtype I32, not a floating-point type");
}

}  // namespace
}  // namespace mgrl::io
