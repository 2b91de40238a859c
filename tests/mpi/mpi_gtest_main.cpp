// mpi_gtest_main.cpp: main() for GTest binaries run under mpiexec: every rank runs every test,
// only rank 0 prints, and the job fails when a test failed on any rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "tests/mpi/mpi_gtest_main.h"

namespace mgrl::test {
namespace {
dist::MpiEnv* g_env = nullptr;
std::vector<std::string> g_args;
std::vector<std::function<void()>> g_before_exit;
}  // namespace

void before_exit(std::function<void()> fn) { g_before_exit.push_back(std::move(fn)); }

dist::MpiEnv& env() { return *g_env; }

std::string arg(const std::string& name) {
  const std::string prefix = "--" + name + "=";
  for (const auto& a : g_args)
    if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
  return "";
}

// Other ranks print only their failures, prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace mgrl::test

int main(int argc, char** argv) {
  mgrl::dist::MpiEnv env(&argc, &argv);
  mgrl::test::g_env = &env;
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) mgrl::test::g_args.emplace_back(argv[i]);
  if (env.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new mgrl::test::RankFailurePrinter(env.rank()));
  }
  int rc = RUN_ALL_TESTS();
  const auto* unit = ::testing::UnitTest::GetInstance();
  // A binary whose every test skipped itself (no GPU) reports "skipped" to CTest.
  const bool all_skipped = unit->test_to_run_count() > 0 && unit->skipped_test_count() == unit->test_to_run_count();
  for (auto& fn : mgrl::test::g_before_exit) fn();
  rc = env.allreduce_max(rc != 0 ? 1 : 0);
  if (rc == 0 && env.allreduce_min(all_skipped ? 1 : 0) == 1) return mgrl::test::kSkip;
  if (rc != 0 && env.rank() == 0) std::fprintf(stderr, "some test failed on at least one rank\n");
  return rc;
}
