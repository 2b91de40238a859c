// test_atomic_file.cpp: whole-or-nothing output files (src/io/atomic_file.h): the file is replaced only when
// complete, a failed write keeps the earlier file and leaves no temporary, a link planted under the temporary's name
// is not followed, and killed writers' temporaries are removed (only theirs).
#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tests/unit/test_util.h"

namespace mgrl::io {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string dir = test::temp_path("atomic_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spill(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(AtomicFile, ReplacesTheOldFileWhole) {
  const std::string dir = fresh_dir("replace");
  const std::string path = dir + "/out.jsonl";
  spill(path, "old\n");
  write_file_atomically(path, std::string(100000, 'x') + "\n");
  EXPECT_EQ(slurp(path), std::string(100000, 'x') + "\n");
  write_file_atomically(path, "");
  EXPECT_EQ(slurp(path), "");
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"out.jsonl"}) << "no temporary left";
  EXPECT_EQ(temporary_name(path), path + ".tmp." + std::to_string(::getpid()));
}

TEST(AtomicFile, FailedWriteKeepsTheOldFileAndLeavesNoTemporary) {
  // A disk that fills up: a child process whose file size is limited (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail
  // with EFBIG as they would with ENOSPC) writes 1 MB.
  const std::string dir = fresh_dir("full");
  const std::string path = dir + "/out.jsonl";
  spill(path, "old\n");
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const struct rlimit lim {64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    const std::string msg = test::error_of([&] { write_file_atomically(path, std::string(1 << 20, 'y')); });
    ::_exit(msg == path + ": cannot write the output file (File too large)" ? 0 : (msg.empty() ? 11 : 12));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "11: the write succeeded; 12: another message";
  EXPECT_EQ(slurp(path), "old\n");
  EXPECT_EQ(names_in(dir), std::vector<std::string>{"out.jsonl"});
}

TEST(AtomicFile, ALinkUnderTheTemporaryNameIsNotFollowed) {
  // Writing through a link planted (or left) under "<path>.tmp.<pid>" would overwrite whatever it points to.
  const std::string dir = fresh_dir("link");
  const std::string path = dir + "/out.jsonl", victim = dir + "/victim.txt";
  spill(victim, "precious\n");
  fs::create_symlink(victim, temporary_name(path));
  check_output_writable(path);
  EXPECT_EQ(slurp(victim), "precious\n");
  fs::create_symlink(victim, temporary_name(path));
  write_file_atomically(path, "new\n");
  EXPECT_EQ(slurp(victim), "precious\n");
  EXPECT_EQ(slurp(path), "new\n");
  EXPECT_FALSE(fs::is_symlink(path));
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"out.jsonl", "victim.txt"}));
}

TEST(AtomicFile, OutputsThatCannotBeWrittenAreUserErrors) {
  const std::string dir = fresh_dir("unwritable");
  fs::create_directories(dir + "/a_dir");
  std::string msg = test::error_of([&] { check_output_writable(dir + "/a_dir"); });
  EXPECT_EQ(msg, dir + "/a_dir: exists and is not a regular file (the output is written under a temporary name and "
                       "moved there)");
  msg = test::error_of([&] { write_file_atomically(dir + "/a_dir", "x"); });
  EXPECT_NE(msg.find("exists and is not a regular file"), std::string::npos) << msg;
  msg = test::error_of([&] { check_output_writable(dir + "/missing/out.jsonl"); });
  EXPECT_EQ(msg, dir + "/missing/out.jsonl: cannot create the output file (No such file or directory)");
  spill(dir + "/file", "x");
  msg = test::error_of([&] { write_file_atomically(dir + "/file/out.jsonl", "x"); });
  EXPECT_EQ(msg, dir + "/file/out.jsonl: cannot create the output file (Not a directory)");
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"a_dir", "file"}));
}

TEST(AtomicFile, StaleTemporariesOfThatPathAreRemoved) {
  const std::string dir = fresh_dir("stale");
  const std::string path = dir + "/out.h5";
  // A pid that cannot be running (above pid_max), a live process (this one's parent), this process, not a pid,
  // another output's temporary, and a directory of a dead pid's name.
  const std::string dead = path + ".tmp.999999999", live = path + ".tmp." + std::to_string(::getppid()),
                    mine = temporary_name(path);
  for (const auto& p : {dead, live, mine, path + ".tmp.x", dir + "/other.h5.tmp.999999999", path}) spill(p, "t");
  fs::create_directories(path + ".tmp.999999998");
  EXPECT_EQ(remove_stale_temporaries_of(path), 1);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live) && fs::exists(mine) && fs::exists(path + ".tmp.x") &&
              fs::exists(dir + "/other.h5.tmp.999999999") && fs::exists(path) && fs::exists(path + ".tmp.999999998"));
  EXPECT_EQ(remove_stale_temporaries_of(dir + "/missing/out.h5"), 0);
  // A path without a directory part is looked up in the working directory.
  const auto cwd = fs::current_path();
  fs::current_path(dir);
  spill("out.h5.tmp.999999999", "t");
  EXPECT_EQ(remove_stale_temporaries_of("out.h5"), 1);
  fs::current_path(cwd);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(writer_may_be_running(::getpid()));
  EXPECT_FALSE(writer_may_be_running(999999999));
}

}  // namespace
}  // namespace mgrl::io
