// The control socket (control.hpp).
#include "control.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xenprobesd {

namespace {

constexpr std::size_t kMaxRequest = 64;
constexpr int kIoTimeoutSec = 5;                           // a client that does not send its line in time is dropped
constexpr auto kAnswerTimeout = std::chrono::seconds(60);  // a reload compiles and attaches

sockaddr_un address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path)
    throw std::runtime_error("control socket path \"" + path + "\" is empty or longer than " +
                             std::to_string(sizeof a.sun_path - 1) + " bytes");
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

void set_timeouts(int fd) {
  timeval tv{kIoTimeoutSec, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

}  // namespace

ControlServer::ControlServer(std::string path, Requests& requests) : path_(std::move(path)), requests_(requests) {
  sockaddr_un a = address(path_);
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) throw std::runtime_error("control socket " + path_ + " exists and is not a socket");
    int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live = probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (probe >= 0) ::close(probe);
    if (live) throw std::runtime_error("another daemon answers on the control socket " + path_);
    ::unlink(path_.c_str());  // left by a daemon that died
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw std::runtime_error(std::string("control socket: ") + std::strerror(errno));
  const mode_t old = ::umask(0177);  // 0600 from the start: no window where others may connect
  const int b = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::umask(old);
  if (b != 0 || ::listen(listen_fd_, 8) != 0) {
    std::string why = std::strerror(errno);
    ::close(listen_fd_);
    throw std::runtime_error("cannot listen on the control socket " + path_ + ": " + why);
  }
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  thread_ = std::thread([this] { serve(); });
}

ControlServer::~ControlServer() {
  std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(stop_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
  ::unlink(path_.c_str());
}

void ControlServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    answer(fd);
    ::close(fd);
  }
}

void ControlServer::answer(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || (cred.uid != 0 && cred.uid != ::geteuid())) {
    write_all(fd, "error: only root or the daemon's user may control it\n");
    return;
  }
  set_timeouts(fd);
  std::string line;
  char c;
  while (line.size() <= kMaxRequest) {
    ssize_t n = ::recv(fd, &c, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    line += c;
  }
  if (line != "status" && line != "reload") {
    write_all(fd, "error: unknown request (status, reload)\n");
    return;
  }
  auto a = requests_.ask(line, kAnswerTimeout);
  write_all(fd, a ? *a : "error: the daemon did not answer (stopping, or busy for a minute)\n");
}

std::string control_request(const std::string& path, const std::string& request) {
  sockaddr_un a = address(path);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::strerror(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    std::string why = std::strerror(errno);
    ::close(fd);
    throw std::runtime_error("cannot reach xenprobesd at " + path + ": " + why +
                             " (is it running, with control_socket = \"" + path + "\"?)");
  }
  write_all(fd, request + "\n");
  ::shutdown(fd, SHUT_WR);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > (16u << 20)) break;
  }
  ::close(fd);
  return out;
}

}  // namespace xenprobesd
