// Starting the real xenprobes-guardian (process_fixture.hpp): what a session does when the
// program cannot be spawned, does not start or is named by a relative path (Required, Auto,
// Off); spawning it whatever this process's descriptors; and what the program itself refuses
// to start with (its journal, its pipe, its owner, inherited descriptors, a journal it cannot
// read once its owner is gone).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <random>

#include "guardian/process_fixture.hpp"
#include "guardian/spawn.hpp"

namespace xenprobes::testing {
namespace {

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
