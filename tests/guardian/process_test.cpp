// The real xenprobes-guardian against its owner. XP_GUARDIAN_BIN is the program's test build,
// whose only difference is the report hook (XENPROBES_GUARDIAN_REPORT=<file>: the journal's
// contents written where recovery would start; the simulated Xen lives in the owner's
// process, so that is all a guardian could do for it; recovery itself is tested in-process,
// recovery_test.cpp). XP_GUARDIAN_PROD_BIN is the program as installed.
//
// An owner that dies is a child process of this test (start_owner); this process adopts the
// orphaned guardian (PR_SET_CHILD_SUBREAPER) to wait for it. Nothing here waits for time to
// pass: every wait is for an exit, an end of file, or a line the guardian writes.
#include "guardian/guardian_fixture.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>

#include "guardian/spawn.hpp"

extern char** environ;

namespace xenprobes::testing {
namespace {

std::string temp_path(const char* what) {
  std::string p = ::testing::TempDir() + "xp-guardian-" + what + "-" + std::to_string(::getpid()) + "-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
  ::unlink(p.c_str());
  return p;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

// Everything until end of file; closes fd.
std::string read_all(int fd) {
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
bool read_until(int fd, const std::string& what, std::string& seen) {
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

int wait_status(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return st;
}

bool exited_with(int st, int code) { return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == code; }
bool killed_by(int st, int sig) { return st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == sig; }

std::string status_text(int st) {
  if (st == -1) return "not waited for";
  if (WIFEXITED(st)) return "exit " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("signal ") + strsignal(WTERMSIG(st));
  return "status " + std::to_string(st);
}

// What a process has open: fd -> what /proc shows it to be.
std::map<int, std::string> fds_of(pid_t pid) {
  std::map<int, std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec))
    out[std::stoi(e.path().filename().string())] = std::filesystem::read_symlink(e.path(), ec).string();
  return out;
}

// What the guardian has open while it waits: stdin and stdout on /dev/null, stderr valid,
// the journal (a memfd) on 3, the pipe's read end on 4, a pidfd of its owner, nothing else.
void expect_watching_fds(pid_t pid, const std::string& stderr_is) {
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
void adopt_orphans() { ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }

SessionOptions required(const char* bin = XP_GUARDIAN_BIN) {
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
Owner start_owner(const std::function<pid_t()>& body, bool stay) {
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
pid_t probe_and_hand_over(SessionOptions o = required(), bool abandon = false) {
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
Owner start_owner_that_abandons(const int err[2]) {
  return start_owner(
      [err] {
        ::dup2(err[1], 2);
        ::close(err[0]);
        return probe_and_hand_over(required(), /*abandon=*/true);
      },
      /*stay=*/true);
}

// A close-on-exec copy of fd above 19 (out of the way of the file actions below).
int high(int fd) { return ::fcntl(fd, F_DUPFD_CLOEXEC, 20); }

// The guardian (test build) started by hand from this process: `journal` and `pipe_r` put
// on fds 3 and 4 (-1: left closed), a ready pipe on fd 5 if `ready`, stderr into a pipe
// (or onto `err_w`), `owner` named as its owner.
struct Launched {
  pid_t pid = -1;
  int err = -1;      // the read end of its stderr (-1 with err_w)
  std::string said;  // what it wrote on the ready pipe before closing it
};
Launched launch(int journal, int pipe_r, bool ready, pid_t owner, int err_w = -1, const char* bin = XP_GUARDIAN_BIN) {
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
std::unique_ptr<guardian::Journal> left_behind() {
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

// ---- a session's guardian ------------------------------------------------------------------

// Spawned with the first debugger domain, with fd 3 free at that moment (the pipe's read end
// lands there, where the guardian's journal goes); silent and reaped on an orderly end.
TEST(GuardianProcess, SpawnedWithTheFirstDebuggerDomainAndSilentOnACleanEnd) {
  Report report;
  const int placeholder = ::fcntl(3, F_GETFD) < 0 ? ::open("/dev/null", O_RDONLY) : -1;  // fd 3, until the spawn
  Guest g(ChannelKind::Debugger, 1, 5, required(), /*load=*/false);
  EXPECT_EQ(SessionTesting::guardian_pid(*g.session), -1) << "none before a domain needs one";
  if (placeholder >= 0) ::close(placeholder);
  ASSERT_TRUE(g.session->load_symbols(g.dom, demo_map()));  // attaches the domain
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_TRUE(a) << a.error().what;
  pid_t pid = SessionTesting::guardian_pid(*g.session);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(SessionTesting::wait_guardian(*g.session, 0), -1) << "it waits while its owner lives";
  expect_watching_fds(pid, "");
  a->release();
  g.session.reset();  // orderly: the clean flag, then end of file; the session reaps it
  EXPECT_EQ(::kill(pid, 0), -1) << "reaped";
  EXPECT_FALSE(exists(report.path)) << "a clean end: nothing reported";
}

// The owner is SIGKILLed with probes armed: the guardian acts (reports what it would recover)
// and exits 0.
TEST(GuardianProcess, ActsWhenItsOwnerIsKilled) {
  adopt_orphans();
  Report report;
  Owner o = start_owner([] { return probe_and_hand_over(); }, /*stay=*/true);
  ASSERT_GT(o.guardian, 0);
  EXPECT_FALSE(exists(report.path)) << "its owner lives";
  ASSERT_EQ(::kill(o.pid, SIGKILL), 0);
  EXPECT_TRUE(killed_by(wait_status(o.pid), SIGKILL));
  int st = wait_status(o.guardian);  // adopted when its owner died
  EXPECT_TRUE(exited_with(st, 0)) << status_text(st);
  std::string r = slurp(report.path);
  EXPECT_EQ(r.rfind("owner-died pid=" + std::to_string(o.pid) + " domains=1 patches=3 ", 0), 0u)
      << r << " (2 points and a slot trap)";
}

// The owner closes its end of the pipe without the clean flag and goes on running (as an
// application closing every descriptor above 2 would): the guardian says so and does nothing
// until the owner has really exited; then it acts.
TEST(GuardianProcess, AnOwnerThatClosedThePipeButLivesIsWaitedFor) {
  adopt_orphans();
  Report report;
  int err[2];
  ASSERT_EQ(::pipe2(err, O_CLOEXEC), 0);
  Owner o = start_owner_that_abandons(err);
  ::close(err[1]);
  ASSERT_GT(o.guardian, 0);
  std::string seen;
  ASSERT_TRUE(read_until(err[0], "closed its end of the pipe but is still running: waiting for it to exit", seen))
      << seen;
  EXPECT_FALSE(exists(report.path)) << "nothing done while its owner lives";
  ASSERT_EQ(::kill(o.pid, SIGKILL), 0);
  EXPECT_TRUE(killed_by(wait_status(o.pid), SIGKILL));
  int st = wait_status(o.guardian);
  EXPECT_TRUE(exited_with(st, 0)) << status_text(st);
  EXPECT_EQ(slurp(report.path).rfind("owner-died pid=" + std::to_string(o.pid) + " domains=1 patches=3 ", 0), 0u);
  std::string rest = read_all(err[0]);
  EXPECT_NE(rest.find("owner " + std::to_string(o.pid) + " ended without cleaning up: recovering 1 domains"),
            std::string::npos)
      << rest;
}

// Its stderr is a pipe whose reader lives but reads no more (a stopped `tee`, a pager) and is
// full by the time the owner dies: the guardian still recovers and exits (the lines it could
// not write are in syslog), rather than hang in write() for as long as the reader lives.
TEST(GuardianProcess, AFullStderrPipeWhoseReaderLivesDoesNotStopIt) {
  adopt_orphans();
  Report report;
  int err[2];
  ASSERT_EQ(::pipe2(err, O_CLOEXEC), 0);
  Owner o = start_owner_that_abandons(err);
  ASSERT_GT(o.guardian, 0);
  std::string seen;
  ASSERT_TRUE(read_until(err[0], "closed its end of the pipe but is still running", seen)) << seen;
  {
    // Filled through a description of the test's own: the owner's and the guardian's stay blocking.
    const int fill = ::open(("/proc/self/fd/" + std::to_string(err[1])).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    ASSERT_GE(fill, 0) << std::strerror(errno);
    const std::string chunk(4096, 'x');
    std::size_t filled = 0;
    for (ssize_t n; (n = ::write(fill, chunk.data(), chunk.size())) > 0;) filled += static_cast<std::size_t>(n);
    EXPECT_EQ(errno, EAGAIN);
    EXPECT_GE(filled, 4096u);
    ::close(fill);
  }
  ::close(err[1]);
  ASSERT_EQ(::kill(o.pid, SIGKILL), 0);
  EXPECT_TRUE(killed_by(wait_status(o.pid), SIGKILL));
  int st = -1;
  for (int i = 0; i < 200 && st == -1; ++i) {  // up to 20 s
    int w = 0;
    if (::waitpid(o.guardian, &w, WNOHANG) == o.guardian) st = w;
    else std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (st == -1) {
    ::kill(o.guardian, SIGKILL);
    wait_status(o.guardian);
    FAIL() << "the guardian still waits to write into its full stderr pipe 20 s after its owner died";
  }
  EXPECT_TRUE(exited_with(st, 0)) << status_text(st);
  EXPECT_EQ(slurp(report.path).rfind("owner-died pid=" + std::to_string(o.pid) + " domains=1 patches=3 ", 0), 0u);
  ::close(err[0]);
}

// `prog 2>&1 | tee log`, then ^C: the terminal's SIGINT kills tee and the owner (here tee
// first, so that the guardian's account meets a pipe nobody reads). The guardian, in a
// session of its own, gets no SIGINT; writing its stderr gets EPIPE, not SIGPIPE's death,
// and it finishes.
TEST(GuardianProcess, OwnerAndTeeKilledByCtrlC) {
  adopt_orphans();
  Report report;
  const std::string log = temp_path("tee-log");
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  pid_t tee = ::fork();
  if (tee == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(p[0], 0);
    ::execlp("tee", "tee", log.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  Owner o = start_owner(
      [&] {
        ::dup2(p[1], 1);
        ::dup2(p[1], 2);
        ::close(p[0]);
        return probe_and_hand_over();
      },
      /*stay=*/true);
  ::close(p[0]);
  ::close(p[1]);
  ASSERT_GT(o.guardian, 0);
  expect_watching_fds(o.guardian, "pipe:");
  ASSERT_EQ(::kill(tee, SIGINT), 0);
  EXPECT_TRUE(killed_by(wait_status(tee), SIGINT));
  ASSERT_EQ(::kill(o.pid, SIGINT), 0);
  EXPECT_TRUE(killed_by(wait_status(o.pid), SIGINT));
  int st = wait_status(o.guardian);
  EXPECT_TRUE(exited_with(st, 0)) << status_text(st);
  EXPECT_EQ(slurp(report.path).rfind("owner-died pid=" + std::to_string(o.pid) + " domains=1 patches=3 ", 0), 0u);
  ::unlink(log.c_str());
}

// The owner runs with stderr closed (`prog 2>&-`): the guardian gets /dev/null there (so no
// descriptor it opens later is taken for stderr), watches as usual and acts on its death.
TEST(GuardianProcess, OwnerWithStderrClosed) {
  adopt_orphans();
  Report report;
  Owner o = start_owner(
      [] {
        ::close(2);
        return probe_and_hand_over();
      },
      /*stay=*/true);
  ASSERT_GT(o.guardian, 0);
  expect_watching_fds(o.guardian, "/dev/null");
  ASSERT_EQ(::kill(o.pid, SIGKILL), 0);
  EXPECT_TRUE(killed_by(wait_status(o.pid), SIGKILL));
  int st = wait_status(o.guardian);
  EXPECT_TRUE(exited_with(st, 0)) << status_text(st);
  std::string r = slurp(report.path);
  EXPECT_EQ(r.rfind("owner-died pid=" + std::to_string(o.pid) + " domains=1 patches=3 ", 0), 0u) << r;
  EXPECT_EQ(std::count(r.begin(), r.end(), '\n'), 1) << "the report alone: " << r;
}

// The installed program has no report hook: with XENPROBES_GUARDIAN_REPORT set it goes the
// production way (here, for the simulated Xen: nothing to recover, said so) and writes no file.
TEST(GuardianProcess, TheInstalledProgramHasNoReportHook) {
  adopt_orphans();
  Report report;
  int err[2];
  ASSERT_EQ(::pipe2(err, O_CLOEXEC), 0);
  Owner o = start_owner(
      [&] {
        ::dup2(err[1], 2);
        ::close(err[0]);
        return probe_and_hand_over(required(XP_GUARDIAN_PROD_BIN));
      },
      /*stay=*/true);
  ::close(err[1]);
  ASSERT_GT(o.guardian, 0);
  ASSERT_EQ(::kill(o.pid, SIGKILL), 0);
  EXPECT_TRUE(killed_by(wait_status(o.pid), SIGKILL));
  int st = wait_status(o.guardian);
  EXPECT_TRUE(exited_with(st, 0)) << status_text(st);
  std::string out = read_all(err[0]);
  EXPECT_NE(out.find("ended without cleaning up: recovering 1 domains (3 patches"), std::string::npos) << out;
  EXPECT_NE(out.find("the owner ran on the simulated Xen, which lived in its own process: nothing to recover"),
            std::string::npos)
      << out;
  EXPECT_FALSE(exists(report.path));
}

TEST(GuardianProcess, RequiredRefusesTheDomainWhenItCannotBeSpawned) {
  SessionOptions o = required("/nonexistent/xenprobes-guardian");
  Guest g(ChannelKind::Debugger, 1, 5, o, /*load=*/false);
  auto a = g.session->load_symbols(g.dom, demo_map());  // attaching the domain is refused
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().what.find("guardian"), std::string::npos) << a.error().what;
  EXPECT_EQ(g.text(), g.text_before) << "nothing patched";
  EXPECT_FALSE(g.session->hypervisor().domain_info(g.dom)->debugged) << "the channel never touched the domain";
}

// A program that starts but never says "ready" (here one that exits at once) is no guardian:
// Required refuses the domain.
TEST(GuardianProcess, RequiredRefusesTheDomainWhenTheGuardianDoesNotStart) {
  Guest g(ChannelKind::Debugger, 1, 5, required("/bin/false"), /*load=*/false);
  auto a = g.session->load_symbols(g.dom, demo_map());
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().what.find("the guardian /bin/false did not start (exit status 1)"), std::string::npos)
      << a.error().what;
  EXPECT_EQ(g.text(), g.text_before) << "nothing patched";
  EXPECT_FALSE(g.session->hypervisor().domain_info(g.dom)->debugged);
}

// The program's path comes from the options, else $XENPROBES_GUARDIAN; a relative one is
// refused (it would be looked up in the working directory).
TEST(GuardianProcess, ARelativePathIsRefused) {
  ::setenv("XENPROBES_GUARDIAN", "/opt/xp/guardian", 1);
  EXPECT_EQ(guardian::guardian_path(""), "/opt/xp/guardian");
  EXPECT_EQ(guardian::guardian_path("/usr/x"), "/usr/x");
  ::setenv("XENPROBES_GUARDIAN", "xenprobes-guardian", 1);
  Guest g(ChannelKind::Debugger, 1, 5, required(""), /*load=*/false);
  auto a = g.session->load_symbols(g.dom, demo_map());
  ::unsetenv("XENPROBES_GUARDIAN");
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().what.find("'xenprobes-guardian' is not an absolute path"), std::string::npos) << a.error().what;
  EXPECT_EQ(g.text(), g.text_before);
}

TEST(GuardianProcess, AutoGoesOnWithAWarningAndOffKeepsNoJournal) {
  SessionOptions o;
  o.guardian = GuardianMode::Auto;
  o.guardian_path = "/nonexistent/xenprobes-guardian";
  {
    Guest g(ChannelKind::Debugger, 1, 5, o);
    auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
    EXPECT_TRUE(a) << a.error().what;
    EXPECT_EQ(SessionTesting::guardian_pid(*g.session), -1);
  }
  o.guardian = GuardianMode::Off;
  Guest g(ChannelKind::Debugger, 1, 5, o);
  EXPECT_EQ(SessionTesting::journal_fd(*g.session), -1);
  EXPECT_TRUE(g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; }));
}

// ---- spawning, whatever this process's descriptors ------------------------------------------

// Each of fds 0-3 saved and closed; restore() puts them back.
struct LowFds {
  std::array<int, 5> saved{-1, -1, -1, -1, -1};
  void close_(int fd) {
    saved[fd] = high(fd);
    ::close(fd);
  }
  void restore() {
    for (int fd = 0; fd < 5; ++fd)
      if (saved[fd] >= 0) {
        ::dup2(saved[fd], fd);
        ::close(saved[fd]);
        saved[fd] = -1;
      }
  }
  ~LowFds() { restore(); }
};

// The guardian was given the right descriptors (it said "ready" after checking them) and
// watches the right pipe: the clean flag and end of file make it exit 0 at once.
void expect_guardian_works(guardian::Journal& j, guardian::GuardianProcess& g) {
  expect_watching_fds(g.pid(), "");
  EXPECT_EQ(g.wait_exit(0), -1) << "waiting";
  j.set_clean(true);
  g.close_pipe();
  int st = g.wait_exit(10000);
  EXPECT_TRUE(exited_with(st, 0)) << status_text(st);
}

// fds 0-3 all closed when the session spawns: its pipes take them.
TEST(GuardianSpawn, WithDescriptors0To3Closed) {
  auto j = left_behind();
  const int journal = high(j->fd());
  LowFds low;
  for (int fd = 0; fd <= 3; ++fd) low.close_(fd);
  auto g = guardian::GuardianProcess::spawn(XP_GUARDIAN_BIN, journal, "sim");
  low.restore();
  ASSERT_TRUE(g) << g.error().what;
  expect_guardian_works(*j, **g);
  ::close(journal);
}

// The journal on fd 4 and fd 3 free: the pipe's read end lands on fd 3; each must still end
// up in its place in the guardian (4 -> 3 and 3 -> 4 at once).
TEST(GuardianSpawn, WithThePipeOnFd3AndTheJournalOnFd4) {
  auto j = left_behind();
  const int journal = high(j->fd());
  LowFds low;
  low.close_(3);
  low.close_(4);
  ASSERT_EQ(::dup2(journal, 4), 4);
  auto g = guardian::GuardianProcess::spawn(XP_GUARDIAN_BIN, 4, "sim");
  ::close(4);
  low.restore();
  ASSERT_TRUE(g) << g.error().what;
  expect_guardian_works(*j, **g);
  ::close(journal);
}

// ---- what the guardian refuses to start with --------------------------------------------

// Run by hand with `journal` and `pipe_r`: refused (exit 2, no "ready"), saying `why`.
void expect_refused(int journal, int pipe_r, const std::string& why) {
  Launched r = launch(journal, pipe_r, /*ready=*/true, ::getpid());
  ASSERT_GT(r.pid, 0);
  std::string err = read_all(r.err);
  int st = wait_status(r.pid);
  EXPECT_TRUE(exited_with(st, 2)) << status_text(st) << ": " << err;
  EXPECT_EQ(r.said, "") << "no word of readiness";
  EXPECT_NE(err.find("refusing to start: " + why), std::string::npos) << err;
}

TEST(GuardianInputs, AJournalThatIsNotASealedMemfdIsRefused) {
  auto j = left_behind();
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, static_cast<off_t>(j->bytes().size())), 0);
  ASSERT_EQ(::pwrite(unsealed, j->bytes().data(), j->bytes().size(), 0), static_cast<ssize_t>(j->bytes().size()));
  expect_refused(unsealed, p[0], "fd 3 (the journal): the journal is not sealed against resizing");
  int q[2];
  ASSERT_EQ(::pipe2(q, O_CLOEXEC), 0);
  expect_refused(q[0], p[0], "fd 3 (the journal): the journal is not a memfd");
  for (int fd : {p[0], p[1], q[0], q[1], unsealed}) ::close(fd);
}

TEST(GuardianInputs, APipeFdThatIsNotAPipesReadEndIsRefused) {
  auto j = left_behind();
  int file = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  expect_refused(j->fd(), file, "fd 4 (its owner's pipe): it is not a pipe");
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  expect_refused(j->fd(), p[1], "fd 4 (its owner's pipe): it is not the read end of a pipe");
  for (int fd : {p[0], p[1], file}) ::close(fd);
}

TEST(GuardianInputs, AnOwnerThatIsNotItsParentIsRefused) {
  auto j = left_behind();
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  Launched r = launch(j->fd(), p[0], /*ready=*/true, /*owner=*/1);
  std::string err = read_all(r.err);
  int st = wait_status(r.pid);
  EXPECT_TRUE(exited_with(st, 2)) << status_text(st) << ": " << err;
  EXPECT_NE(err.find("refusing to start: owner 1 is not its parent"), std::string::npos) << err;
  ::close(p[0]);
  ::close(p[1]);
}

// Descriptors its starter let through (not close-on-exec, not among the three it is given)
// are closed before it waits: it holds nothing of anyone's.
TEST(GuardianInputs, InheritedDescriptorsAreClosed) {
  auto j = left_behind();
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  const int null = ::open("/dev/null", O_RDONLY);
  const int stray = ::fcntl(null, F_DUPFD, 10);  // not close-on-exec: posix_spawn passes it on
  ::close(null);
  ASSERT_GE(stray, 10);
  Launched r = launch(j->fd(), p[0], /*ready=*/true, ::getpid());
  ::close(stray);
  ASSERT_EQ(r.said, "ready\n");
  auto fds = fds_of(r.pid);
  std::string all;
  for (const auto& [fd, what] : fds) all += " " + std::to_string(fd) + "=" + what;
  EXPECT_EQ(fds.size(), 6u) << all << " (0-2, the journal, the pipe, its owner's pidfd)";
  EXPECT_FALSE(fds.contains(stray)) << all;
  ASSERT_EQ(::kill(r.pid, SIGKILL), 0);  // it waits for this process: end it here
  EXPECT_TRUE(killed_by(wait_status(r.pid), SIGKILL));
  ::close(r.err);
  ::close(p[0]);
  ::close(p[1]);
}

// A sealed memfd of a journal's size full of noise: accepted at start (it is what it should
// be), unreadable once its owner is gone: exit 3, saying so, nothing done.
TEST(GuardianInputs, AnUnreadableJournalIsReportedOnceItsOwnerIsGone) {
  adopt_orphans();
  auto j = left_behind();
  std::vector<std::uint8_t> noise(j->bytes().size());
  std::mt19937 rng(11);
  for (auto& b : noise) b = static_cast<std::uint8_t>(rng());
  int m = ::memfd_create("noise", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(m, 0);
  ASSERT_EQ(::pwrite(m, noise.data(), noise.size(), 0), static_cast<ssize_t>(noise.size()));
  ASSERT_EQ(::fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  int err[2];
  ASSERT_EQ(::pipe2(err, O_CLOEXEC), 0);
  Owner o = start_owner(
      [&] {
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0) return pid_t{-1};
        Launched r = launch(m, p[0], /*ready=*/true, ::getpid(), err[1]);
        return r.said == "ready\n" ? r.pid : pid_t{-1};  // then this owner exits
      },
      /*stay=*/false);
  ::close(err[1]);
  ASSERT_GT(o.guardian, 0);
  EXPECT_TRUE(exited_with(wait_status(o.pid), 0));
  std::string out = read_all(err[0]);
  int st = wait_status(o.guardian);
  EXPECT_TRUE(exited_with(st, 3)) << status_text(st) << ": " << out;
  EXPECT_NE(out.find("owner " + std::to_string(o.pid) + " is gone and its journal is unreadable (journal: bad magic"),
            std::string::npos)
      << out;
  ::close(m);
}

}  // namespace
}  // namespace xenprobes::testing
