// test_errors.cpp: the check-macro family reports library, file, line and expression.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/log.h"
#include "io/check_hdf5.h"
#include "tests/unit/test_util.h"

namespace mgrl {
namespace {

std::string fatal_message(const std::function<void()>& f) { return test::error_of<FatalError>(f); }

TEST(Errors, CheckReportsFileLineRankAndExpression) {
  log::set_rank(3);
  const int line = __LINE__ + 1;
  const auto msg = fatal_message([] { MGRL_CHECK(1 + 1 == 3, "arithmetic is broken"); });
  log::set_rank(-1);
  EXPECT_EQ(msg, "mgrl error at tests/unit/test_errors.cpp:" + std::to_string(line) +
                     " (rank 3): 1 + 1 == 3 failed: arithmetic is broken");
}

TEST(Errors, PassingCheckDoesNothing) { EXPECT_EQ(fatal_message([] { MGRL_CHECK(2 > 1, "x"); }), ""); }

TEST(Errors, Hdf5CheckOnAFailingCall) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // no HDF5 error stack on stderr
  const auto msg = fatal_message([] { H5_CHECK(H5Fopen("/nonexistent/file.h5", H5F_ACC_RDONLY, H5P_DEFAULT)); });
  EXPECT_NE(msg.find("HDF5 error at tests/unit/test_errors.cpp:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("H5Fopen(\"/nonexistent/file.h5\", H5F_ACC_RDONLY, H5P_DEFAULT) failed"), std::string::npos)
      << msg;
}

TEST(Errors, UserErrorAndFatalErrorAreDistinct) {
  EXPECT_THROW(throw UserError("x"), UserError);
  EXPECT_EQ(kExitUserError, 2);
  EXPECT_NE(kExitFatal, kExitUserError);
}

}  // namespace
}  // namespace mgrl
