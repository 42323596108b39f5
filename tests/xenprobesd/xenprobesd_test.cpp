// xenprobesd's tests: the daemon run as a subprocess on the simulated Xen with several demo
// guests, its NDJSON event log read from its stdout record by record (each wait is a blocking
// read of the next record, bounded by ctest's timeout, never a sleep), its metrics fetched
// from its endpoint and checked with the real `promtool check metrics`, and bad
// configurations checked against golden files.
//
// The demo guest's workload calls sys_getppid twice per iteration and vCPU
// (tests/xenprobe's oracle), so K iterations on one vCPU are 2K hits exactly.
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "module_btf_guest.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr std::uint64_t K = 30;  // iterations of each simulated guest

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A directory of its own for each test, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/xenprobesd-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return path / name;
  }
};

// Runs a command through sh, returns its status and combined output.
std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// The daemon as a subprocess: stdout (the event log) through a pipe, stderr into a file.
class Daemon {
 public:
  // `notify_socket`: where the daemon's sd_notify messages go (NOTIFY_SOCKET), "" for none.
  Daemon(const fs::path& config, std::vector<std::string> args, const fs::path& dir,
         const std::string& notify_socket = "")
      : err_(dir / "stderr.txt") {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    std::vector<std::string> argv{XENPROBESD_BIN, "-c", config.string()};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      FILE* e = std::fopen(err_.c_str(), "w");
      if (e) ::dup2(fileno(e), 2);
      ::close(fds[0]);
      ::close(fds[1]);
      if (!notify_socket.empty()) ::setenv("NOTIFY_SOCKET", notify_socket.c_str(), 1);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      ::execv(cargv[0], cargv.data());
      _exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
  }
  ~Daemon() {
    if (pid_ > 0 && !waited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }

  // The next record of this kind (and, if given, for this domain) still to come; the records
  // before it are kept in all(). A null json if the log ended first, or nothing came for 60 s.
  json next(const std::string& kind, const std::string& domain = "") { return find(kind, domain, false); }
  // The same, but a record of that kind already read on the way to another, and not returned
  // yet, counts too: for events that come in either order (one guest's detach and the other
  // guest's end of its workload).
  json seen_or_next(const std::string& kind, const std::string& domain = "") { return find(kind, domain, true); }

  void signal(int sig) { ::kill(pid_, sig); }

  // SIGTERM, the rest of the log, the exit status.
  int stop() {
    signal(SIGTERM);
    while (auto line = read_line(std::chrono::seconds(60))) {
      json rec = json::parse(*line, nullptr, false);
      EXPECT_FALSE(rec.is_discarded()) << "not JSON: " << *line;
      if (!rec.is_discarded()) {
        records_.push_back(rec);
        taken_.push_back(false);
      }
    }
    EXPECT_FALSE(timed_out_) << "the daemon did not end its log within 60 s of SIGTERM";
    int st = 0;
    ::waitpid(pid_, &st, 0);
    waited_ = true;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

  const std::vector<json>& all() const { return records_; }
  std::string err() const { return slurp(err_); }

 private:
  json find(const std::string& kind, const std::string& domain, bool seen_too) {
    auto matches = [&](const json& rec) {
      return rec["kind"] == kind && (domain.empty() || rec.value("domain", "") == domain);
    };
    if (seen_too)
      for (std::size_t k = 0; k < records_.size(); ++k)
        if (!taken_[k] && matches(records_[k])) {
          taken_[k] = true;
          return records_[k];
        }
    while (auto line = read_line(std::chrono::seconds(60))) {
      json rec = json::parse(*line, nullptr, false);
      EXPECT_FALSE(rec.is_discarded()) << "not JSON: " << *line;
      if (rec.is_discarded()) continue;
      records_.push_back(rec);
      taken_.push_back(matches(rec));
      if (taken_.back()) return rec;
    }
    ADD_FAILURE() << (timed_out_ ? "no " + kind + " record within 60 s"
                                 : "the event log ended before a " + kind + " record")
                  << "; stderr:\n"
                  << err();
    return json();
  }

  // One line of the event log; nullopt at its end, or when nothing came for `timeout`.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      if (eof_) return std::nullopt;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count();
      pollfd p{out_, POLLIN, 0};
      const int r = left > 0 ? ::poll(&p, 1, static_cast<int>(left)) : 0;
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        timed_out_ = true;
        return std::nullopt;
      }
      char chunk[4096];
      const ssize_t n = ::read(out_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) eof_ = true;
      else buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_;
  bool eof_ = false, timed_out_ = false;
  fs::path err_;
  bool waited_ = false;
  std::vector<json> records_;
  std::vector<bool> taken_;  // records_[k] was returned by next()
};

// The service manager's side of sd_notify: a datagram socket whose messages are read in order.
class NotifySocket {
 public:
  explicit NotifySocket(const fs::path& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("bind");
  }
  ~NotifySocket() { ::close(fd_); }
  const fs::path& path() const { return path_; }
  // Blocks until a message containing `what` arrives; returns every message up to it.
  std::string until(const std::string& what) {
    std::string seen;
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n < 0) return seen;
      seen.append(buf, static_cast<std::size_t>(n)).append("\n");
      if (std::string_view(buf, static_cast<std::size_t>(n)).find(what) != std::string_view::npos) return seen;
    }
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

std::string metrics(int port) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(120, 0);  // a loaded machine is slow, not wrong: ctest's timeout bounds the wait
  auto res = cli.Get("/metrics");
  EXPECT_TRUE(res) << "no answer from the metrics endpoint";
  if (!res) return {};
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  return res->body;
}

// promtool's own checks (the exposition format and Prometheus' naming conventions): it must
// find nothing to say.
void expect_promtool_clean(const std::string& text, const fs::path& dir) {
  const fs::path f = dir / "metrics.prom";
  std::ofstream(f) << text;
  auto [status, out] = shell("promtool check metrics < " + f.string());
  EXPECT_EQ(status, 0) << out << "\n" << text;
  EXPECT_EQ(out, "") << text;
}

// The value of one sample line, or -1 if it is absent.
double sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with(series + " ")) return std::stod(line.substr(series.size() + 1));
  return -1;
}

std::string hits(const std::string& dom, const std::string& prog, const std::string& probe) {
  return "xenprobesd_probe_hits_total{domain=\"" + dom + "\",program=\"" + prog + "\",probe=\"" + probe + "\"}";
}

std::string daemon_section(const std::string& extra = "") {
  return "[daemon]\nevent_log = \"-\"\nmetrics_listen = \"127.0.0.1:0\"\n" + extra + "\n";
}

std::vector<std::string> sim(unsigned guests, std::vector<std::string> more = {}) {
  std::vector<std::string> a{"--sim", "--sim-guests",     std::to_string(guests), "--sim-vcpus",
                             "1",     "--sim-iterations", std::to_string(K)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

}  // namespace

// ---- configuration ----

// Every bad configuration in tests/xenprobesd/bad/ is refused by --check-config with exit
// status 1 and exactly the message of its .err file (run from that directory, so the file
// names in the messages are relative).
TEST(xenprobesd, BadConfigsAreRejectedWithFileLineAndReason) {
  const fs::path dir = fs::path(XENPROBESD_TEST_DIR) / "bad";
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".toml") continue;
    ++n;
    const std::string name = e.path().filename().string();
    auto [status, out] =
        shell("cd '" + dir.string() + "' && '" + std::string(XENPROBESD_BIN) + "' --check-config -c " + name);
    EXPECT_EQ(status, 1) << name << ":\n" << out;
    fs::path golden = e.path();
    golden.replace_extension(".err");
    EXPECT_EQ(out, slurp(golden)) << name;
  }
  EXPECT_GE(n, 14);  // every file in bad/ was read
}

TEST(xenprobesd, TheDocumentedExampleConfigIsValid) {
  auto [status, out] = shell("'" + std::string(XENPROBESD_BIN) + "' --check-config -c '" + XENPROBESD_SOURCE_DIR +
                             "/xenprobesd/xenprobesd.toml'");
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("valid, 2 program(s)"), std::string::npos) << out;
}

// ---- lifecycle and outputs ----

// Three guests at start; programs choosing them by glob, by domid and name, and by a xenstore
// label. Each runs in exactly the guests it selects, with exact counts, maps exported, and
// metrics promtool finds nothing to say about.
TEST(xenprobesd, AttachesAtStartToTheSelectedGuestsAndCountsExactly) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "all"
source = 'kprobe:sys_getppid { @calls = count(); @by[func] = count(); }'
domains = [{ glob = "sim-*" }]

[[program]]
name = "some"
source = 'kretprobe:sys_getppid { @ret[retval] = count(); }'
domains = [{ domid = 2 }, { name = "sim-3" }]

[[program]]
name = "web"
source = 'kprobe:sys_getppid { @w = count(); }'
domains = [{ xenstore = "vm-data/role", value = "web*" }]
outputs = "events"
)");
  Daemon d(cfg, sim(3, {"--sim-label", "sim-1:vm-data/role=webserver", "--sim-label", "sim-2:vm-data/role=db"}),
           t.path);
  json listening = d.next("metrics_listening");
  ASSERT_FALSE(listening.is_null());
  const int port = listening["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  std::vector<std::pair<std::string, std::string>> attached;
  for (const json& r : d.all())
    if (r["kind"] == "attached") attached.emplace_back(r["program"], r["domain"]);
  std::sort(attached.begin(), attached.end());
  const std::vector<std::pair<std::string, std::string>> want{{"all", "sim-1"},  {"all", "sim-2"},  {"all", "sim-3"},
                                                              {"some", "sim-2"}, {"some", "sim-3"}, {"web", "sim-1"}};
  EXPECT_EQ(attached, want);

  const std::string m = metrics(port);
  for (const char* dom : {"sim-1", "sim-2", "sim-3"}) {
    EXPECT_EQ(sample(m, hits(dom, "all", "kprobe:sys_getppid")), 2 * K) << m;
    EXPECT_EQ(
        sample(m, "xenprobesd_map_value{domain=\"" + std::string(dom) + "\",program=\"all\",map=\"@calls\",key=\"\"}"),
        2 * K);
    EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"" + std::string(dom) +
                            "\",program=\"all\",map=\"@by\",key=\"sys_getppid\"}"),
              2 * K);
  }
  EXPECT_EQ(sample(m, hits("sim-1", "some", "kretprobe:sys_getppid")), -1);
  for (const char* dom : {"sim-2", "sim-3"}) {
    EXPECT_EQ(sample(m, hits(dom, "some", "kretprobe:sys_getppid")), 2 * K);
    EXPECT_EQ(
        sample(m, "xenprobesd_map_value{domain=\"" + std::string(dom) + "\",program=\"some\",map=\"@ret\",key=\"1\"}"),
        2 * K);
  }
  EXPECT_EQ(sample(m, hits("sim-1", "web", "kprobe:sys_getppid")), 2 * K);
  EXPECT_EQ(sample(m, hits("sim-2", "web", "kprobe:sys_getppid")), -1);
  // outputs = "events": counted, but its map is not exported.
  EXPECT_EQ(m.find("program=\"web\",map="), std::string::npos);
  EXPECT_EQ(sample(m, "xenprobesd_probe_missed_total{domain=\"sim-1\",program=\"all\",probe=\"kprobe:sys_getppid\"}"),
            0);
  EXPECT_EQ(sample(m, "xenprobesd_attachment_info{domain=\"sim-2\",program=\"some\",channel=\"guest\"}"), 1);
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
  // At the end every attachment detaches, and the daemon says it stopped.
  int detached = 0;
  for (const json& r : d.all()) detached += r["kind"] == "detached";
  EXPECT_EQ(detached, 6);
  EXPECT_EQ(d.all().back()["kind"], "stopped");
}

// A guest created while the daemon runs is attached through @introduceDomain; it is created
// paused (xl create -p) and started after the daemon has looked at it, so its count is exact.
TEST(xenprobesd, AttachesToAGuestThatAppears) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "p"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)");
  Daemon d(cfg, sim(1, {"--sim-create", "late@10"}), t.path);
  const int port = d.next("metrics_listening")["port"];
  json a = d.next("attached", "late");
  ASSERT_FALSE(a.is_null());
  EXPECT_EQ(a["domid"], 2);
  EXPECT_EQ(a["probes"], 1);
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, hits("sim-1", "p", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(sample(m, hits("late", "p", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// A guest that goes inside a handler (its vCPU waiting for Dom0's answer), by `cue`
// ("--sim-destroy" or "--sim-crash" at its 20th hit): its attachment detaches after exactly
// those hits saying `why`, its series leave the metrics, the other guest is served to the end
// with an exact count.
static void expect_gone_mid_probe(const std::string& cue, const std::string& why) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "p"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "sim-*" }]
)");
  Daemon d(cfg, sim(2, {cue, "sim-2@20"}), t.path);
  const int port = d.next("metrics_listening")["port"];
  json gone = d.next("detached", "sim-2");
  ASSERT_FALSE(gone.is_null());
  EXPECT_EQ(gone["hits"], 20);
  EXPECT_EQ(gone["body"], "the domain is gone (" + why + ")");
  // sim-1 may end its workload before the daemon has seen sim-2 go, or after.
  ASSERT_FALSE(d.seen_or_next("sim_idle").is_null());
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, hits("sim-1", "p", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(m.find("sim-2"), std::string::npos) << m;
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
  EXPECT_NE(d.err().find("domain sim-2 (2) is gone (" + why + ")"), std::string::npos) << d.err();
}

TEST(xenprobesd, AGuestDestroyedMidProbeDetachesAndTheOthersGoOn) {
  expect_gone_mid_probe("--sim-destroy", "it was destroyed");
}

// The guest's kernel panics instead: the domain stays, crashed (xl's on_crash = "preserve").
TEST(xenprobesd, AGuestThatCrashesMidProbeDetachesAndTheOthersGoOn) {
  expect_gone_mid_probe("--sim-crash", "it crashed");
}

// SIGHUP: an unchanged program keeps its probes and counters, a changed one starts again, a
// new one attaches, a removed one detaches. Then a bad configuration is rejected with its
// file, line and reason, and the running one stays.
TEST(xenprobesd, ReloadKeepsUnchangedProgramsAndRejectsABadConfig) {
  TempDir t;
  const std::string keep = R"(
[[program]]
name = "keep"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)";
  auto cfg = t.write("c.toml", daemon_section() + keep + R"(
[[program]]
name = "change"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]

[[program]]
name = "drop"
source = 'kretprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)");
  Daemon d(cfg, sim(2), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  std::string m = metrics(port);
  for (const char* dom : {"sim-1", "sim-2"}) {
    EXPECT_EQ(sample(m, hits(dom, "keep", "kprobe:sys_getppid")), 2 * K) << m;
    EXPECT_EQ(sample(m, hits(dom, "change", "kprobe:sys_getppid")), 2 * K) << m;
  }

  t.write("c.toml", daemon_section() + keep + R"(
[[program]]
name = "change"
source = 'kprobe:sys_getppid { @c = count(); @d = count(); }'
domains = [{ glob = "*" }]

[[program]]
name = "new"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ name = "sim-2" }]
)");
  d.signal(SIGHUP);
  json loaded = d.next("config_loaded");
  ASSERT_FALSE(loaded.is_null());
  EXPECT_EQ(loaded["kept"], json({"keep"}));
  EXPECT_EQ(loaded["changed"], json({"change"}));
  EXPECT_EQ(loaded["added"], json({"new"}));
  EXPECT_EQ(loaded["removed"], json({"drop"}));
  std::vector<std::string> reasons;
  for (const json& r : d.all())
    if (r["kind"] == "detached")
      reasons.push_back(r["program"].get<std::string>() + ": " + r["body"].get<std::string>());
  std::sort(reasons.begin(), reasons.end());
  EXPECT_EQ(reasons, (std::vector<std::string>{
                         "change: the program changed in a reload", "change: the program changed in a reload",
                         "drop: the program was removed in a reload", "drop: the program was removed in a reload"}));
  m = metrics(port);
  for (const char* dom : {"sim-1", "sim-2"}) {
    EXPECT_EQ(sample(m, hits(dom, "keep", "kprobe:sys_getppid")), 2 * K) << m;  // kept
    EXPECT_EQ(sample(m, hits(dom, "change", "kprobe:sys_getppid")), 0) << m;    // the guests have halted since
    EXPECT_EQ(sample(m, hits(dom, "drop", "kretprobe:sys_getppid")), -1) << m;
  }
  EXPECT_EQ(sample(m, hits("sim-2", "new", "kprobe:sys_getppid")), 0) << m;
  EXPECT_EQ(sample(m, hits("sim-1", "new", "kprobe:sys_getppid")), -1) << m;
  EXPECT_EQ(sample(m, "xenprobesd_config_reloads_total{result=\"accepted\"}"), 1);

  t.write("c.toml",
          daemon_section() + keep + "\n[[program]]\nname = \"x\"\nsource = 'kprobe:sys_getppid { @c = ; }'\n");
  d.signal(SIGHUP);
  json rejected = d.next("config_rejected");
  ASSERT_FALSE(rejected.is_null());
  EXPECT_EQ(rejected["severity"], "ERROR");
  const std::string body = rejected["body"];
  EXPECT_TRUE(body.starts_with(cfg.string() + ":13:37: error: ")) << body;
  EXPECT_NE(body.find("the configuration in use stays in use"), std::string::npos) << body;
  m = metrics(port);
  EXPECT_EQ(sample(m, hits("sim-1", "keep", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(sample(m, hits("sim-2", "new", "kprobe:sys_getppid")), 0) << m;
  EXPECT_EQ(sample(m, "xenprobesd_config_reloads_total{result=\"rejected\"}"), 1);
  EXPECT_EQ(sample(m, "xenprobesd_config_last_reload_successful"), 0);
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// printf records are NDJSON with the documented fields, rate limited per program and domain:
// with a burst of 5 and a refill far slower than the run, exactly 5 records per guest, the
// rest counted as dropped.
TEST(xenprobesd, EventsAreNdjsonRecordsAndRateLimited) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "ev"
source = 'kprobe:sys_getppid { @n++; printf("getppid %d from %s\n", @n, domain); }'
domains = [{ glob = "*" }]
outputs = "events"
event_burst = 5
events_per_second = 0.000001
)");
  Daemon d(cfg, sim(2), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  std::map<std::string, std::vector<std::string>> bodies;
  for (const json& r : d.all()) {
    if (r["kind"] != "printf") continue;
    EXPECT_EQ(r["severity"], "INFO");
    EXPECT_EQ(r["program"], "ev");
    EXPECT_EQ(r["probe"], "kprobe:sys_getppid");
    EXPECT_TRUE(r["time"].get<std::string>().ends_with("Z")) << r;
    EXPECT_FALSE(r["time_unix_nano"].get<std::string>().empty());
    bodies[r["domain"]].push_back(r["body"]);
    EXPECT_EQ(r["domid"], r["domain"] == "sim-1" ? 1 : 2);
  }
  for (const char* dom : {"sim-1", "sim-2"}) {
    std::vector<std::string> want;
    for (int i = 1; i <= 5; ++i) want.push_back("getppid " + std::to_string(i) + " from " + dom + "\n");
    EXPECT_EQ(bodies[dom], want);
  }
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, "xenprobesd_events_total{domain=\"sim-1\",program=\"ev\"}"), 5) << m;
  EXPECT_EQ(sample(m, "xenprobesd_events_dropped_total{domain=\"sim-1\",program=\"ev\"}"), 2 * K - 5) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// logrotate: the file is moved away, SIGUSR1 makes the daemon open a new one; the last records
// go there. The node-exporter textfile is written at exit, whole.
TEST(xenprobesd, EventLogFileReopensOnSigusr1AndTheTextfileIsWritten) {
  TempDir t;
  const fs::path log = t.path / "events.ndjson", prom = t.path / "xenprobesd.prom";
  auto cfg = t.write("c.toml", "[daemon]\nevent_log = \"" + log.string() + "\"\nmetrics_listen = \"\"\n" +
                                   "metrics_textfile = \"" + prom.string() + "\"\n" + R"(
[[program]]
name = "p"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)");
  // With the log in a file, the daemon's stdout stays empty; its sd_notify messages say where
  // it is: READY=1 after the first attach pass, then a STATUS when the guests have finished.
  NotifySocket notify(t.path / "notify");
  Daemon d(cfg, sim(1), t.path, notify.path());
  const std::string said = notify.until("finished its workload");
  EXPECT_NE(said.find("READY=1"), std::string::npos) << said;
  fs::rename(log, t.path / "events.ndjson.1");
  d.signal(SIGUSR1);
  EXPECT_EQ(d.stop(), 0) << d.err();
  EXPECT_TRUE(d.all().empty());
  const std::string old = slurp(t.path / "events.ndjson.1"), now = slurp(log);
  EXPECT_NE(old.find("\"kind\":\"attached\""), std::string::npos) << old;
  EXPECT_EQ(old.find("\"kind\":\"stopped\""), std::string::npos) << old;
  EXPECT_NE(now.find("\"kind\":\"stopped\""), std::string::npos) << now;
  const std::string text = slurp(prom);
  EXPECT_EQ(sample(text, hits("sim-1", "p", "kprobe:sys_getppid")), 2 * K) << text;
  expect_promtool_clean(text, t.path);
  EXPECT_FALSE(fs::exists(prom.string() + ".tmp"));
}

// `xenprobesd status` and `xenprobesd reload` through the control socket: the status names
// every attachment with its counts; a bad configuration is refused (exit 1, the file and line
// in the answer) and a good one accepted, saying what it kept and added.
TEST(xenprobesd, StatusAndReloadThroughTheControlSocket) {
  TempDir t;
  const fs::path sock = t.path / "control.sock";
  const std::string head = daemon_section("control_socket = \"" + sock.string() + "\"");
  const std::string p = R"(
[[program]]
name = "p"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)";
  auto cfg = t.write("c.toml", head + p);
  Daemon d(cfg, sim(2), t.path);
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string bin = XENPROBESD_BIN;
  auto [st, out] = shell("'" + bin + "' status -c '" + cfg.string() + "'");
  EXPECT_EQ(st, 0) << out;
  EXPECT_EQ(out, "config " + cfg.string() +
                     "\nprogram p (both):\n"
                     "  sim-1 (1, guest): 1 probes, 60 hits, 0 missed, 0 events, 0 dropped\n"
                     "  sim-2 (2, guest): 1 probes, 60 hits, 0 missed, 0 events, 0 dropped\n");

  t.write("c.toml", head + p + "\n[[program]]\nname = \"q\"\n");
  std::tie(st, out) = shell("'" + bin + "' reload --socket '" + sock.string() + "'");
  EXPECT_EQ(st, 1) << out;
  EXPECT_TRUE(out.starts_with("rejected: the configuration in use stays in use\n" + cfg.string() + ":11:1: error: "))
      << out;
  EXPECT_FALSE(d.next("config_rejected").is_null());

  t.write("c.toml", head + p + "\n[[program]]\nname = \"q\"\nsource = 'kprobe:sys_getppid { @c = count(); }'\n" +
                        "domains = [{ domid = 2 }]\n");
  std::tie(st, out) = shell("'" + bin + "' reload -c '" + cfg.string() + "'");
  EXPECT_EQ(st, 0) << out;
  EXPECT_EQ(out, "accepted: kept p; changed none; added q; removed none\n");
  json a = d.next("attached", "sim-2");
  EXPECT_EQ(a["program"], "q");
  std::tie(st, out) = shell("'" + bin + "' status --socket '" + sock.string() + "'");
  EXPECT_NE(out.find("program q (both):\n  sim-2 (2, guest): 1 probes, 0 hits"), std::string::npos) << out;
  EXPECT_EQ(d.stop(), 0) << d.err();
  EXPECT_FALSE(fs::exists(sock));  // removed at exit
  std::tie(st, out) = shell("'" + bin + "' status --socket '" + sock.string() + "'");
  EXPECT_EQ(st, 1);
  EXPECT_NE(out.find("cannot reach xenprobesd at " + sock.string()), std::string::npos) << out;
}

// A pair that cannot be attached (here: a function the guest does not have; on a real host, a
// guest still booting, without its module yet) is tried again with a growing wait, 2 s then 4 s;
// the same reason is logged once, not at every try.
TEST(xenprobesd, AFailedAttachmentIsRetriedAndLoggedOnce) {
  TempDir t;
  const fs::path sock = t.path / "control.sock";
  auto cfg = t.write("c.toml", daemon_section("control_socket = \"" + sock.string() + "\"") + R"(
[[program]]
name = "p"
source = 'kprobe:no_such_function { @c = count(); }'
domains = [{ glob = "*" }]
)");
  Daemon d(cfg, sim(1), t.path);
  json f = d.next("attach_failed", "sim-1");
  ASSERT_FALSE(f.is_null());
  EXPECT_NE(f["body"].get<std::string>().find("no_such_function"), std::string::npos) << f;
  const std::string bin = XENPROBESD_BIN;
  std::string out;
  for (int i = 0; i < 100; ++i) {  // the second try comes 2 s after the first
    out = shell("'" + bin + "' status --socket '" + sock.string() + "'").second;
    if (out.find("(2 tries, the next in ") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(out.find("  domain 1: not attached: kprobe:no_such_function: "), std::string::npos) << out;
  EXPECT_NE(out.find("(2 tries, the next in "), std::string::npos) << out;
  EXPECT_EQ(d.stop(), 0) << d.err();
  EXPECT_EQ(std::count_if(d.all().begin(), d.all().end(), [](const json& r) { return r["kind"] == "attach_failed"; }),
            1);
}

// A program that needs the guest kernel's types (here comm) is accepted and checked again for
// each guest with that guest's BTF, read from its memory. The demo guest's kernel has none:
// its attachment fails and says so; the program beside it, which needs no types, is served.
TEST(xenprobesd, AProgramNeedingTypesIsCheckedWithEachGuestsOwnBtf) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "by-comm"
source = 'kprobe:sys_getppid { @c[comm] = count(); }'
domains = [{ glob = "*" }]

[[program]]
name = "plain"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)");
  Daemon d(cfg, sim(1), t.path);
  json f = d.next("attach_failed", "sim-1");
  ASSERT_FALSE(f.is_null());
  EXPECT_EQ(f["program"], "by-comm");
  EXPECT_NE(f["body"].get<std::string>().find(
                "the program needs the guest kernel's types and its BTF cannot be read from its memory: "),
            std::string::npos)
      << f;
  EXPECT_NE(f["body"].get<std::string>().find("__start_BTF"), std::string::npos) << f;
  json a = d.seen_or_next("attached", "sim-1");
  ASSERT_FALSE(a.is_null());
  EXPECT_EQ(a["program"], "plain");
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// A program that reads through a loaded module's struct is checked with the guest's kernel
// types and its live modules' (tests/module_btf_guest.hpp: the demo guest with a LIVE module
// "xfs" whose split BTF has struct xfs_inode on the kernel's btf_modules list, as a real kernel
// keeps it, given with --sim-image and --sim-symbols) and
// reads the exact values there. The same program in a guest with the same kernel BTF and no
// module, or with the module but no BTF for it, fails to check, naming the type (and the
// module left out, and why); those guests are served by the program beside it.
TEST(xenprobesd, AProgramReadsThroughALoadedModulesTypes) {
  using xenprobes::testing::ModuleBtfGuest;
  const ModuleBtfGuest with = xenprobes::testing::module_btf_guest();
  const ModuleBtfGuest none = xenprobes::testing::module_btf_guest({.module = false});
  const ModuleBtfGuest no_btf = xenprobes::testing::module_btf_guest({.module = true, .module_btf = false});
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "xfs"
source = '''
kprobe:sys_getppid { printf("ino=%lx flags=%u\n", ((struct xfs_inode *)kaddr("xfs_file_read_iter"))->i_ino,
                            ((struct xfs_inode *)kaddr("xfs_file_read_iter"))->i_flags);
                     @flags = max(((struct xfs_inode *)kaddr("xfs:xfs_file_read_iter"))->i_flags); @calls = count(); }
'''
domains = [{ glob = "*" }]

[[program]]
name = "plain"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ glob = "*" }]
)");
  std::vector<std::string> args;
  for (const auto& [name, g] : {std::pair{"sim-1", &with}, std::pair{"sim-2", &none}, std::pair{"sim-3", &no_btf}})
    for (const std::string& a : {std::string("--sim-image"), std::string(name) + "=" + g->image,
                                 std::string("--sim-symbols"), std::string(name) + "=" + g->map})
      args.push_back(a);
  Daemon d(cfg, sim(3, args), t.path);
  const int port = d.next("metrics_listening")["port"];
  const std::string no_type = "error: no struct xfs_inode in the BTF of ";
  json f2 = d.next("attach_failed", "sim-2");
  ASSERT_FALSE(f2.is_null());
  EXPECT_EQ(f2["program"], "xfs");
  const std::string b2 = f2["body"];
  EXPECT_TRUE(b2.starts_with("the program does not check against this guest's kernel types:\n")) << b2;
  EXPECT_NE(b2.find(no_type + "sim-2's kernel (read from its memory)\n"), std::string::npos) << b2;
  EXPECT_EQ(b2.find("types left out"), std::string::npos) << b2;  // no module, none left out
  json f3 = d.seen_or_next("attach_failed", "sim-3");
  ASSERT_FALSE(f3.is_null());
  EXPECT_EQ(f3["program"], "xfs");
  const std::string b3 = f3["body"];
  EXPECT_NE(b3.find(no_type + "sim-3's kernel (read from its memory)\n"), std::string::npos) << b3;
  EXPECT_TRUE(b3.ends_with(
      "types left out:\n  module xfs: it has no BTF: the kernel's btf_modules list has no entry for it (the module "
      "was built without BTF, or the kernel refused its BTF when it loaded it), and its struct module's btf_data is "
      "NULL (Linux 5.11 and later clear it once the module's init ran)\n"))
      << b3;
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"xfs\",map=\"@flags\",key=\"\"}"),
            ModuleBtfGuest::kFlags)
      << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"xfs\",map=\"@calls\",key=\"\"}"), 2 * K) << m;
  EXPECT_EQ(sample(m, "xenprobesd_attachment_info{domain=\"sim-2\",program=\"xfs\",channel=\"guest\"}"), -1) << m;
  for (const char* dom : {"sim-1", "sim-2", "sim-3"})
    EXPECT_EQ(sample(m, hits(dom, "plain", "kprobe:sys_getppid")), 2 * K) << dom << "\n" << m;
  EXPECT_EQ(sample(m, "xenprobesd_guest_read_errors_total{domain=\"sim-1\",program=\"xfs\"}"), 0) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
  // Every hit in sim-1 printed the module's struct as it is in the guest's memory.
  char want[64];
  std::snprintf(want, sizeof want, "ino=%llx flags=%u\n", static_cast<unsigned long long>(ModuleBtfGuest::kIno),
                ModuleBtfGuest::kFlags);
  int printed = 0;
  for (const json& r : d.all())
    if (r["kind"] == "printf") {
      EXPECT_EQ(r["domain"], "sim-1") << r;
      EXPECT_EQ(r["body"], want) << r;
      ++printed;
    }
  EXPECT_EQ(printed, 2 * K);
  EXPECT_EQ(std::count_if(d.all().begin(), d.all().end(),
                          [](const json& r) { return r["kind"] == "attached" && r["program"] == "xfs"; }),
            1);
}

// A module loaded while the daemon runs: the guest's "xfs" is laid out in its memory but not on
// its module list nor its BTF on btf_modules, so the program naming struct xfs_inode fails to
// attach; inside the handler of the guest's 5th hit (of the program that needs no types) the
// daemon's --sim-write links both in, as an insmod would, and the attachment's next try (2 s later) reads the types again
// and attaches with no reload: every hit it serves prints the module's struct as it is in the
// guest.
TEST(xenprobesd, AModuleLoadedWhileItRunsBringsItsTypesAtTheNextTry) {
  using xenprobes::testing::ModuleBtfGuest;
  const ModuleBtfGuest g = xenprobes::testing::module_btf_guest({.linked = false});
  char hex[32];
  std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(ModuleBtfGuest::kHead));
  std::string link = std::string("sim-1@5:") + hex + "=";
  for (std::uint8_t b : ModuleBtfGuest::link_bytes()) {
    std::snprintf(hex, sizeof hex, "%02x", b);
    link += hex;
  }
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "xfs"
source = '''
kprobe:sys_getppid { printf("ino=%lx flags=%u\n", ((struct xfs_inode *)kaddr("xfs_file_read_iter"))->i_ino,
                            ((struct xfs_inode *)kaddr("xfs:xfs_file_read_iter"))->i_flags); }
'''
domains = [{ name = "sim-1" }]

[[program]]
name = "plain"
source = 'kprobe:sys_getppid { @c = count(); }'
domains = [{ name = "sim-1" }]
)");
  // The guest runs until the daemon stops: the retry comes seconds after the module is loaded.
  Daemon d(cfg,
           {"--sim", "--sim-guests", "1", "--sim-vcpus", "1", "--sim-iterations", "0", "--sim-image",
            "sim-1=" + g.image, "--sim-symbols", "sim-1=" + g.map, "--sim-write", link},
           t.path);
  json f = d.next("attach_failed", "sim-1");
  ASSERT_FALSE(f.is_null());
  EXPECT_EQ(f["program"], "xfs");
  const std::string b = f["body"];
  EXPECT_NE(b.find("error: no struct xfs_inode in the BTF of sim-1's kernel (read from its memory)\n"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find("a module's types are read from the modules loaded when the program attaches: once the module "
                   "is loaded, the next try attaches\n"),
            std::string::npos)
      << b;
  EXPECT_EQ(b.find("types left out"), std::string::npos) << b;  // no module on the list yet
  // The same attachment, attached at a later try.
  json a;
  do a = d.next("attached", "sim-1");
  while (!a.is_null() && a["program"] != "xfs");
  ASSERT_FALSE(a.is_null()) << d.err();
  char want[64];
  std::snprintf(want, sizeof want, "ino=%llx flags=%u\n", static_cast<unsigned long long>(ModuleBtfGuest::kIno),
                ModuleBtfGuest::kFlags);
  json p = d.next("printf", "sim-1");
  ASSERT_FALSE(p.is_null());
  EXPECT_EQ(p["body"], want) << p;
  EXPECT_EQ(d.stop(), 0) << d.err();
  int printed = 0, failed = 0;
  for (const json& r : d.all()) {
    if (r["kind"] == "printf") {
      EXPECT_EQ(r["body"], want) << r;
      ++printed;
    }
    if (r["kind"] == "attach_failed") ++failed;
  }
  EXPECT_GE(printed, 1);
  EXPECT_EQ(failed, 1);  // one record per reason, not one per try
  EXPECT_EQ(d.err().find("--sim-write"), std::string::npos) << d.err();
}

// Map keys and printf text are guest data. The bytes at sys_getppid are the ftrace nop
// 0f 1f 44 00 00, and at +5 sits the probe's own trap byte while it is armed (0xcc on the
// guest channel, tests/xenprobe): a lone 0xcc is not UTF-8. The metrics carry U+FFFD in its
// place and still pass promtool; the event log's lines still parse.
TEST(xenprobesd, GuestBytesCannotBreakTheMetricsOrTheLog) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "bytes"
source = '''
kprobe:sys_getppid { @bin[str(kaddr("sys_getppid") + 5, 2)] = count(); @ctl[str(kaddr("sys_getppid"), 4)] = count();
                     printf("%s|%s\n", str(kaddr("sys_getppid") + 5, 2), str(kaddr("sys_getppid"), 4)); }
'''
domains = [{ glob = "*" }]
event_burst = 1
events_per_second = 0.000001
)");
  Daemon d(cfg, sim(1), t.path);
  const int port = d.next("metrics_listening")["port"];
  json p = d.next("printf");
  ASSERT_FALSE(p.is_null());
  EXPECT_EQ(p["body"],
            "\xef\xbf\xbd|\x0f\x1f"
            "D\n");
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"bytes\",map=\"@bin\",key=\"\xef\xbf\xbd\"}"),
            2 * K)
      << m;
  EXPECT_EQ(sample(m,
                   "xenprobesd_map_value{domain=\"sim-1\",program=\"bytes\",map=\"@ctl\",key=\"\x0f\x1f"
                   "D\"}"),
            2 * K)
      << m;
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// A guest that makes every key unique cannot grow the daemon's memory: each map holds at most
// max_map_keys keys per domain; updates with new keys are dropped, counted in the metrics and
// logged once per map.
TEST(xenprobesd, AFullMapDropsNewKeysAndSaysSoOnce) {
  TempDir t;
  const std::string prog = R"(
[[program]]
name = "flood"
source = 'kprobe:sys_getppid { @n = count(); @flood[@n] = count(); }'
domains = [{ glob = "*" }]
)";
  auto cfg = t.write("c.toml", daemon_section("max_map_keys = 10") + prog);
  Daemon d(cfg, sim(1), t.path);
  const int port = d.next("metrics_listening")["port"];
  json full = d.next("map_full", "sim-1");
  ASSERT_FALSE(full.is_null());
  EXPECT_EQ(full["program"], "flood");
  EXPECT_NE(full["body"].get<std::string>().find("map @flood is full (10 keys)"), std::string::npos) << full;
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  const std::string l = "{domain=\"sim-1\",program=\"flood\",map=\"@flood\"}";
  EXPECT_EQ(sample(m, "xenprobesd_map_updates_dropped_total" + l), 2 * K - 10) << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"flood\",map=\"@n\",key=\"\"}"), 2 * K) << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"flood\",map=\"@flood\",key=\"10\"}"), 1) << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"flood\",map=\"@flood\",key=\"11\"}"), -1) << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_updates_dropped_total{domain=\"sim-1\",program=\"flood\",map=\"@n\"}"), -1) << m;
  expect_promtool_clean(m, t.path);
  int warnings = 0;
  for (const json& r : d.all()) warnings += r["kind"] == "map_full";
  EXPECT_EQ(warnings, 1);
  EXPECT_EQ(d.stop(), 0) << d.err();

  TempDir bad;
  auto zero = bad.write("c.toml", daemon_section("max_map_keys = 0") + prog);
  auto [st, out] = shell(std::string(XENPROBESD_BIN) + " --check-config -c " + zero.string());
  EXPECT_EQ(st, 1) << out;
  EXPECT_NE(out.find("max_map_keys"), std::string::npos) << out;
}

// kstack in a daemon's program: the demo guest's hand-written ORC chain (guest/kstack.S), its
// first two frames as one map key, exported with the newlines escaped.
TEST(xenprobesd, KstackKeysAMapByTheGuestsStack) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section("") + R"(
[[program]]
name = "stacks"
source = 'kprobe:demo_kstack_leaf { @s[kstack(2)] = count(); }'
domains = [{ glob = "*" }]
)");
  Daemon d(cfg, sim(1), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  const std::string key = "\\n        demo_kstack_leaf+0x0\\n        demo_kstack_middle+0x9\\n";
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"stacks\",map=\"@s\",key=\"" + key + "\"}"), K)
      << m;
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// A reload that only changes a program's selectors keeps the program: it detaches from the
// domains no longer selected and keeps its counters in the others.
TEST(xenprobesd, ReloadWithNewSelectorsKeepsTheProgramWhereItStillApplies) {
  TempDir t;
  const std::string prog = "\n[[program]]\nname = \"p\"\nsource = 'kprobe:sys_getppid { @c = count(); }'\n";
  auto cfg = t.write("c.toml", daemon_section() + prog + "domains = [{ glob = \"*\" }]\n");
  Daemon d(cfg, sim(2), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  t.write("c.toml", daemon_section() + prog + "domains = [{ name = \"sim-1\" }]\n");
  d.signal(SIGHUP);
  json loaded = d.next("config_loaded");
  ASSERT_FALSE(loaded.is_null());
  EXPECT_EQ(loaded["kept"], json({"p"}));
  json gone = d.next("detached", "sim-2");
  EXPECT_EQ(gone["body"], "the domain is no longer selected");
  EXPECT_EQ(gone["hits"], 2 * K);
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, hits("sim-1", "p", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(sample(m, hits("sim-2", "p", "kprobe:sys_getppid")), -1) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
}

// ---- method ----

// The same program through trap probes in sim-1 and through async records in sim-2 (an async
// probe has its point to itself: the two cannot share a guest). The workload is the same, so
// are the counts and maps; nsecs is the guest's clock at the hit, which stands still on the
// simulated Xen (Dom0's moves). The async guest's lost events are exported (none: its rings
// have room), the trap guest has no such series; the records say each attachment's method.
TEST(xenprobesd, AnAsyncProgramCountsWhatTheTrapOneCounts) {
  TempDir t;
  const std::string prog =
      "source = 'kprobe:sys_getppid { @calls = count(); @by[func, cpu] = count(); @lo = min(nsecs); "
      "@hi = max(nsecs); }'\n";
  auto cfg = t.write("c.toml", daemon_section() + "[[program]]\nname = \"trap\"\n" + prog +
                                   "domains = [{ name = \"sim-1\" }]\n\n[[program]]\nname = \"async\"\n" + prog +
                                   "domains = [{ name = \"sim-2\" }]\nmethod = \"async\"\n");
  Daemon d(cfg, sim(2), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  int attached = 0;
  for (const json& r : d.all())
    if (r["kind"] == "attached") {
      ++attached;
      EXPECT_EQ(r["method"], r["program"]) << r;
    }
  EXPECT_EQ(attached, 2);
  const std::string m = metrics(port);
  auto value = [&](const std::string& dom, const std::string& p, const std::string& map, const std::string& key) {
    return sample(m, "xenprobesd_map_value{domain=\"" + dom + "\",program=\"" + p + "\",map=\"" + map + "\",key=\"" +
                         key + "\"}");
  };
  for (auto [dom, p] : {std::pair{"sim-1", "trap"}, std::pair{"sim-2", "async"}}) {
    EXPECT_EQ(sample(m, hits(dom, p, "kprobe:sys_getppid")), 2 * K) << m;
    EXPECT_EQ(value(dom, p, "@calls", ""), 2 * K) << m;
    EXPECT_EQ(value(dom, p, "@by", "sys_getppid,0"), 2 * K) << m;
    EXPECT_GE(value(dom, p, "@lo", ""), 0) << m;
  }
  EXPECT_LT(value("sim-1", "trap", "@lo", ""), value("sim-1", "trap", "@hi", ""));
  EXPECT_EQ(value("sim-2", "async", "@lo", ""), value("sim-2", "async", "@hi", ""));
  EXPECT_EQ(sample(m, "xenprobesd_async_lost_events_total{domain=\"sim-2\"}"), 0) << m;
  EXPECT_EQ(sample(m, "xenprobesd_async_lost_events_total{domain=\"sim-1\"}"), -1) << m;
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
  int detached = 0;
  for (const json& r : d.all())
    if (r["kind"] == "detached") {
      ++detached;
      EXPECT_EQ(r["hits"], 2 * K) << r;
      EXPECT_EQ(r.contains("lost_events"), r["program"] == "async") << r;
      if (r["program"] == "async") { EXPECT_EQ(r["lost_events"], 0) << r; }
    }
  EXPECT_EQ(detached, 2);
}

// An async program that needs types cannot be planned at load: it is checked and planned with
// the guest's own BTF when it attaches there (the guest of tests/module_btf_guest.hpp, whose
// kernel and xfs module have BTF). One reading a field of a cast argument (a capture at
// arg0 + 8) attaches and counts every call; one reading a field at a kaddr() address checks
// against the types but a record cannot give it: that attachment fails with the planner's
// message, naming the method.
TEST(xenprobesd, AnAsyncProgramNeedingTypesIsPlannedWithTheGuestsBtfAtAttach) {
  using xenprobes::testing::ModuleBtfGuest;
  const ModuleBtfGuest g = xenprobes::testing::module_btf_guest();
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "field"
source = 'kprobe:sys_getppid { @f[((struct xfs_inode *)arg0)->i_flags >= 0] = count(); @c = count(); }'
domains = [{ name = "sim-1" }]
method = "async"

[[program]]
name = "kaddr"
source = 'kprobe:sys_getppid { @i = max(((struct xfs_inode *)kaddr("xfs_file_read_iter"))->i_ino); }'
domains = [{ name = "sim-1" }]
method = "async"
)");
  Daemon d(cfg, sim(1, {"--sim-image", "sim-1=" + g.image, "--sim-symbols", "sim-1=" + g.map}), t.path);
  const int port = d.next("metrics_listening")["port"];
  json f = d.next("attach_failed", "sim-1");
  ASSERT_FALSE(f.is_null());
  EXPECT_EQ(f["program"], "kaddr");
  const std::string b = f["body"];
  EXPECT_TRUE(b.starts_with("the program cannot run with method = \"async\":\n")) << b;
  EXPECT_NE(b.find("error: this read of guest memory cannot come from an async record"), std::string::npos) << b;
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  EXPECT_EQ(sample(m, hits("sim-1", "field", "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(sample(m, "xenprobesd_map_value{domain=\"sim-1\",program=\"field\",map=\"@c\",key=\"\"}"), 2 * K) << m;
  EXPECT_EQ(sample(m, "xenprobesd_async_lost_events_total{domain=\"sim-1\"}"), 0) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
  int attached = 0;
  for (const json& r : d.all())
    if (r["kind"] == "attached") {
      ++attached;
      EXPECT_EQ(r["program"], "field") << r;
      EXPECT_EQ(r["method"], "async") << r;
    }
  EXPECT_EQ(attached, 1);
}

// Async rings too small for the hits between two reads (--sim-ring-order 12: 4 KiB, three
// records of this probe): the guest module drops hits, and they are the domain's lost events,
// in the metrics and in the detached record. Every call the trap program counts in the other
// guest (the same workload) is a record or a lost event in the async one.
TEST(xenprobesd, AsyncHitsTheRingsHadNoRoomForAreLostEvents) {
  TempDir t;
  auto cfg = t.write("c.toml", daemon_section() + R"(
[[program]]
name = "trap"
source = 'kprobe:sys_read { @n = count(); }'
domains = [{ name = "sim-1" }]

[[program]]
name = "async"
source = 'kprobe:sys_read { @n = count(); @s[str(arg1, 1000)] = count(); }'
domains = [{ name = "sim-2" }]
method = "async"
)");
  Daemon d(cfg, {"--sim", "--sim-guests", "2", "--sim-vcpus", "2", "--sim-iterations", "400", "--sim-ring-order", "12"},
           t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  const std::string m = metrics(port);
  const double calls = sample(m, hits("sim-1", "trap", "kprobe:sys_read"));
  const double records = sample(m, hits("sim-2", "async", "kprobe:sys_read"));
  const double lost = sample(m, "xenprobesd_async_lost_events_total{domain=\"sim-2\"}");
  EXPECT_GT(calls, 0) << m;
  EXPECT_GT(lost, 0) << m;
  EXPECT_EQ(records + lost, calls) << m;
  expect_promtool_clean(m, t.path);
  EXPECT_EQ(d.stop(), 0) << d.err();
  json gone;
  for (const json& r : d.all())
    if (r["kind"] == "detached" && r["program"] == "async") gone = r;
  ASSERT_FALSE(gone.is_null());
  EXPECT_EQ(gone["lost_events"], lost);
  EXPECT_EQ(gone["hits"], records);
}

// A block an async record cannot serve (a str() of a variable) is refused at load, naming the
// program, the position in the configuration file, and the method to use instead; the same
// program with method = "trap" is accepted.
TEST(xenprobesd, AnAsyncProgramARecordCannotServeIsAConfigError) {
  TempDir t;
  const std::string prog =
      "[[program]]\nname = \"names\"\ndomains = [{ glob = \"*\" }]\n"
      "source = 'kprobe:sys_openat { $p = arg1; @[str($p)] = count(); }'\n";
  auto check = [&](const std::string& method) {
    auto cfg = t.write("c.toml", prog + "method = \"" + method + "\"\n");
    return shell("'" + std::string(XENPROBESD_BIN) + "' --check-config -c '" + cfg.string() + "'");
  };
  auto [status, out] = check("async");
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("c.toml:4:44: error: program \"names\": str() of this address cannot come from an async "
                     "record (method = \"async\")"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("use method = \"trap\" (or \"jump\") for this program"), std::string::npos) << out;
  auto [trap_status, trap_out] = check("trap");
  EXPECT_EQ(trap_status, 0) << trap_out;
}

// The method goes to the library: on the debugger channel a jump or an async kprobe cannot be
// placed, and its attachment fails with the library's reason, while the trap program and
// fastest (a trap where a jump cannot be) count as always. (jump and async probe functions of
// their own: a jump or async probe cannot share a trap probe's point.)
TEST(xenprobesd, TheMethodGoesToTheLibrary) {
  TempDir t;
  std::string progs;
  for (auto [m, fn] : {std::pair{"trap", "sys_getppid"}, std::pair{"fastest", "sys_getppid"},
                       std::pair{"jump", "sys_read"}, std::pair{"async", "demo_recurse"}})
    progs += std::string("\n[[program]]\nname = \"") + m + "\"\nmethod = \"" + m + "\"\nsource = 'kprobe:" + fn +
             " { @c = count(); }'\ndomains = [{ glob = \"*\" }]\n";
  auto cfg = t.write("c.toml", daemon_section("channel = \"debugger\"") + progs);
  Daemon d(cfg, sim(1, {"--sim-type", "pvh"}), t.path);
  const int port = d.next("metrics_listening")["port"];
  ASSERT_FALSE(d.next("sim_idle").is_null());
  std::set<std::string> attached, failed;
  for (const json& r : d.all()) {
    if (r["kind"] == "attached") attached.insert(r["program"].get<std::string>());
    if (r["kind"] == "attach_failed") {
      failed.insert(r["program"].get<std::string>());
      // An async probe is a jump probe whose hit the module records (Session::probe_async).
      const std::string body = r["body"];
      EXPECT_TRUE(body.starts_with(r["program"] == "jump" ? "kprobe:sys_read: " : "kprobe:demo_recurse: ")) << r;
      EXPECT_NE(body.find("cannot be a jump probe: jump probes need the guest channel"), std::string::npos) << r;
    }
  }
  EXPECT_EQ(attached, (std::set<std::string>{"fastest", "trap"}));
  EXPECT_EQ(failed, (std::set<std::string>{"async", "jump"}));
  const std::string m = metrics(port);
  for (const char* p : {"trap", "fastest"}) EXPECT_EQ(sample(m, hits("sim-1", p, "kprobe:sys_getppid")), 2 * K) << m;
  EXPECT_EQ(d.stop(), 0) << d.err();
}
