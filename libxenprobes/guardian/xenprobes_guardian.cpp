// xenprobes-guardian: the process a Session spawns to undo what it leaves in its guests if it
// dies without undoing it (docs/guardian.md).
//
//   xenprobes-guardian --journal-fd 3 --pipe-fd 4 [--ready-fd 5] --owner <pid> --backend xen|sim
//
// First, before anything can fail: SIGPIPE ignored (its stderr may be a pipe nobody reads
// any more, as after ^C on `prog 2>&1 | tee log`), fds 0-2 made valid (/dev/null where
// closed: a descriptor it opens later must never be taken for stderr), every other inherited
// descriptor closed. Then it checks what it was given: the journal a memfd sealed against
// resizing (guardian/journal.hpp), the pipe the read end of a pipe, the ready fd the write
// end of one, the owner its parent (it keeps a pidfd of it, to know when it is really gone).
// Anything wrong: it says why and exits 2, having touched nothing; the owner, which waits for
// "ready" on the ready fd, then refuses to go on.
//
// It blocks reading the pipe, whose write end only the owner holds, and holds nothing of any
// domain meanwhile: no hypervisor handle, no mapping, no pause. End of file: the journal's
// clean flag set, it exits 0 without a word. Not set: it acts only once the owner has exited
// (an owner that closed the pipe and still runs is waited for), then recovers every journaled
// domain that still exists under the journaled handle (guardian/recovery.hpp), logging each
// step to syslog as it goes and to stderr once recovery is over (recovery never waits on
// stderr), and exits.
//
// Exit status: 0 nothing to do, or recovered; 1 a recovery step failed; 2 bad arguments or
// inputs refused; 3 the journal unreadable, or the hypervisor unavailable.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <syslog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "guardian/journal.hpp"
#include "guardian/recovery.hpp"
#include "hv/hypervisor.hpp"

namespace {

using namespace xenprobes;

int syslog_level(log::Level l) {
  switch (l) {
    case log::Level::Debug: return LOG_DEBUG;
    case log::Level::Info: return LOG_INFO;
    case log::Level::Warn: return LOG_WARNING;
    default: return LOG_ERR;
  }
}

// The account: each line to syslog at once, and to stderr at once except while recovering,
// when the lines wait until recovery is over: stderr may be a pipe nobody reads, or one that
// is full, and recovery must never wait on it.
class Account {
 public:
  void say(log::Level l, const std::string& line) {
    syslog(syslog_level(l), "%s", line.c_str());
    std::string out = "xenprobes-guardian[" + std::to_string(::getpid()) + "]: " + line + "\n";
    if (hold_) held_.push_back(std::move(out));
    else emit(out);
  }
  void hold() { hold_ = true; }
  // The lines held back, then the exit status.
  int finish(int status) {
    hold_ = false;
    for (const auto& l : held_) emit(l);
    held_.clear();
    return status;
  }

 private:
  // Best effort: a broken pipe (EPIPE: SIGPIPE is ignored), a full one (EAGAIN: see
  // own_nonblocking_stderr) or a closed stderr loses the line, which syslog has.
  static void emit(const std::string& s) {
    std::size_t done = 0;
    while (done < s.size()) {
      ssize_t n = ::write(STDERR_FILENO, s.data() + done, s.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<std::size_t>(n);
    }
  }
  bool hold_ = false;
  std::vector<std::string> held_;
};

// fds 0-2 open: /dev/null where one is closed (a directory, which takes no write, if even
// /dev/null cannot be opened).
void fill_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    int n = ::open("/dev/null", O_RDWR);
    if (n < 0) n = ::open("/", O_RDONLY | O_DIRECTORY);
    if (n >= 0 && n != fd) {
      ::dup2(n, fd);
      ::close(n);
    }
  }
}

// A stderr that is a pipe gets an open file description of its own, non-blocking: a full
// pipe whose reader lives but does not read (a stopped `tee`, a pager) then loses the lines
// (syslog has them) instead of stopping the guardian before or after recovery. The owner's
// description, which the guardian shared until now, keeps its flags. Files and terminals
// are left as they are (a file's new description would start writing at offset 0).
void own_nonblocking_stderr() {
  struct stat st {};
  if (::fstat(STDERR_FILENO, &st) < 0 || !S_ISFIFO(st.st_mode)) return;
  const int fd = ::open("/proc/self/fd/2", O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;  // no /proc, or no reader left (ENXIO): as it was
  ::dup2(fd, STDERR_FILENO);
  ::close(fd);
}

// Every descriptor but 0-2 and `keep` closed: whatever the owner let through is none of ours.
void close_others(std::vector<int> keep) {
  std::sort(keep.begin(), keep.end());
  unsigned lo = 3;
  auto close_from_to = [](unsigned a, unsigned b) {
    if (::syscall(SYS_close_range, a, b, 0) == 0) return;
    for (unsigned fd = a; fd <= std::min(b, 65535u); ++fd) ::close(static_cast<int>(fd));  // no close_range (< 5.9)
  };
  for (int k : keep) {
    if (k < 0 || static_cast<unsigned>(k) < lo) continue;
    if (static_cast<unsigned>(k) > lo) close_from_to(lo, static_cast<unsigned>(k) - 1);
    lo = static_cast<unsigned>(k) + 1;
  }
  close_from_to(lo, ~0u);
}

// A pipe end of the right direction.
std::optional<std::string> not_a_pipe_end(int fd, int accmode) {
  struct stat st {};
  if (::fstat(fd, &st) < 0) return std::string("cannot fstat it: ") + std::strerror(errno);
  if (!S_ISFIFO(st.st_mode)) return std::string("it is not a pipe");
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) != accmode)
    return std::string("it is not the ") + (accmode == O_RDONLY ? "read" : "write") + " end of a pipe";
  return std::nullopt;
}

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Whether the owner has exited: its pidfd is readable then. Without a pidfd (Linux < 5.3),
// whether this process has another parent.
bool owner_gone(int pidfd, pid_t owner) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
  return ::getppid() != owner;
}

void wait_owner_gone(int pidfd, pid_t owner) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    while (::poll(&p, 1, -1) < 0 && errno == EINTR) {}
    return;
  }
  while (::getppid() == owner) std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

int parse_int(const char* s, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  return (errno == 0 && end != s && *end == 0 && v >= lo && v <= hi) ? static_cast<int>(v) : -1;
}

int usage() {
  std::fprintf(stderr,
               "usage: xenprobes-guardian --journal-fd N --pipe-fd N [--ready-fd N] --owner PID --backend xen|sim\n"
               "Started by libxenprobes; not meant to be run by hand (docs/guardian.md).\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  fill_standard_fds();
  own_nonblocking_stderr();
  int journal_fd = -1, pipe_fd = -1, ready_fd = -1;
  pid_t owner = -1;
  std::string backend;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    if (a == "--journal-fd") journal_fd = parse_int(v, 3, 65535);
    else if (a == "--pipe-fd") pipe_fd = parse_int(v, 3, 65535);
    else if (a == "--ready-fd") ready_fd = parse_int(v, 3, 65535);
    else if (a == "--owner") owner = parse_int(v, 1, 0x7fffffff);
    else if (a == "--backend") backend = v;
    else return usage();
  }
  if (journal_fd < 0 || pipe_fd < 0 || owner <= 0 || (backend != "xen" && backend != "sim") || journal_fd == pipe_fd ||
      ready_fd == journal_fd || ready_fd == pipe_fd)
    return usage();
  close_others({journal_fd, pipe_fd, ready_fd});
  openlog("xenprobes-guardian", LOG_PID, LOG_DAEMON);
  Account acc;
  const std::string who = "owner " + std::to_string(owner);
  auto refuse = [&](const std::string& why) {
    acc.say(log::Level::Error, "refusing to start: " + why);
    return 2;
  };

  // ---- what it was given.
  if (auto j = guardian::check_journal_fd(journal_fd); !j)
    return refuse("fd " + std::to_string(journal_fd) + " (the journal): " + j.error().what);
  if (auto why = not_a_pipe_end(pipe_fd, O_RDONLY))
    return refuse("fd " + std::to_string(pipe_fd) + " (its owner's pipe): " + *why);
  if (ready_fd >= 0)
    if (auto why = not_a_pipe_end(ready_fd, O_WRONLY))
      return refuse("fd " + std::to_string(ready_fd) + " (the ready pipe): " + *why);
  // Its owner spawned it and waits for its word: alive, and its parent. The pidfd is taken
  // first, so that when the parent check passes the pidfd names the owner and no later
  // process given its pid.
  const int owner_fd = pidfd_open(owner);
  const int pidfd_errno = errno;
  if (::getppid() != owner)
    return refuse(who + " is not its parent (it was not started by its owner, or the owner is gone already)");
  if (owner_fd < 0 && pidfd_errno != ENOSYS)  // ENOSYS (Linux < 5.3): the parent check stands in
    return refuse("pidfd_open of " + who + ": " + std::strerror(pidfd_errno));
  if (ready_fd >= 0) {
    // EPIPE if the owner died meanwhile: nothing lost, its pidfd says so below.
    (void)!::write(ready_fd, "ready\n", 6);
    ::close(ready_fd);
  }

  // ---- waiting: the owner never writes; end of file when it closes the pipe or dies.
  char buf[64];
  for (;;) {
    ssize_t n = ::read(pipe_fd, buf, sizeof buf);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    break;  // 0: end of file; any other error means the same here
  }
  auto snap = guardian::read_journal_fd(journal_fd);
  if (snap && snap->clean) return 0;
  if (!owner_gone(owner_fd, owner)) {
    acc.say(log::Level::Warn, who +
                                  " closed its end of the pipe but is still running: waiting for it to exit "
                                  "before acting");
    wait_owner_gone(owner_fd, owner);
    snap = guardian::read_journal_fd(journal_fd);  // what it left at its very end
  }
  if (!snap) {
    acc.say(log::Level::Error,
            who + " is gone and its journal is unreadable (" + snap.error().what + "): nothing recovered");
    return 3;
  }
  if (snap->clean) return 0;

  // ---- recovery.
  acc.hold();
  acc.say(log::Level::Warn, guardian::describe_journal(who, *snap));
#ifdef XENPROBES_GUARDIAN_TEST_HOOKS
  // The test build only (tests/guardian): the simulated Xen lived in the dead owner, so
  // XENPROBES_GUARDIAN_REPORT=<file> has the journal's contents written where recovery
  // would start. The installed program has no such hook.
  if (const char* report = ::secure_getenv("XENPROBES_GUARDIAN_REPORT"); report && *report) {
    int fd = ::open(report, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return acc.finish(4);
    std::string line =
        "owner-died pid=" + std::to_string(snap->owner_pid) + " domains=" + std::to_string(snap->domains.size()) +
        " patches=" + std::to_string(snap->patches.size()) + " returns=" + std::to_string(snap->returns.size()) +
        " torn=" + std::to_string(snap->torn) + " invalid=" + std::to_string(snap->invalid) + "\n";
    bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ::close(fd);
    return acc.finish(ok ? 0 : 4);
  }
#endif
  if (snap->domains.empty()) return acc.finish(0);
  if (backend == "sim") {
    acc.say(log::Level::Error,
            "the owner ran on the simulated Xen, which lived in its own process: nothing to recover");
    return acc.finish(0);
  }
  auto hv = hv::open_hypervisor(backend);
  if (!hv) {
    acc.say(log::Level::Error, "cannot open the hypervisor (" + hv.error().what + "): nothing recovered");
    return acc.finish(3);
  }
  log::set_level(log::Level::Off);  // every line goes through the account instead
  auto rep = guardian::recover(**hv, *snap, [&](log::Level l, const std::string& line) { acc.say(l, line); });
  acc.say(rep.failures ? log::Level::Error : log::Level::Warn, guardian::describe_report(rep));
  return acc.finish(rep.failures ? 1 : 0);
}
