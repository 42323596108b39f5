// Shared by xenprobesd's tests (xenprobesd_test.cpp, xenprobesd_guest_data_test.cpp,
// xenprobesd_method_test.cpp): the daemon as a subprocess on the simulated Xen with its event
// log read record by record, its control socket, its metrics fetched and checked with promtool,
// and the configuration pieces the tests share.
#pragma once

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

namespace xenprobes::testing {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline constexpr std::uint64_t K = 30;  // iterations of each simulated guest

inline std::string slurp(const fs::path& p) {
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
inline std::pair<int, std::string> shell(const std::string& cmd) {
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

inline std::string metrics(int port) {
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
inline void expect_promtool_clean(const std::string& text, const fs::path& dir) {
  const fs::path f = dir / "metrics.prom";
  std::ofstream(f) << text;
  auto [status, out] = shell("promtool check metrics < " + f.string());
  EXPECT_EQ(status, 0) << out << "\n" << text;
  EXPECT_EQ(out, "") << text;
}

// The value of one sample line, or -1 if it is absent.
inline double sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with(series + " ")) return std::stod(line.substr(series.size() + 1));
  return -1;
}

inline std::string hits(const std::string& dom, const std::string& prog, const std::string& probe) {
  return "xenprobesd_probe_hits_total{domain=\"" + dom + "\",program=\"" + prog + "\",probe=\"" + probe + "\"}";
}

inline std::string daemon_section(const std::string& extra = "") {
  return "[daemon]\nevent_log = \"-\"\nmetrics_listen = \"127.0.0.1:0\"\n" + extra + "\n";
}

inline std::vector<std::string> sim(unsigned guests, std::vector<std::string> more = {}) {
  std::vector<std::string> a{"--sim", "--sim-guests",     std::to_string(guests), "--sim-vcpus",
                             "1",     "--sim-iterations", std::to_string(K)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

}  // namespace xenprobes::testing
