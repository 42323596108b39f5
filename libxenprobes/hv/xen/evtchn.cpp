// libxenevtchn: the only file of the backend that includes xenevtchn.h.
#include <poll.h>

#include <cerrno>
#include <string>

extern "C" {
#include <xenevtchn.h>
}

#include "hv/xen/xen_internal.hpp"

namespace xenprobes::hv::xen {

Result<std::unique_ptr<Evtchn>> Evtchn::open() {
  xenevtchn_handle* h = xenevtchn_open(quiet_logger(), 0);
  if (!h) {
    int e = errno;
    if (e == EACCES || e == EPERM)
      return fail(Errc::Permission, "xenevtchn_open: permission denied: run as root in Dom0");
    return fail_errno(e, "xenevtchn_open");
  }
  return std::unique_ptr<Evtchn>(new Evtchn(h));
}

Evtchn::~Evtchn() { xenevtchn_close(h_); }

Result<EvtchnPort> Evtchn::bind_virq(unsigned virq) {
  xenevtchn_port_or_error_t p = xenevtchn_bind_virq(h_, virq);
  if (p < 0) {
    int e = errno;
    // A domain binds a VIRQ once per vCPU, and a global one (VIRQ_DEBUGGER) on vCPU 0 only, so a
    // second binder in Dom0 gets EEXIST (evtchn_bind_virq, xen/common/event_channel.c).
    if (e == EEXIST)
      return fail(Errc::Exists, "xenevtchn_bind_virq(" + std::to_string(virq) +
                                    "): another process already binds this global VIRQ "
                                    "(one binder per host)");
    return fail_errno(e, "xenevtchn_bind_virq(" + std::to_string(virq) + ")");
  }
  return static_cast<EvtchnPort>(p);
}

Result<EvtchnPort> Evtchn::bind_interdomain(DomId dom, std::uint32_t remote_port) {
  xenevtchn_port_or_error_t p = xenevtchn_bind_interdomain(h_, dom.value, remote_port);
  if (p < 0)
    return fail_errno(errno, "xenevtchn_bind_interdomain(dom" + std::to_string(dom.value) + ", port " +
                                 std::to_string(remote_port) + ")");
  return static_cast<EvtchnPort>(p);
}

Result<void> Evtchn::unbind(EvtchnPort port) {
  if (xenevtchn_unbind(h_, port) < 0) return fail_errno(errno, "xenevtchn_unbind(port " + std::to_string(port) + ")");
  return {};
}

Result<void> Evtchn::notify(EvtchnPort port) {
  if (xenevtchn_notify(h_, port) < 0) return fail_errno(errno, "xenevtchn_notify(port " + std::to_string(port) + ")");
  return {};
}

int Evtchn::fd() const { return xenevtchn_fd(h_); }

// One port per call, left masked. Xen's libxenevtchn (tools/include/xenevtchn.h; on Linux,
// tools/libs/evtchn/linux.c) reads a single port number from /dev/xen/evtchn, and the kernel's
// evtchn driver masked that port when it queued it: an event raised on it meanwhile stays
// pending and is delivered only after unmask() below writes the port back. So a port appears
// at most once until it is unmasked, and the event loop (channel/event_ports.hpp) reads the
// ports one by one, hands each to its owner and unmasks it, in one place. The read blocks when
// nothing is queued (setting the fd non-blocking is not reliable, the header warns): hence the
// poll first.
Result<std::optional<EvtchnPort>> Evtchn::pending() {
  std::lock_guard lk(pending_mu_);
  pollfd pfd{xenevtchn_fd(h_), POLLIN, 0};
  int n;
  do n = ::poll(&pfd, 1, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0) return fail_errno(errno, "poll(evtchn fd)");
  if (n == 0 || !(pfd.revents & POLLIN)) {
    if (pfd.revents & (POLLERR | POLLNVAL)) return fail(Errc::Io, "evtchn fd: poll error");
    return std::optional<EvtchnPort>{};
  }
  xenevtchn_port_or_error_t p = xenevtchn_pending(h_);
  if (p < 0) {
    int e = errno;
    if (e == EAGAIN || e == EINTR) return std::optional<EvtchnPort>{};
    return fail_errno(e, "xenevtchn_pending");
  }
  return std::optional<EvtchnPort>{static_cast<EvtchnPort>(p)};
}

Result<void> Evtchn::unmask(EvtchnPort port) {
  if (xenevtchn_unmask(h_, port) < 0) return fail_errno(errno, "xenevtchn_unmask(port " + std::to_string(port) + ")");
  return {};
}

}  // namespace xenprobes::hv::xen
