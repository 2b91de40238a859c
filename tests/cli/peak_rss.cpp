// peak_rss.cpp: runs a command and prints the peak resident memory (KiB) of the largest process it started
// (getrusage of the waited-for children: ru_maxrss), then exits with the command's exit code. For tests that hold
// `mgrl plan` against the measured peak of real runs (tests/cli/plan_measured.sh).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: peak_rss COMMAND [ARGS...]\n");
    return 2;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return 2;
  }
  if (pid == 0) {
    execvp(argv[1], argv + 1);
    std::perror(argv[1]);
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) {
    std::perror("waitpid");
    return 2;
  }
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  std::fprintf(stderr, "peak_rss_kib %ld\n", ru.ru_maxrss);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
