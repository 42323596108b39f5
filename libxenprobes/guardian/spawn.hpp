// The library's side of xenprobes-guardian (docs/guardian.md): spawns it with the journal
// and the read end of a pipe whose write end only this process holds. Closing the write end
// (or dying) wakes the guardian; the journal's clean flag, and whether this process still
// exists, tell it whether to act.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "common/result.hpp"

namespace xenprobes::guardian {

// Where the guardian program is: `configured` if set, else $XENPROBES_GUARDIAN (read with
// secure_getenv: ignored in a set-user-ID or otherwise privileged-at-exec process), else the
// installed one.
std::string guardian_path(const std::string& configured);

class GuardianProcess {
 public:
  // posix_spawn (never fork) of `path` with the journal as fd 3, the pipe's read end as fd 4
  // and the write end of a "ready" pipe as fd 5 (each moved above fd 9 first, so that no
  // descriptor of this process, whatever its number, can land on another's place), stdin
  // and stdout on /dev/null, stderr inherited, nothing else; in a session of its own (a
  // terminal's ^C that kills its owner must not kill it). Returns once the guardian has
  // checked what it was given and is watching: a guardian that refuses (and says why on its
  // stderr and to syslog) fails the spawn. `path` must be absolute (posix_spawn would resolve
  // a relative one against the working directory). `backend` is the hypervisor's name.
  static Result<std::unique_ptr<GuardianProcess>> spawn(const std::string& path, int journal_fd,
                                                        const std::string& backend);
  // Closes the write end (the guardian reads the journal and exits) and reaps it, waiting a
  // moment for that.
  ~GuardianProcess();
  GuardianProcess(const GuardianProcess&) = delete;
  GuardianProcess& operator=(const GuardianProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Closes the write end now, as this process's death would (the guardian then also waits
  // for this process to exit before it acts).
  void close_pipe();
  // close_pipe(), and the destructor neither waits for the guardian nor reaps it: what
  // SIGKILL of this process would leave.
  void abandon();
  // Waits up to `ms` for the guardian to exit; returns its wait status, or -1.
  int wait_exit(int ms);

 private:
  GuardianProcess(pid_t pid, int pidfd, int wfd) : pid_(pid), pidfd_(pidfd), wfd_(wfd) {}
  pid_t pid_ = -1;
  int pidfd_ = -1;  // the guardian's, to wait for its exit without polling (-1: none)
  int wfd_ = -1;
  bool reaped_ = false;
};

}  // namespace xenprobes::guardian
