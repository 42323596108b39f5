// The real xenprobes-guardian against its owner. XP_GUARDIAN_BIN is the program's test build,
// whose only difference is the report hook (XENPROBES_GUARDIAN_REPORT=<file>: the journal's
// contents written where recovery would start; the simulated Xen lives in the owner's
// process, so that is all a guardian could do for it; recovery itself is tested in-process,
// recovery_test.cpp). XP_GUARDIAN_PROD_BIN is the program as installed.
//
// An owner that dies is a child process of this test (start_owner); this process adopts the
// orphaned guardian (PR_SET_CHILD_SUBREAPER) to wait for it. Nothing here waits for time to
// pass: every wait is for an exit, an end of file, or a line the guardian writes.
//
// Starting it (the session's options, odd descriptors, inputs it refuses):
// process_start_test.cpp; the helpers: process_fixture.hpp.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "guardian/process_fixture.hpp"

namespace xenprobes::testing {
namespace {

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

}  // namespace
}  // namespace xenprobes::testing
