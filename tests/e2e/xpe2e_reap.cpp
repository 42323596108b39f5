// xpe2e-reap: runs a command as a child subreaper and reports how every process of its tree
// ended, the ones that outlive it included (tools/e2e/scenarios/lib.sh, docs/e2e.md).
//
//   xpe2e-reap [--wait S] -- <command> [args...]
//
// A process whose parent dies is handed to its nearest ancestor that is a child subreaper
// (prctl PR_SET_CHILD_SUBREAPER), whatever its session: this program. So when the command
// (xpe2e-probe kill) SIGKILLs itself, the xenprobes-guardian its session spawned (setsid, its
// own session) becomes our child, and its exit status, which nobody else could read, is ours
// to report. For each process that ends:
//
//   XPE2E-REAPED pid=<pid> comm=<name> status=exit <n>|signal <n>
//
// Once the command has ended, waits up to S seconds (default 120) for the rest of the tree.
// Exit status: the command's, as a shell gives it (128 + the signal when it was killed).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace {

std::string comm_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
  std::string c;
  std::getline(f, c);
  return c.empty() ? "?" : c;
}

int shell_status(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

}  // namespace

int main(int argc, char** argv) {
  int wait_s = 120;
  int i = 1;
  for (; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      ++i;
      break;
    }
    if (std::strcmp(argv[i], "--wait") == 0 && i + 1 < argc) {
      wait_s = std::atoi(argv[++i]);
      continue;
    }
    std::fprintf(stderr, "usage: xpe2e-reap [--wait S] -- <command> [args...]\n");
    return 2;
  }
  if (i >= argc) {
    std::fprintf(stderr, "usage: xpe2e-reap [--wait S] -- <command> [args...]\n");
    return 2;
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
    std::perror("xpe2e-reap: PR_SET_CHILD_SUBREAPER");
    return 2;
  }
  std::fflush(nullptr);
  pid_t cmd = fork();
  if (cmd < 0) {
    std::perror("xpe2e-reap: fork");
    return 2;
  }
  if (cmd == 0) {
    execvp(argv[i], argv + i);
    std::perror("xpe2e-reap: exec");
    _exit(127);
  }
  int cmd_status = -1;
  std::chrono::steady_clock::time_point deadline{};
  for (;;) {
    // Peek first (the zombie still has its name), then reap.
    siginfo_t si{};
    int flags = WEXITED | WNOWAIT;
    if (cmd_status >= 0) flags |= WNOHANG;
    if (waitid(P_ALL, 0, &si, flags) != 0) {
      if (errno == EINTR) continue;
      break;  // ECHILD: the whole tree has ended
    }
    if (si.si_pid == 0) {  // WNOHANG, nothing ended yet
      if (std::chrono::steady_clock::now() >= deadline) {
        std::printf("XPE2E-REAPED timeout: processes of the tree still running after %d s\n", wait_s);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    const std::string comm = comm_of(si.si_pid);
    int st = 0;
    if (waitpid(si.si_pid, &st, 0) != si.si_pid) continue;
    if (WIFEXITED(st))
      std::printf("XPE2E-REAPED pid=%d comm=%s status=exit %d\n", static_cast<int>(si.si_pid), comm.c_str(),
                  WEXITSTATUS(st));
    else
      std::printf("XPE2E-REAPED pid=%d comm=%s status=signal %d\n", static_cast<int>(si.si_pid), comm.c_str(),
                  WTERMSIG(st));
    std::fflush(stdout);
    if (si.si_pid == cmd) {
      cmd_status = shell_status(st);
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
    }
  }
  return cmd_status >= 0 ? cmd_status : 2;
}
