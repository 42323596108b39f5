// What the environment may choose. Nothing falls back to the simulated Xen by itself: every
// entry point opens the real Xen unless XENPROBES_BACKEND=sim (read with secure_getenv) asks
// for the simulation, which is then said on stderr; the guardian is told its backend by its
// owner and has no default.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "xenprobes/hypervisor.hpp"
#include "xenprobes/xenprobes.h"
#include "xenprobes/xenprobes.hpp"

extern char** environ;

namespace xenprobes {
namespace {

// Not the simulation: the real Xen on a Dom0, an error saying there is none elsewhere.
void expect_not_sim(const Result<std::unique_ptr<hv::Hypervisor>>& hv) {
  if (hv) {
    EXPECT_EQ((*hv)->name(), "xen");
  } else {
    const std::string& w = hv.error().what;
    EXPECT_TRUE(w.find("privcmd") != std::string::npos || w.find("without the Xen backend") != std::string::npos)
        << "the real Xen's refusal: " << w;
  }
}

// Runs `f` with stderr going into a pipe; returns what was written.
template <typename F>
std::string stderr_of(F f) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return "";
  int saved = ::dup(2);
  ::dup2(p[1], 2);
  ::close(p[1]);
  f();
  ::dup2(saved, 2);
  ::close(saved);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(p[0]);
  return out;
}

TEST(NoSilentSimulation, EveryEntryPointOpensTheRealXenByDefault) {
  ::unsetenv("XENPROBES_BACKEND");
  expect_not_sim(hv::open_hypervisor());
  auto s = Session::open();
  if (s) { EXPECT_EQ((*s)->hypervisor().name(), "xen"); }
  if (xenprobes_open(nullptr) == 0) {
    ADD_FAILURE() << "the C API opened a session with no Xen here (or this is a Dom0: then it must be Xen)";
  } else {
    EXPECT_NE(std::string(xenprobes_last_error()).find("privcmd"), std::string::npos) << xenprobes_last_error();
  }
  xenprobes_close();
}

TEST(NoSilentSimulation, AskingForTheSimulationIsSaidOnStderr) {
  ::setenv("XENPROBES_BACKEND", "sim", 1);
  Result<std::unique_ptr<hv::Hypervisor>> hv = std::unexpected(Error{});
  std::string err = stderr_of([&] { hv = hv::open_hypervisor(); });
  ::unsetenv("XENPROBES_BACKEND");
  ASSERT_TRUE(hv) << hv.error().what;
  EXPECT_EQ((*hv)->name(), "sim");
  EXPECT_NE(err.find("XENPROBES_BACKEND=sim: the SIMULATED Xen, not a real one"), std::string::npos) << err;
}

// The guardian without --backend: no default, a usage error (exit 2).
TEST(NoSilentSimulation, TheGuardianHasNoDefaultBackend) {
  std::string bin = XP_GUARDIAN_PROD_BIN;
  std::vector<std::string> args{bin, "--journal-fd", "3", "--pipe-fd", "4", "--owner", std::to_string(::getpid())};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  ASSERT_EQ(::posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << st;
}

}  // namespace
}  // namespace xenprobes
