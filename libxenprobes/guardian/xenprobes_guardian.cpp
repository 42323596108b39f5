// xenprobes-guardian: the process a Session spawns to undo what it leaves in its guests if it
// dies without undoing it (docs/guardian.md).
//
//   xenprobes-guardian --journal-fd 3 --pipe-fd 4 --owner <pid> --backend xen|sim
//
// It blocks reading the pipe, whose write end only the owner holds. End of file means the
// owner closed it or died. The journal's clean flag says which: set, it exits 0 without a
// word; unset, it opens the hypervisor, recovers every journaled domain that still exists
// (probe/recovery.hpp), logs what it did to stderr and syslog, and exits. Until then it holds
// nothing of any domain: no mapping, no pause, no hypervisor handle.
//
// XENPROBES_GUARDIAN_REPORT=<file> (tests): instead of recovering, write what the journal
// says to <file> and exit.
#include <syslog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/log.hpp"
#include "hv/hypervisor.hpp"
#include "probe/journal.hpp"
#include "probe/recovery.hpp"

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

void say(log::Level l, const std::string& line) {
  std::fprintf(stderr, "xenprobes-guardian[%d]: %s\n", static_cast<int>(getpid()), line.c_str());
  syslog(syslog_level(l), "%s", line.c_str());
}

int parse_fd(const char* s) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  return (end && *end == 0 && v >= 0 && v < 65536) ? static_cast<int>(v) : -1;
}

void usage() {
  std::fprintf(stderr,
               "usage: xenprobes-guardian --journal-fd N --pipe-fd N --owner PID --backend xen|sim\n"
               "Started by libxenprobes; not meant to be run by hand (docs/guardian.md).\n");
}

}  // namespace

int main(int argc, char** argv) {
  int journal_fd = -1, pipe_fd = -1;
  std::string owner = "?", backend = "xen";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    if (a == "--journal-fd") journal_fd = parse_fd(argv[++i]);
    else if (a == "--pipe-fd") pipe_fd = parse_fd(argv[++i]);
    else if (a == "--owner") owner = argv[++i];
    else if (a == "--backend") backend = argv[++i];
    else {
      usage();
      return 2;
    }
  }
  if (journal_fd < 0 || pipe_fd < 0) {
    usage();
    return 2;
  }
  openlog("xenprobes-guardian", LOG_PID, LOG_DAEMON);
  // Anything on stdin/stdout of the owner is none of ours; stderr stays for the account.
  char buf[64];
  for (;;) {
    ssize_t n = ::read(pipe_fd, buf, sizeof buf);
    if (n > 0) continue;  // the owner never writes; ignore anything that comes
    if (n < 0 && errno == EINTR) continue;
    break;  // 0: end of file; any other error means the same to us
  }
  auto snap = probe::read_journal_fd(journal_fd);
  if (!snap) {
    say(log::Level::Error, "owner " + owner + " is gone and its journal is unreadable (" + snap.error().what +
                               "): nothing recovered");
    return 3;
  }
  if (snap->clean) return 0;

  if (const char* report = std::getenv("XENPROBES_GUARDIAN_REPORT"); report && *report) {
    FILE* f = std::fopen(report, "w");
    if (!f) return 4;
    std::fprintf(f, "owner-died pid=%u domains=%zu patches=%zu returns=%zu torn=%u invalid=%u\n", snap->owner_pid,
                 snap->domains.size(), snap->patches.size(), snap->returns.size(), snap->torn, snap->invalid);
    std::fclose(f);
    return 0;
  }

  say(log::Level::Warn, "owner " + owner + " ended without cleaning up: recovering " +
                            std::to_string(snap->domains.size()) + " domains (" +
                            std::to_string(snap->patches.size()) + " patches, " +
                            std::to_string(snap->returns.size()) + " return-probe calls in flight)");
  if (snap->domains.empty()) return 0;
  if (backend == "sim") {
    say(log::Level::Error, "the owner ran on the simulated Xen, which lived in its own process: nothing to recover");
    return 0;
  }
  auto hv = hv::open_hypervisor(backend);
  if (!hv) {
    say(log::Level::Error, "cannot open the hypervisor (" + hv.error().what + "): nothing recovered");
    return 3;
  }
  log::set_level(log::Level::Off);  // every line goes through say() instead
  auto rep = probe::recover(**hv, *snap, [](log::Level l, const std::string& line) { say(l, line); });
  say(rep.failures ? log::Level::Error : log::Level::Warn,
      "done: " + std::to_string(rep.domains) + " domains recovered, " + std::to_string(rep.gone) + " gone, " +
          std::to_string(rep.restored) + " patches restored, " + std::to_string(rep.left_alone) +
          " left alone (changed since), " + std::to_string(rep.vcpus_moved) + " vCPUs moved, " +
          std::to_string(rep.returns_restored) + " return addresses restored, " + std::to_string(rep.unpaused) +
          " pauses released, " + std::to_string(rep.failures) + " steps failed");
  return rep.failures ? 1 : 0;
}
