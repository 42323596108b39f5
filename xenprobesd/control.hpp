// The control socket: `xenprobesd status` and `xenprobesd reload` talk to a running daemon
// through a Unix stream socket (docs/xenprobesd.md, "Control"). One request per connection,
// one line ("status" or "reload"), answered with text; the reload's answer says whether the
// configuration was accepted. Only root and the daemon's own user are answered.
#pragma once

#include <string>
#include <thread>

#include "daemon.hpp"

namespace xenprobesd {

class ControlServer {
 public:
  // Binds `path` (0600). A socket file nobody answers on is replaced; one a live daemon
  // answers on is an error. Throws std::runtime_error.
  ControlServer(std::string path, Requests&);
  ~ControlServer();  // stops answering, removes the socket
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

 private:
  void serve();
  void answer(int fd);
  std::string path_;
  Requests& requests_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // an eventfd: written to stop the thread
  std::thread thread_;
};

// The client's side: sends `request`, returns the answer. Throws std::runtime_error when the
// daemon cannot be reached.
std::string control_request(const std::string& path, const std::string& request);

}  // namespace xenprobesd
