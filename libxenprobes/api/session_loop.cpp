// The session's event loop (Session::run_once): one poll over the xenstore watches, the wake
// eventfd, the hypervisor handle's event channels and the channels' own fds, then a look by
// exactly the channels (and domains) the wake-up was for (docs/architecture.md "The event
// loop").
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <vector>

#include "api/session_impl.hpp"
#include "api/session_testing.hpp"
#include "channel/event_ports.hpp"
#include "common/result.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes {
namespace {

using Wake = channel::EventPorts::Wake;

// Adds a wake-up once: a look at every domain of a channel covers its looks at one domain.
void add_wake(std::vector<Wake>& wakes, const Wake& w) {
  auto whole = [&](const Wake& x) { return x.channel == w.channel && !x.domain; };
  if (std::any_of(wakes.begin(), wakes.end(), whole)) return;
  if (!w.domain) std::erase_if(wakes, [&](const Wake& x) { return x.channel == w.channel; });
  if (std::find(wakes.begin(), wakes.end(), w) == wakes.end()) wakes.push_back(w);
}

bool readable(const std::vector<pollfd>& fds, int fd) {
  return std::any_of(fds.begin(), fds.end(),
                     [&](const pollfd& p) { return p.fd == fd && (p.revents & (POLLIN | POLLERR | POLLHUP)); });
}

}  // namespace

// Who looks, on a wake-up:
//  - a port fired on the hypervisor handle (the guest channel's per-domain ports, the debugger
//    channel's VIRQ): its owner, for the port's domain only, or for all its domains when the
//    port serves them all (the VIRQ says nothing of which domain stopped). The ports are read
//    and unmasked in one place (EventPorts::take), before any channel looks;
//  - a channel's own fd is readable (the vmevent channel's rings): that channel;
//  - a channel's poll_interval_ms has passed since its last look at all its domains (the
//    debugger channel's foreign int3s raise no VIRQ; the vmevent channel's answers waiting for
//    ring room): that channel, whatever woke the loop, so a busy loop never starves it;
//  - a wake-up that names no channel: the poll timed out (the caller's timeout, or the wait an
//    interval asked for), a xenstore event or stop() woke it: every channel, every domain. A
//    notification that came late or never (docs/e2e.md "Open": Debian 13's Dom0), or a hit a
//    module did not notify because Dom0 said it polls, is found then. Tests:
//    EventLoop.AHitWhoseNotificationWasLostIsFoundOnTheTimeoutsWakeUp,
//    CApiProbes.RingStatsVersion2CountsTheHitsTheModuleDidNotNotify.
// No other channel or domain does any work. The engine's own periodic work (jumps waiting for
// quiescence, async rings, deferred removals, return-probe records) runs after every turn
// (Engine::after_dispatch), as before.
Result<unsigned> Session::run_once(int timeout_ms) {
  Impl& m = *impl_;
  auto channels = m.channels();
  const int ev_fd = m.hv->evtchn_fd();
  std::vector<pollfd> fds{{m.hv->xs_fd(), POLLIN, 0}, {m.wake_fd, POLLIN, 0}};
  int interval = 0;
  for (channel::Channel* c : channels) {
    if (c->fd() >= 0 && std::none_of(fds.begin(), fds.end(), [&](const pollfd& p) { return p.fd == c->fd(); }))
      fds.push_back({c->fd(), POLLIN, 0});
    if (int i = c->poll_interval_ms(); i > 0 && (interval == 0 || i < interval)) interval = i;
  }
  // Work the engine does between hits (a jump waiting for the guest module's quiescence).
  if (int i = m.engine->wake_interval_ms(); i > 0 && (interval == 0 || i < interval)) interval = i;
  int wait = interval > 0 && (timeout_ms < 0 || timeout_ms > interval) ? interval : timeout_ms;
  int n = ::poll(fds.data(), fds.size(), wait);
  if (n < 0 && errno != EINTR) return fail_errno(errno, "poll");
  if (fds[1].revents & POLLIN) {
    std::uint64_t v;
    [[maybe_unused]] auto r = ::read(m.wake_fd, &v, sizeof v);
  }
  if (fds[0].revents & POLLIN) m.reap();
  // A channel given back since the last turn (the debugger channel after a failed attach)
  // leaves no entry behind.
  std::erase_if(m.swept,
                [&](const auto& e) { return std::find(channels.begin(), channels.end(), e.first) == channels.end(); });

  const auto now = m.loop_clock ? m.loop_clock() : std::chrono::steady_clock::now();
  std::optional<Error> first;
  std::vector<Wake> wakes;
  bool named = false;  // the wake-up came from channels' events (ports, own fds)
  if (ev_fd >= 0 && readable(fds, ev_fd)) {
    named = true;
    std::vector<Wake> fired;
    if (auto t = m.ports->take(channels, fired); !t) first = t.error();
    for (const Wake& w : fired) add_wake(wakes, w);
  }
  for (channel::Channel* c : channels) {
    if (c->fd() >= 0 && c->fd() != ev_fd && readable(fds, c->fd())) {
      named = true;
      add_wake(wakes, Wake{c, std::nullopt});
    }
    const int i = c->poll_interval_ms();
    auto last = m.swept.find(c);
    if (i > 0 && (last == m.swept.end() || now - last->second >= std::chrono::milliseconds(i)))
      add_wake(wakes, Wake{c, std::nullopt});
  }
  // A wake-up that names no channel: a timeout (the caller's, or the shorter wait an interval
  // asked for: nothing happened for that long), a xenstore event, stop(). Every channel looks:
  // the cost of a look at everything is paid when the loop is idle, never per event.
  if (!named)
    for (channel::Channel* c : channels) add_wake(wakes, Wake{c, std::nullopt});

  unsigned handled = 0, guest_handled = 0;
  for (const Wake& w : wakes) {
    auto h = w.domain ? w.channel->process_domain(*w.domain, *m.engine) : w.channel->process(*m.engine);
    if (!w.domain) m.swept[w.channel] = now;
    if (h) {
      handled += *h;
      if (w.channel == m.guest.get()) guest_handled += *h;
    } else if (!first) {
      first = h.error();
    }
  }
  // Spinning (protocol.h "Spinning instead of notifying"): while guest-channel hits keep
  // coming within spin_us of each other, poll the mailboxes instead of sleeping; the module,
  // seeing dom0_polling, sends no notification for them.
  if (!first && guest_handled > 0 && m.options.spin_us > 0) {
    XP_TRY(m.engine->after_dispatch(true));
    auto spun = m.spin(std::chrono::microseconds(m.options.spin_us));
    if (!spun) first = spun.error();
    else handled += *spun;
  }
  XP_TRY(m.engine->after_dispatch(!first));
  if (first) return std::unexpected(*first);
  return handled;
}

// ---- test hooks (api/session_testing.hpp) ----

void SessionTesting::set_loop_clock(Session& s, std::function<std::chrono::steady_clock::time_point()> clock) {
  s.impl_->loop_clock = std::move(clock);
}

channel::EventPorts::Counters SessionTesting::event_ports(Session& s) { return s.impl_->ports->counters(); }

Result<channel::GuestChannel::Stats> SessionTesting::guest_stats(Session& s, DomId dom) {
  if (!s.impl_->guest) return fail(Errc::InvalidArgument, "the session has no guest channel");
  return s.impl_->guest->stats(dom);
}

}  // namespace xenprobes
