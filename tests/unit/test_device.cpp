// test_device.cpp: the storage dtype each backend and compute capability gets (model.dtype), without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "dist/device.h"

using mgrl::DType;
using mgrl::UserError;
using mgrl::dist::Backend;
using mgrl::dist::storage_dtype;

namespace {

// The message of the UserError that storage_dtype throws ("" when it throws none).
std::string refusal(Backend b, int cc, const std::string& requested) {
  try {
    storage_dtype(b, cc, requested);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(StorageDtype, AutoIsFp16BeforeAmpereAndBf16From80On) {
  EXPECT_EQ(storage_dtype(Backend::Cuda, 70, "auto"), DType::F16);  // V100
  EXPECT_EQ(storage_dtype(Backend::Cuda, 75, "auto"), DType::F16);  // T4
  EXPECT_EQ(storage_dtype(Backend::Cuda, 80, "auto"), DType::BF16);  // A100
  EXPECT_EQ(storage_dtype(Backend::Cuda, 86, "auto"), DType::BF16);
  EXPECT_EQ(storage_dtype(Backend::Cuda, 90, "auto"), DType::BF16);  // H100
}

TEST(StorageDtype, ExplicitChoiceIsHonoured) {
  EXPECT_EQ(storage_dtype(Backend::Cuda, 80, "fp16"), DType::F16);  // the V100 path on an A100
  EXPECT_EQ(storage_dtype(Backend::Cuda, 90, "fp16"), DType::F16);
  EXPECT_EQ(storage_dtype(Backend::Cuda, 70, "fp16"), DType::F16);
  EXPECT_EQ(storage_dtype(Backend::Cuda, 80, "bf16"), DType::BF16);
}

TEST(StorageDtype, Bf16BeforeAmpereIsAUserError) {
  for (const int cc : {70, 75}) {
    const std::string why = refusal(Backend::Cuda, cc, "bf16");
    EXPECT_NE(why.find("model.dtype = \"bf16\" needs compute capability 8.0"), std::string::npos) << why;
    EXPECT_NE(why.find(std::to_string(cc / 10) + "." + std::to_string(cc % 10)), std::string::npos) << why;
  }
}

TEST(StorageDtype, CpuIsF32AndRefusesHalfPrecision) {
  EXPECT_EQ(storage_dtype(Backend::Cpu, 1000, "auto"), DType::F32);
  for (const char* d : {"fp16", "bf16"}) {
    const std::string why = refusal(Backend::Cpu, 1000, d);
    EXPECT_NE(why.find("model.dtype = \"" + std::string(d) + "\" needs the CUDA backend"), std::string::npos)
        << why;
  }
  EXPECT_NE(refusal(Backend::Cuda, 80, "f16").find("model.dtype must be"), std::string::npos);
}
