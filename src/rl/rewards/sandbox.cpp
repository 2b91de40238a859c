// sandbox.cpp: fork, namespaces, read-only mounts, privilege drop, rlimits, timeout and output cap for code_exec.
#include "rl/rewards/sandbox.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <set>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace mgrl::rl {
namespace {

constexpr uid_t kNobody = 65534;
constexpr int kNsFlags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID;

// Mount points of this process (from /proc/self/mountinfo), read before forking (no allocation in the child).
std::vector<std::string> mount_points() {
  std::vector<std::string> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string id, parent, dev, root, point;
    if (ss >> id >> parent >> dev >> root >> point) out.push_back(point);
  }
  return out;
}

void write_file(const char* path, const char* text) {
  const int fd = ::open(path, O_WRONLY);
  if (fd < 0) return;
  (void)!::write(fd, text, std::strlen(text));
  ::close(fd);
}

void close_from(int first) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, first, ~0U, 0) == 0) return;
#endif
  for (int fd = first; fd < 65536; ++fd) ::close(fd);
}

// One step of building the sandbox's own root file system (a tmpfs holding only what Python needs), prepared before
// fork so that the child allocates nothing.
struct RootOp {
  enum Kind { kMkdir, kBindRo, kBindRw, kSymlink, kFile } kind;
  const char* a;  // kMkdir, kFile: the path; kBind*: the source; kSymlink: the link's target
  const char* b;  // kBind*: the mount point; kSymlink: the link
};

struct ChildPlan {
  bool namespaces, root;
  const char* new_root;     // nullptr: the whole file system stays visible (read-only)
  const char* old_root;     // new_root + "/oldroot"
  const RootOp* root_ops;   // null-terminated by kind == kMkdir with a == nullptr
  const char* dir;
  const char* const* mounts;  // null-terminated
  const char* uid_map;
  const char* gid_map;
  char* const* argv;
  char* const* envp;
  SandboxLimits limits;
  int out_fd;
};

[[noreturn]] void grandchild(const ChildPlan& p) {
  if (p.namespaces) {
    // PID 1 of the new namespace: a /proc of its own.
    ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
    if (p.new_root) {  // the old file system goes away for good (after the fresh /proc, which needs it to exist)
      if (::umount2("/oldroot", MNT_DETACH) != 0) ::_exit(125);
      ::rmdir("/oldroot");
      ::mount(nullptr, "/", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr);
      if (::access("/oldroot/usr", F_OK) == 0 || ::access("/proc/self", F_OK) != 0) ::_exit(125);
    }
  }
  if (!p.argv) ::_exit(0);  // the probe: set up, nothing to run
  auto lim = [](int what, rlim_t v) {
    rlimit r{v, v};
    ::setrlimit(what, &r);
  };
  lim(RLIMIT_CPU, static_cast<rlim_t>(p.limits.cpu_s));
  lim(RLIMIT_AS, static_cast<rlim_t>(p.limits.memory_mb) << 20);
  lim(RLIMIT_FSIZE, static_cast<rlim_t>(p.limits.file_mb) << 20);
  lim(RLIMIT_NOFILE, 64);
  lim(RLIMIT_CORE, 0);
  if (p.root && !p.limits.own_program) {  // RLIMIT_NPROC does not bind root: become nobody first
    const gid_t g = kNobody;
    if (::setgroups(1, &g) != 0) ::_exit(120);
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(121);
  }
  lim(RLIMIT_NPROC, static_cast<rlim_t>(p.limits.processes));
  if (::chdir(p.dir) != 0) ::_exit(122);
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull < 0 || ::dup2(devnull, 0) < 0 || ::dup2(p.out_fd, 1) < 0 || ::dup2(p.out_fd, 2) < 0) ::_exit(124);
  close_from(3);
  if (p.namespaces && !p.root) {
    // Root of its own user namespace holds every capability there (it could remount its read-only mounts writable):
    // none survive, and none come back through execve or setuid, so it is an ordinary user.
    if (::prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                                       SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED) != 0)
      ::_exit(120);
    for (int cap = 0; cap <= 63; ++cap) ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct none[2] = {};
    if (::syscall(SYS_capset, &hdr, none) != 0) ::_exit(120);
  }
  ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);  // no set-user-ID program gives anything back
  ::signal(SIGPIPE, SIG_DFL);                 // mgrl ignores it; the test's interpreter gets the usual behaviour
  ::execve(p.argv[0], p.argv, p.envp);
  ::execvpe(p.argv[0], p.argv, p.envp);
  ::_exit(127);
}

[[noreturn]] void child(const ChildPlan& p) {
  ::setpgid(0, 0);
  if (p.namespaces) {
    if (::unshare(kNsFlags | (p.root ? 0 : CLONE_NEWUSER)) != 0) ::_exit(123);
    if (!p.root) {
      write_file("/proc/self/setgroups", "deny");
      write_file("/proc/self/uid_map", p.uid_map);
      write_file("/proc/self/gid_map", p.gid_map);
    }
    // Everything read-only but the sandbox directory.
    ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);
    if (::mount(p.dir, p.dir, nullptr, MS_BIND, nullptr) != 0) ::_exit(123);
    for (const char* const* m = p.mounts; *m; ++m)
      ::mount(nullptr, *m, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID, nullptr);
    if (::mount(nullptr, "/", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) ::_exit(123);
    if (p.new_root) {  // a root of its own: only the system's programs and libraries, the interpreter and its directory
      if (::mount("tmpfs", p.new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") != 0) ::_exit(125);
      for (const RootOp* op = p.root_ops; op->a; ++op) {
        bool ok = true;
        switch (op->kind) {
          case RootOp::kMkdir:
            ok = ::mkdir(op->a, 0755) == 0 || errno == EEXIST;
            break;
          case RootOp::kFile: {
            const int fd = ::open(op->a, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
            ok = fd >= 0;
            if (ok) ::close(fd);
            break;
          }
          case RootOp::kSymlink:
            ok = ::symlink(op->a, op->b) == 0;
            break;
          case RootOp::kBindRo:
          case RootOp::kBindRw:
            ok = ::mount(op->a, op->b, nullptr, MS_BIND | MS_REC, nullptr) == 0;
            if (ok && op->kind == RootOp::kBindRo)
              ok = ::mount(nullptr, op->b, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID, nullptr) == 0;
            break;
        }
        if (!ok) ::_exit(125);
      }
      if (::syscall(SYS_pivot_root, p.new_root, p.old_root) != 0 || ::chdir("/") != 0) ::_exit(125);
    }
    // The first child is PID 1 of the new PID namespace; when it ends, the kernel kills the rest of it.
    const pid_t pid = ::fork();
    if (pid < 0) ::_exit(123);
    if (pid == 0) grandchild(p);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  grandchild(p);
}

bool probe_namespaces(bool root) {
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) ::_exit(::unshare(kNsFlags | (root ? 0 : CLONE_NEWUSER)) == 0 ? 0 : 1);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// The steps that build the sandbox's root (ChildPlan::root_ops) in `new_root`: the system's programs, libraries and
// /etc read-only, the interpreter's installation when it lies elsewhere, four devices, its own directory writable,
// and mount points for /proc and the old root. Strings live in `keep`.
std::vector<RootOp> root_ops(const std::string& new_root, const std::string& dir, const std::string& py,
                             std::deque<std::string>* keep) {
  namespace fs = std::filesystem;
  auto k = [&](std::string x) { return keep->emplace_back(std::move(x)).c_str(); };
  std::vector<RootOp> ops;
  std::set<std::string> made;
  auto mkdirs = [&](const std::string& path) {
    for (std::size_t i = 1; i <= path.size(); ++i)
      if ((i == path.size() || path[i] == '/') && made.insert(path.substr(0, i)).second)
        ops.push_back({RootOp::kMkdir, k(new_root + path.substr(0, i)), nullptr});
  };
  std::vector<std::string> visible = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"};
  std::error_code ec;
  const fs::path real = fs::canonical(py, ec);
  if (!ec) {
    const std::string prefix = real.parent_path().parent_path().string();  // .../bin/python3 -> ...
    bool inside = prefix.size() <= 1;
    for (const auto& v : visible) inside = inside || prefix == v || prefix.rfind(v + "/", 0) == 0;
    if (!inside) visible.push_back(prefix);
  }
  for (const auto& v : visible) {
    struct stat st {};
    if (::lstat(v.c_str(), &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      const fs::path target = fs::read_symlink(v, ec);
      if (ec) continue;
      mkdirs(fs::path(v).parent_path().string());
      ops.push_back({RootOp::kSymlink, k(target.string()), k(new_root + v)});
    } else if (S_ISDIR(st.st_mode)) {
      mkdirs(v);
      ops.push_back({RootOp::kBindRo, k(v), k(new_root + v)});
    }
  }
  for (const char* d : {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"}) {
    if (::access(d, F_OK) != 0) continue;
    mkdirs("/dev");
    ops.push_back({RootOp::kFile, k(new_root + d), nullptr});
    ops.push_back({RootOp::kBindRw, k(d), k(new_root + d)});
  }
  mkdirs(dir);
  ops.push_back({RootOp::kBindRw, k(dir), k(new_root + dir)});
  mkdirs("/proc");
  mkdirs("/oldroot");
  ops.push_back({RootOp::kMkdir, nullptr, nullptr});
  return ops;
}

// Runs main_py (nullptr: only sets the sandbox up, the probe of a root of its own) as described in sandbox.h.
SandboxResult run_impl(const SandboxSupport& sup, bool own_root, const std::string& python, const std::string* main_py,
                       const SandboxLimits& limits);

}  // namespace

std::string SandboxSupport::describe() const {
  std::string s = own_root   ? "mount (a root of its own: only /usr, /bin, /lib*, /etc and the interpreter's directory, "
                               "read-only, and its directory), network and PID namespaces"
                 : namespaces ? "mount (read-only but its directory), network and PID namespaces"
                             : "no namespaces (the system refused them: files outside its directory are writable where "
                               "permissions allow, the network is reachable)";
  s += root ? "; runs as nobody" : "; runs as the current user";
  return s + "; rlimits on CPU, memory, file size, open files and processes; wall-clock timeout";
}

const SandboxSupport& sandbox_support() {
  static const SandboxSupport s = [] {
    SandboxSupport x;
    x.root = ::geteuid() == 0;
    x.namespaces = probe_namespaces(x.root);
    x.own_root = x.namespaces && run_impl(x, true, "/usr/bin/python3", nullptr, SandboxLimits{}).status == 0;
    return x;
  }();
  return s;
}

SandboxResult run_sandboxed(const std::string& python, const std::string& main_py, const SandboxLimits& limits) {
  const SandboxSupport& sup = sandbox_support();
  return run_impl(sup, sup.own_root, python, &main_py, limits);
}

namespace {

SandboxResult run_impl(const SandboxSupport& sup, bool own_root, const std::string& python, const std::string* main_py,
                       const SandboxLimits& limits) {
  namespace fs = std::filesystem;
  SandboxResult res;
  std::string tmpl = (fs::temp_directory_path() / "mgrl-sandbox-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    res.setup_failed = true;
    return res;
  }
  const std::string dir = tmpl;
  std::string root_tmpl = (fs::temp_directory_path() / "mgrl-root-XXXXXX").string();
  if (own_root && !::mkdtemp(root_tmpl.data())) own_root = false;
  struct Cleanup {
    std::string dir, root;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
      if (!root.empty()) fs::remove_all(root, ec);
    }
  } cleanup{dir, own_root ? root_tmpl : std::string()};
  if (main_py) std::ofstream(dir + "/main.py") << *main_py;
  if (sup.root && !limits.own_program) {
    (void)!::chown(dir.c_str(), kNobody, kNobody);
    ::chmod(dir.c_str(), 0700);
  }
  // Everything the child needs, prepared before fork.
  std::vector<std::string> mounts_s = sup.namespaces ? mount_points() : std::vector<std::string>{};
  std::vector<const char*> mounts;
  for (const auto& m : mounts_s)
    if (m != dir) mounts.push_back(m.c_str());
  mounts.push_back(nullptr);
  const std::string uid_map = "0 " + std::to_string(::getuid()) + " 1\n", gid_map = "0 " + std::to_string(::getgid()) + " 1\n";
  std::string py = python;
  if (py.find('/') == std::string::npos)
    for (const char* d : {"/usr/local/bin/", "/usr/bin/", "/bin/"})
      if (::access((d + python).c_str(), X_OK) == 0) {
        py = d + python;
        break;
      }
  std::string a0 = py, a1 = "-I", a2 = "-S", a3 = "main.py";
  char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), nullptr};
  std::deque<std::string> keep;
  const std::vector<RootOp> ops = own_root ? root_ops(root_tmpl, dir, py, &keep) : std::vector<RootOp>{};
  const std::string old_root = root_tmpl + "/oldroot";
  std::string e0 = "PATH=/usr/local/bin:/usr/bin:/bin", e1 = "HOME=" + dir, e2 = "PYTHONDONTWRITEBYTECODE=1",
              e3 = "PYTHONHASHSEED=0", e4 = "LANG=C.UTF-8";
  char* envp[] = {e0.data(), e1.data(), e2.data(), e3.data(), e4.data(), nullptr};
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    res.setup_failed = true;
    return res;
  }
  const ChildPlan plan{sup.namespaces, sup.root, own_root ? root_tmpl.c_str() : nullptr, old_root.c_str(), ops.data(),
                       dir.c_str(), mounts.data(), uid_map.c_str(), gid_map.c_str(), main_py ? argv : nullptr, envp, limits,
                       fds[1]};
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    res.setup_failed = true;
    return res;
  }
  if (pid == 0) {
    ::close(fds[0]);
    child(plan);
  }
  ::setpgid(pid, pid);  // (also done by the child; whichever runs first)
  ::close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limits.wall_s);
  char buf[65536];
  bool kill_it = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      res.timed_out = kill_it = true;
      break;
    }
    pollfd pf{fds[0], POLLIN, 0};
    const int r = ::poll(&pf, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;  // EOF: every writer is gone
    const std::size_t room = limits.max_output - std::min(limits.max_output, res.output.size());
    res.output.append(buf, std::min<std::size_t>(room, static_cast<std::size_t>(n)));
    if (static_cast<std::size_t>(n) > room) {
      res.output_capped = kill_it = true;
      break;
    }
  }
  ::close(fds[0]);
  if (kill_it) ::kill(-pid, SIGKILL);
  // Wait for the child; it ends at once after a kill, or soon after closing its output.
  int st = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &st, kill_it ? 0 : WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (w == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        res.timed_out = true;
        ::kill(-pid, SIGKILL);
        kill_it = true;
      } else {
        ::usleep(2000);
      }
    }
  }
  ::kill(-pid, SIGKILL);  // anything left in its process group (without a PID namespace)
  res.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  if (res.status >= 120 && res.status <= 125) res.setup_failed = true;
  return res;
}

}  // namespace

}  // namespace mgrl::rl
