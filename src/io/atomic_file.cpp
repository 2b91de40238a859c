// atomic_file.cpp: whole-or-nothing output files (see atomic_file.h) with POSIX calls.
#include "io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"

namespace mgrl::io {
namespace {

std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string why() { return std::strerror(errno); }

// Creates the temporary anew: a leftover of that name (a process that had this pid before) is removed first, and
// O_EXCL never follows a link planted under the name.
int create_temporary(const std::string& path, const std::string& tmp) {
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw UserError(path + ": cannot create the output file (" + why() + ")");
  return fd;
}

void refuse_non_regular(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw UserError(path + ": exists and is not a regular file (the output is written under a temporary name and "
                    "moved there)");
}

}  // namespace

std::string temporary_name(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

bool writer_may_be_running(long pid) {
  if (pid == static_cast<long>(::getpid())) return true;
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

void check_output_writable(const std::string& path) {
  refuse_non_regular(path);
  const std::string tmp = temporary_name(path);
  ::close(create_temporary(path, tmp));
  ::unlink(tmp.c_str());
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  refuse_non_regular(path);
  const std::string tmp = temporary_name(path);
  const int fd = create_temporary(path, tmp);
  // Any failure: the temporary goes, the file under path stays as it was.
  struct Failure {
    const std::string& path;
    const std::string& tmp;
    int fd;
    [[noreturn]] void operator()(const std::string& what) const {
      const std::string reason = why();
      if (fd >= 0) ::close(fd);
      ::unlink(tmp.c_str());
      throw UserError(path + ": " + what + " (" + reason + ")");
    }
  };
  const Failure fail{path, tmp, fd};
  std::size_t done = 0;
  const auto write_up_to = [&](std::size_t end) {
    while (done < end) {
      const ssize_t n = ::write(fd, bytes.data() + done, end - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("cannot write the output file");
      if (n == 0) fail("cannot write the output file (nothing written)");
      done += static_cast<std::size_t>(n);
    }
  };
  write_up_to(bytes.size() / 2);
  fault::point("output_write", 0, 0);  // tests: a writer killed half way through its output (core/fault.h)
  write_up_to(bytes.size());
  if (::fsync(fd) != 0) fail("cannot write the output file (fsync failed)");
  if (::close(fd) != 0) Failure{path, tmp, -1}("cannot write the output file");
  if (::rename(tmp.c_str(), path.c_str()) != 0) Failure{path, tmp, -1}("cannot move the finished file into place");
  sync_parent_directory(path);
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

void sync_parent_directory(const std::string& path) { sync_directory(parent_dir(path)); }

int remove_stale_temporaries_of(const std::string& path) {
  const std::string dir = parent_dir(path), prefix = base_name(path) + ".tmp.";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (pid_text.size() > 9 || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    if (writer_may_be_running(std::stol(pid_text))) continue;
    const std::string full = path.find('/') == std::string::npos ? name : (dir == "/" ? "/" : dir + "/") + name;
    struct stat st {};
    if (::lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(full.c_str()) == 0) {
      ++removed;
      log::info("removed " + full + ", the temporary file of an interrupted write");
    }
  }
  ::closedir(d);
  return removed;
}

}  // namespace mgrl::io
