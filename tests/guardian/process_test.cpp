// The real xenprobes-guardian against a Session: spawned with the first debugger/vmevent
// domain, silent on an orderly end, acting on its owner's death (here through
// XENPROBES_GUARDIAN_REPORT: the simulated Xen lives in this process, so the guardian can
// only report what it would recover; recovery itself is tested in-process, and on a real Xen
// it needs a real Xen).
#include "guardian/guardian_fixture.hpp"

#include <signal.h>
#include <stdlib.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace xenprobes::testing {
namespace {

std::string temp_report() {
  std::string p = ::testing::TempDir() + "xp-guardian-report-" + std::to_string(::getpid()) + "-" +
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

SessionOptions required() {
  SessionOptions o;
  o.guardian = GuardianMode::Required;
  o.guardian_path = XP_GUARDIAN_BIN;
  return o;
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

TEST(GuardianProcess, SpawnedWithTheFirstDebuggerDomainAndSilentOnACleanEnd) {
  std::string report = temp_report();
  ::setenv("XENPROBES_GUARDIAN_REPORT", report.c_str(), 1);
  Guest g(ChannelKind::Debugger, 1, 5, required(), /*load=*/false);
  EXPECT_EQ(SessionTesting::guardian_pid(*g.session), -1) << "none before a domain needs one";
  ASSERT_TRUE(g.session->load_symbols(g.dom, demo_map()));  // attaches the domain
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  ASSERT_TRUE(a) << a.error().what;
  pid_t pid = SessionTesting::guardian_pid(*g.session);
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(alive(pid));
  EXPECT_EQ(SessionTesting::wait_guardian(*g.session, 50), -1) << "it waits while its owner lives";
  a->release();
  g.session.reset();  // orderly: clean flag, then EOF; the session reaps it
  EXPECT_FALSE(alive(pid));
  EXPECT_EQ(slurp(report), "") << "a clean end: nothing reported";
  ::unsetenv("XENPROBES_GUARDIAN_REPORT");
}

TEST(GuardianProcess, ActsWhenItsOwnerDiesWithoutCleaningUp) {
  std::string report = temp_report();
  ::setenv("XENPROBES_GUARDIAN_REPORT", report.c_str(), 1);
  Guest g(ChannelKind::VmEvent, 2, 5, required());
  auto a = g.session->probe(g.dom, "sys_read", [](HitContext&) { return 0; });
  auto b = g.session->probe(g.dom, "sys_getppid+5", [](HitContext&) { return 0; }, [](HitContext&) {});
  ASSERT_TRUE(a && b);
  a->release();
  b->release();
  pid_t pid = SessionTesting::guardian_pid(*g.session);
  ASSERT_GT(pid, 0);
  int jfd = g.abandon();  // the pipe closes without the clean flag; the guardian is reaped
  ::close(jfd);
  EXPECT_FALSE(alive(pid));
  std::string r = slurp(report);
  EXPECT_NE(r.find("owner-died"), std::string::npos) << r;
  EXPECT_NE(r.find("domains=1 patches=3"), std::string::npos) << r << " (2 points and a slot trap)";
  ::unsetenv("XENPROBES_GUARDIAN_REPORT");
  // This test's guest is left stuck on purpose: the sim lives here, the guardian could not reach it.
  ASSERT_TRUE(g.host->destroy_domain(g.dom));
}

TEST(GuardianProcess, RequiredRefusesTheDomainWhenItCannotBeSpawned) {
  SessionOptions o = required();
  o.guardian_path = "/nonexistent/xenprobes-guardian";
  Guest g(ChannelKind::Debugger, 1, 5, o, /*load=*/false);
  auto a = g.session->load_symbols(g.dom, demo_map());  // attaching the domain is refused
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().what.find("guardian"), std::string::npos) << a.error().what;
  EXPECT_EQ(g.text(), g.text_before) << "nothing patched";
  EXPECT_FALSE(g.session->hypervisor().domain_info(g.dom)->debugged) << "the channel never touched the domain";
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

TEST(GuardianProcess, RefusesAnUnreadableJournal) {
  // Run the binary by hand on a journal of garbage: it says so and exits 3.
  int j[2], p[2];
  ASSERT_EQ(::pipe(j), 0);
  ASSERT_EQ(::pipe(p), 0);
  ASSERT_EQ(::write(j[1], "garbage", 7), 7);
  ::close(j[1]);
  std::string cmd = std::string(XP_GUARDIAN_BIN) + " --journal-fd " + std::to_string(j[0]) + " --pipe-fd " +
                    std::to_string(p[0]) + " --owner 1 --backend sim 2>/dev/null";
  ::close(p[1]);  // EOF at once
  int rc = std::system(cmd.c_str());
  ::close(j[0]);
  ::close(p[0]);
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 3);
}

}  // namespace
}  // namespace xenprobes::testing
