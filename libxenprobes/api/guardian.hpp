// The library's side of xenprobes-guardian (docs/guardian.md): spawns it with the journal
// and the read end of a pipe whose write end only this process holds. Closing the write end
// (or dying) wakes the guardian; the journal's clean flag tells it whether to act.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "common/result.hpp"

namespace xenprobes::api {

// Where the guardian program is: `configured` if set, else $XENPROBES_GUARDIAN, else the
// installed one.
std::string guardian_path(const std::string& configured);

class GuardianProcess {
 public:
  // posix_spawn (never fork) of `path` with the journal as fd 3 and the pipe's read end as
  // fd 4, in a session of its own (a terminal's ^C that kills its owner must not kill it).
  // `backend` is the hypervisor's name ("xen", "sim").
  static Result<std::unique_ptr<GuardianProcess>> spawn(const std::string& path, int journal_fd,
                                                        const std::string& backend);
  // Closes the write end (the guardian reads the journal and exits) and reaps it, waiting a
  // moment for that.
  ~GuardianProcess();
  GuardianProcess(const GuardianProcess&) = delete;
  GuardianProcess& operator=(const GuardianProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Closes the write end now, as this process's death would.
  void close_pipe();
  // Waits up to `ms` for the guardian to exit; returns its wait status, or -1.
  int wait_exit(int ms);

 private:
  GuardianProcess(pid_t pid, int wfd) : pid_(pid), wfd_(wfd) {}
  pid_t pid_ = -1;
  int wfd_ = -1;
  bool reaped_ = false;
};

}  // namespace xenprobes::api
