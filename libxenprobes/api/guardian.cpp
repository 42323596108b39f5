#include "api/guardian.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common/log.hpp"

extern char** environ;

namespace xenprobes::api {

#ifndef XENPROBES_GUARDIAN_DEFAULT
#define XENPROBES_GUARDIAN_DEFAULT "/usr/local/libexec/xenprobes/xenprobes-guardian"
#endif

std::string guardian_path(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* e = std::getenv("XENPROBES_GUARDIAN"); e && *e) return e;
  return XENPROBES_GUARDIAN_DEFAULT;
}

Result<std::unique_ptr<GuardianProcess>> GuardianProcess::spawn(const std::string& path, int journal_fd,
                                                                const std::string& backend) {
  if (::access(path.c_str(), X_OK) != 0)
    return fail_errno(errno, "the guardian program " + path +
                                 " (install it, or name it with $XENPROBES_GUARDIAN or SessionOptions::guardian_path)");
  int p[2];
  // Both ends close on exec: only the dup2 below gives the guardian its read end, and no
  // other program this process starts ever holds the write end (it would keep the pipe open
  // after our death).
  if (::pipe2(p, O_CLOEXEC) < 0) return fail_errno(errno, "pipe2 for the guardian");
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&at);
  posix_spawn_file_actions_adddup2(&fa, journal_fd, 3);
  posix_spawn_file_actions_adddup2(&fa, p[0], 4);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  posix_spawn_file_actions_addclosefrom_np(&fa, 5);  // nothing else of ours goes with it
#endif
  // Its own session: no terminal signals (^C, hangup) meant for its owner; default signal
  // dispositions and an empty mask whatever the owner set.
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
  std::vector<std::string> args{path, "--journal-fd", "3", "--pipe-fd", "4", "--owner", owner, "--backend", backend};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, path.c_str(), &fa, &at, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  ::close(p[0]);
  if (rc != 0) {
    ::close(p[1]);
    return fail_errno(rc, "posix_spawn of the guardian " + path);
  }
  XP_LOG(Info, "guardian %s started (pid %d)", path.c_str(), static_cast<int>(pid));
  return std::unique_ptr<GuardianProcess>(new GuardianProcess(pid, p[1]));
}

void GuardianProcess::close_pipe() {
  if (wfd_ >= 0) ::close(wfd_);
  wfd_ = -1;
}

int GuardianProcess::wait_exit(int ms) {
  if (reaped_ || pid_ <= 0) return -1;
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) {
      reaped_ = true;  // ECHILD: reaped by someone else (SIGCHLD ignored)
      return r == pid_ ? status : -1;
    }
    if (std::chrono::steady_clock::now() >= end) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

GuardianProcess::~GuardianProcess() {
  close_pipe();
  if (wait_exit(2000) == -1 && !reaped_)
    XP_LOG(Warn, "guardian (pid %d) has not exited yet; leaving it to finish", static_cast<int>(pid_));
}

}  // namespace xenprobes::api
