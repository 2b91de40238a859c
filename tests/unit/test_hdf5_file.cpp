// test_hdf5_file.cpp: H5Writer / H5Reader round trips, atomic commit, errors on bad files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "io/hdf5_file.h"
#include "tests/unit/test_util.h"

namespace mgrl::io {
namespace {

std::string tmp(const std::string& name) { return test::temp_path(name); }
bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }


TEST(Hdf5File, RoundTripOfEveryTypeStringsAndAttributes) {
  const auto path = tmp("round.h5");
  std::remove(path.c_str());
  const std::vector<float> f{1.5f, -2.0f, NAN, 4.0f, 5.0f, 6.0f};
  const std::vector<double> d{1e-300, 2.5};
  const std::vector<std::int32_t> i{-1, 7, 9};
  const std::int64_t big = std::int64_t{1} << 40;
  {
    H5Writer w(path);
    w.write("a/b/floats", DType::F32, {2, 3}, f.data());
    w.write("doubles", DType::F64, {2}, d.data());
    w.write("a/ints", DType::I32, {3}, i.data());
    w.write("scalar", DType::I64, {}, &big);
    w.write_string("config", "mode = \"info\"\n");
    w.attr("/", "format", "mgrl-test");
    w.attr("a/b/floats", "version", std::int64_t{3});
    EXPECT_FALSE(exists(path)) << "nothing under the final name before commit";
    w.commit();
  }
  ASSERT_TRUE(exists(path));
  H5Reader r(path);
  EXPECT_EQ(r.shape("a/b/floats"), (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(r.dtype("a/b/floats"), DType::F32);
  const auto f2 = r.read_all<float>("a/b/floats", DType::F32);
  for (std::size_t k = 0; k < f.size(); ++k) {
    if (std::isnan(f[k])) EXPECT_TRUE(std::isnan(f2[k]));
    else EXPECT_EQ(f2[k], f[k]);
  }
  EXPECT_EQ(r.read_all<double>("doubles", DType::F64), d);
  EXPECT_EQ(r.read_all<std::int32_t>("a/ints", DType::I32), i);
  EXPECT_EQ(r.dtype("a/ints"), DType::I32);
  EXPECT_TRUE(r.shape("scalar").empty());
  EXPECT_EQ(r.read_all<std::int64_t>("scalar", DType::I64), std::vector<std::int64_t>{big});
  EXPECT_EQ(r.read_string("config"), "mode = \"info\"\n");
  EXPECT_EQ(r.attr_string("/", "format"), "mgrl-test");
  EXPECT_EQ(r.attr_int("a/b/floats", "version"), 3);
  EXPECT_EQ(r.list("a"), (std::vector<std::string>{"b", "ints"}));
  EXPECT_TRUE(r.has("a/b"));
  EXPECT_FALSE(r.has("a/zzz/floats"));
  // Reading converts: ints as doubles.
  EXPECT_EQ(r.read_all<double>("a/ints", DType::F64), (std::vector<double>{-1, 7, 9}));
}

TEST(Hdf5File, UncommittedWriterLeavesNothing) {
  const auto path = tmp("never.h5");
  std::remove(path.c_str());
  {
    H5Writer w(path);
    const float x = 1;
    w.write("x", DType::F32, {1}, &x);
  }
  EXPECT_FALSE(exists(path));
  // No temporary left behind either.
  EXPECT_FALSE(exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST(Hdf5File, CommitReplacesAnOldFileOnlyWhenComplete) {
  const auto path = tmp("replace.h5");
  const float one = 1, two = 2;
  {
    H5Writer w(path);
    w.write("v", DType::F32, {1}, &one);
    w.commit();
  }
  {
    H5Writer w(path);
    w.write("v", DType::F32, {1}, &two);
    // Not committed yet: the old file is intact.
    H5Reader r(path);
    EXPECT_EQ(r.read_all<float>("v", DType::F32)[0], 1.0f);
    w.commit();
  }
  H5Reader r(path);
  EXPECT_EQ(r.read_all<float>("v", DType::F32)[0], 2.0f);
}

TEST(Hdf5File, BadFilesAreUserErrorsNamingThePath) {
  auto msg = test::error_of([] { H5Reader r(tmp("missing.h5")); });
  EXPECT_NE(msg.find("missing.h5: cannot open"), std::string::npos) << msg;
  const auto text = tmp("text.h5");
  std::ofstream(text) << "this is not hdf5\n";
  msg = test::error_of([&] { H5Reader r(text); });
  EXPECT_NE(msg.find("text.h5: not an HDF5 file"), std::string::npos) << msg;
  // A truncated file.
  const auto full = tmp("full.h5"), cut = tmp("cut.h5");
  {
    std::vector<float> big(4096, 1.0f);
    H5Writer w(full);
    w.write("big", DType::F32, {4096}, big.data());
    w.commit();
  }
  std::ifstream in(full, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  msg = test::error_of([&] {
    H5Reader r(cut);
    r.read_all<float>("big", DType::F32);
  });
  EXPECT_NE(msg.find("cut.h5"), std::string::npos) << msg;
  H5Reader ok(full);
  msg = test::error_of([&] { ok.shape("nope"); });
  EXPECT_NE(msg.find("full.h5: no dataset 'nope'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace mgrl::io
