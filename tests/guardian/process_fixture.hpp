// Shared by the tests of the real xenprobes-guardian against its owner (process_test.cpp,
// process_start_test.cpp): temporary files, reading a pipe to its end or to a line, waiting
// for a process and reading its status, what a process has open, the report hook's file, an
// owner child process that arms a domain and hands its guardian's pid over, the guardian
// started by hand, and the journal a killed owner leaves behind.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "guardian/guardian_fixture.hpp"

extern char** environ;

namespace xenprobes::testing {

inline std::string temp_path(const char* what) {
  std::string p = ::testing::TempDir() + "xp-guardian-" + what + "-" + std::to_string(::getpid()) + "-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
  ::unlink(p.c_str());
  return p;
}

inline std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

// Everything until end of file; closes fd.
inline std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

// Reads until a line containing `what` has come (true) or end of file (false), appending
// what it read to `seen`.
inline bool read_until(int fd, const std::string& what, std::string& seen) {
  std::string line;
  for (;;) {
    char c;
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    seen += c;
    if (c != '\n') {
      line += c;
    } else if (line.find(what) != std::string::npos) {
      return true;
    } else {
      line.clear();
    }
  }
}

inline int wait_status(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return st;
}

inline bool exited_with(int st, int code) { return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == code; }
inline bool killed_by(int st, int sig) { return st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == sig; }

inline std::string status_text(int st) {
  if (st == -1) return "not waited for";
  if (WIFEXITED(st)) return "exit " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("signal ") + strsignal(WTERMSIG(st));
  return "status " + std::to_string(st);
}

// What a process has open: fd -> what /proc shows it to be.
inline std::map<int, std::string> fds_of(pid_t pid) {
  std::map<int, std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec))
    out[std::stoi(e.path().filename().string())] = std::filesystem::read_symlink(e.path(), ec).string();
  return out;
}

// What the guardian has open while it waits: stdin and stdout on /dev/null, stderr valid,
// the journal (a memfd) on 3, the pipe's read end on 4, a pidfd of its owner, nothing else.
inline void expect_watching_fds(pid_t pid, const std::string& stderr_is) {
  auto fds = fds_of(pid);
  std::string all;
  for (const auto& [fd, what] : fds) all += " " + std::to_string(fd) + "=" + what;
  ASSERT_EQ(fds.size(), 6u) << all;
  EXPECT_EQ(fds.rbegin()->second, "anon_inode:[pidfd]") << all;
  EXPECT_EQ(fds[0], "/dev/null");
  EXPECT_EQ(fds[1], "/dev/null");
  EXPECT_EQ(fds[2].rfind(stderr_is, 0), 0u) << fds[2];
  EXPECT_EQ(fds[3].rfind("/memfd:xenprobes-journal", 0), 0u) << "fd 3: " << fds[3];
  EXPECT_EQ(fds[4].rfind("pipe:", 0), 0u) << "fd 4: " << fds[4];
}

// This process adopts the orphans of its children: the guardian of an owner that died.
inline void adopt_orphans() { ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }

inline SessionOptions required(const char* bin = XP_GUARDIAN_BIN) {
  SessionOptions o;
  o.guardian = GuardianMode::Required;
  o.guardian_path = bin;
  return o;
}

// The report hook's file for this test, named in the environment the guardians inherit.
struct Report {
  std::string path = temp_path("report");
  Report() { ::setenv("XENPROBES_GUARDIAN_REPORT", path.c_str(), 1); }
  ~Report() {
    ::unsetenv("XENPROBES_GUARDIAN_REPORT");
    ::unlink(path.c_str());
  }
};

// A child process playing the guardian's owner: `body` runs in it (sets up its descriptors,
// opens a session, ...) and returns the guardian's pid, which the child hands over; then the
// child exits (`stay` false) or waits to be killed. This process must not have started a
// thread yet (the child starts the simulated Xen's).
struct Owner {
  pid_t pid = -1;
  pid_t guardian = -1;
};
inline Owner start_owner(const std::function<pid_t()>& body, bool stay) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that fails half-way leaves no owner behind
    ::close(p[0]);
    pid_t g = -1;
    try {
      g = body();
    } catch (...) {}
    (void)!::write(p[1], &g, sizeof g);
    ::close(p[1]);
    if (!stay) ::_exit(0);
    for (;;) ::pause();
  }
  ::close(p[1]);
  Owner o{pid, -1};
  std::string got = read_all(p[0]);
  if (got.size() == sizeof o.guardian) std::memcpy(&o.guardian, got.data(), sizeof o.guardian);
  return o;
}

// In an owner child: a session arms a vm_event domain with two probes (two points and a slot
// trap in the journal); `abandon`: then drops it as SIGKILL would, the process going on.
// Returns the guardian's pid.
inline pid_t probe_and_hand_over(SessionOptions o = required(), bool abandon = false) {
  static std::unique_ptr<Guest> g;  // lives as long as the child
  g = std::make_unique<Guest>(ChannelKind::VmEvent, 2, 5, o);
  auto a = g->session->probe(g->dom, "sys_read", [](HitContext&) { return 0; });
  auto b = g->session->probe(
      g->dom, "sys_getppid+5", [](HitContext&) { return 0; }, [](HitContext&) {});
  if (!a || !b) return -1;
  a->release();
  b->release();
  pid_t pid = SessionTesting::guardian_pid(*g->session);
  if (abandon) ::close(g->abandon());
  return pid;
}

// An owner whose stderr is the write end of `err` and that drops its session as SIGKILL would
// (closing its end of the guardian's pipe), then lives on until it is killed.
inline Owner start_owner_that_abandons(const int err[2]) {
  return start_owner(
      [err] {
        ::dup2(err[1], 2);
        ::close(err[0]);
        return probe_and_hand_over(required(), /*abandon=*/true);
      },
      /*stay=*/true);
}

// A close-on-exec copy of fd above 19 (out of the way of the file actions below).
inline int high(int fd) { return ::fcntl(fd, F_DUPFD_CLOEXEC, 20); }

// The guardian (test build) started by hand from this process: `journal` and `pipe_r` put
// on fds 3 and 4 (-1: left closed), a ready pipe on fd 5 if `ready`, stderr into a pipe
// (or onto `err_w`), `owner` named as its owner.
struct Launched {
  pid_t pid = -1;
  int err = -1;      // the read end of its stderr (-1 with err_w)
  std::string said;  // what it wrote on the ready pipe before closing it
};
inline Launched launch(int journal, int pipe_r, bool ready, pid_t owner, int err_w = -1,
                       const char* bin = XP_GUARDIAN_BIN) {
  Launched r;
  int e[2] = {-1, -1}, rd[2] = {-1, -1};
  if (err_w < 0 && ::pipe2(e, O_CLOEXEC) != 0) return r;
  if (ready && ::pipe2(rd, O_CLOEXEC) != 0) return r;
  std::vector<int> moved;
  auto put = [&](int fd) { return fd < 0 ? -1 : moved.emplace_back(high(fd)); };
  const int err_hi = put(err_w >= 0 ? err_w : e[1]), j = put(journal), p = put(pipe_r), ready_hi = put(rd[1]);
  if (e[1] >= 0) ::close(e[1]);
  if (rd[1] >= 0) ::close(rd[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, err_hi, 2);
  if (j >= 0) posix_spawn_file_actions_adddup2(&fa, j, 3);
  if (p >= 0) posix_spawn_file_actions_adddup2(&fa, p, 4);
  if (ready_hi >= 0) posix_spawn_file_actions_adddup2(&fa, ready_hi, 5);
  std::vector<std::string> args{bin,       "--journal-fd",        "3",         "--pipe-fd", "4",
                                "--owner", std::to_string(owner), "--backend", "sim"};
  if (ready) args.insert(args.end(), {"--ready-fd", "5"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int rc = ::posix_spawn(&r.pid, bin, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  for (int fd : moved) ::close(fd);
  if (rc != 0) r.pid = -1;
  r.err = e[0];
  if (ready) r.said = read_all(rd[0]);
  return r;
}

// A journal with one debugger-channel domain and a patch, as a killed owner leaves it.
inline std::unique_ptr<guardian::Journal> left_behind() {
  auto j = guardian::Journal::create(guardian::JournalLimits{2, 4, 4});
  if (!j) throw std::runtime_error(j.error().what);
  const std::uint8_t trap[] = {0xf1}, orig[] = {0x55};
  if (!(*j)->add_domain(DomId{3}, hv::DomainHandle{1, 2, 3}, guardian::JournalChannel::Debugger, 0xf1,
                        guardian::JournalMonitor::None, 1) ||
      !(*j)->add_patch(DomId{3}, guardian::PatchKind::Text, Gva{0xffffffff81000010}, trap, orig,
                       Gva{0xffffffff81000010}))
    throw std::runtime_error("cannot fill the journal");
  return std::move(*j);
}

}  // namespace xenprobes::testing
