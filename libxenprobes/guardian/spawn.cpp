#include "guardian/spawn.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/log.hpp"

extern char** environ;

namespace xenprobes::guardian {

#ifndef XENPROBES_GUARDIAN_DEFAULT
#define XENPROBES_GUARDIAN_DEFAULT "/usr/local/libexec/xenprobes/xenprobes-guardian"
#endif

namespace {

// A descriptor owned here until it is handed on.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// A close-on-exec copy of `fd` above 9, above every descriptor the file actions write (0, 1,
// 3, 4, 5): no action then reads a descriptor an earlier one replaced, whatever numbers the
// journal and the pipes have here (were the pipe's read end fd 3, the journal's dup2 onto 3
// would replace it, and the guardian would take the journal for its pipe).
Result<Fd> above(int fd, const char* what) {
  int hi = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  if (hi < 0) return fail_errno(errno, std::string("moving the guardian's ") + what + " above fd 9");
  return Fd(hi);
}

// A pidfd of the child, above fd 9 like the rest (-1 without pidfds: Linux < 5.3).
int pidfd_of(pid_t pid) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return -1;
  auto hi = above(fd, "pidfd");
  ::close(fd);
  return hi ? hi->release() : -1;
}

constexpr int kReadyTimeoutMs = 10000;
constexpr std::string_view kReady = "ready\n";

std::string describe(int status) {
  if (status == -1) return "it has not exited";
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

}  // namespace

std::string guardian_path(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* e = ::secure_getenv("XENPROBES_GUARDIAN"); e && *e) return e;
  return XENPROBES_GUARDIAN_DEFAULT;
}

Result<std::unique_ptr<GuardianProcess>> GuardianProcess::spawn(const std::string& path, int journal_fd,
                                                                const std::string& backend) {
  if (path.empty() || path[0] != '/')
    return fail(Errc::InvalidArgument, "the guardian program '" + path +
                                           "' is not an absolute path (name it with $XENPROBES_GUARDIAN or "
                                           "SessionOptions::guardian_path)");
  // Every end is close-on-exec: only the file actions give the guardian its ends, and no other
  // program this process starts ever holds the write end of the first pipe (it would keep the
  // pipe open after our death).
  int p[2], r[2];
  if (::pipe2(p, O_CLOEXEC) < 0) return fail_errno(errno, "pipe2 for the guardian");
  Fd pipe_r(p[0]), pipe_w(p[1]);
  if (::pipe2(r, O_CLOEXEC) < 0) return fail_errno(errno, "pipe2 for the guardian");
  Fd ready_r(r[0]), ready_w(r[1]);
  Fd journal_hi = XP_TRY(above(journal_fd, "journal"));
  Fd pipe_hi = XP_TRY(above(pipe_r.get(), "pipe"));
  Fd ready_hi = XP_TRY(above(ready_w.get(), "ready pipe"));
  pipe_r.reset();
  ready_w.reset();

  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  posix_spawn_file_actions_adddup2(&fa, journal_hi.get(), 3);
  posix_spawn_file_actions_adddup2(&fa, pipe_hi.get(), 4);
  posix_spawn_file_actions_adddup2(&fa, ready_hi.get(), 5);
  // Its owner's stdin and stdout are none of its business (and a pipe on them must see end
  // of file when its owner is gone); stderr stays, for the account.
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  posix_spawn_file_actions_addclosefrom_np(&fa, 6);  // nothing else of ours goes with it
#endif
  // Its own session: no terminal signals (^C, hangup) meant for its owner; default signal
  // dispositions and an empty mask whatever the owner set (it ignores SIGPIPE itself).
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &all);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
#ifdef POSIX_SPAWN_SETSID
  flags |= POSIX_SPAWN_SETSID;
#endif
  posix_spawnattr_setflags(&at, flags);
  std::string owner = std::to_string(::getpid());
  std::vector<std::string> args{path, "--journal-fd", "3",   "--pipe-fd", "4",    "--ready-fd",
                                "5",  "--owner",      owner, "--backend", backend};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, path.c_str(), &fa, &at, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  journal_hi.reset();
  pipe_hi.reset();
  ready_hi.reset();  // the guardian holds the only write end: end of file once it is gone
  if (rc != 0) return fail_errno(rc, "posix_spawn of the guardian " + path);
  // The write end kept above fd 9 too: an application that puts /dev/null on fds 0-2 (as
  // daemons do) then cannot close it by accident.
  auto kept = above(pipe_w.get(), "pipe's write end");
  std::unique_ptr<GuardianProcess> g(
      new GuardianProcess(pid, pidfd_of(pid), kept ? kept->release() : pipe_w.release()));
  pipe_w.reset();

  // Its word, then end of file: "ready" once it has checked what it was given and is
  // watching this process; nothing when it refused (its reason is on its stderr and in
  // syslog).
  std::string said;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReadyTimeoutMs);
  while (said.size() <= kReady.size()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd pf{ready_r.get(), POLLIN, 0};
    int n = ::poll(&pf, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;  // the deadline is checked above
    char buf[16];
    ssize_t k = ::read(ready_r.get(), buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    said.append(buf, static_cast<std::size_t>(k));
  }
  if (said == kReady) {
    XP_LOG(Info, "guardian %s started (pid %d)", path.c_str(), static_cast<int>(pid));
    return g;
  }
  if (timed_out) ::kill(pid, SIGKILL);  // ours, and silent for too long: not watching anything
  g->close_pipe();
  int status = g->wait_exit(kReadyTimeoutMs);
  return fail(Errc::Io, "the guardian " + path + " did not start (" +
                            (timed_out ? "no word from it within " + std::to_string(kReadyTimeoutMs / 1000) + " s"
                                       : describe(status)) +
                            "): its reason is on its stderr and in syslog");
}

void GuardianProcess::close_pipe() {
  if (wfd_ >= 0) ::close(wfd_);
  wfd_ = -1;
}

void GuardianProcess::abandon() {
  close_pipe();
  reaped_ = true;  // not waited for, not reaped: it outlives this process
}

int GuardianProcess::wait_exit(int ms) {
  if (reaped_ || pid_ <= 0) return -1;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) {
      reaped_ = true;  // ECHILD: reaped by someone else (SIGCHLD ignored)
      return r == pid_ ? status : -1;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return -1;
    if (pidfd_ >= 0) {
      pollfd pf{pidfd_, POLLIN, 0};  // readable once it has exited
      (void)::poll(&pf, 1, static_cast<int>(left.count()));
    } else {
      std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(2)));  // no pidfd (Linux < 5.3)
    }
  }
}

GuardianProcess::~GuardianProcess() {
  close_pipe();
  if (!reaped_ && wait_exit(2000) == -1 && !reaped_)
    XP_LOG(Warn, "guardian (pid %d) has not exited yet; leaving it to finish", static_cast<int>(pid_));
  if (pidfd_ >= 0) ::close(pidfd_);
}

}  // namespace xenprobes::guardian
