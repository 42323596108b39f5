// The ports that fired on the hypervisor handle's event channels (hv::Hypervisor::evtchn_fd),
// read for the event loop and handed to the channels that own them (Channel::port_use).
//
// What Xen guarantees here (libxenevtchn as Xen ships it: tools/include/xenevtchn.h and the
// Linux backend, tools/libs/evtchn/linux.c): xenevtchn_pending() reads a single port from the
// evtchn device, and by then the kernel's driver has masked that port; a further event on it
// is kept pending and delivered only after xenevtchn_unmask(port). So one read gives one port,
// a port is queued at most once until it is unmasked, and a port never unmasked never wakes
// the handle again. The simulated Xen (hv/sim) models exactly this.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "channel/channel.hpp"

namespace xenprobes::channel {

class EventPorts {
 public:
  explicit EventPorts(hv::Hypervisor& hv) : hv_(hv) {}

  // A wake-up for one channel: for `domain` only, or (none) for every domain it attached.
  struct Wake {
    Channel* channel = nullptr;
    std::optional<DomId> domain;
    bool operator==(const Wake&) const = default;
  };

  // Reads the ports pending on the handle (at most kMaxPerTake), finds each one's owner among
  // `channels`, and unmasks each: the one place ports are acknowledged, before any owner looks,
  // so an event raised after the owner's look wakes the loop again. Appends to `out` each
  // wake-up once, in the order read, even when the call fails (a read or an unmask): the ports
  // read are unmasked whatever happens, and their owners are still owed a look. A port no
  // channel owns is counted and logged (rate-limited), unmasked all the same (a port this
  // handle no longer binds refuses the unmask: ignored), and wakes nobody.
  [[nodiscard]] Result<void> take(std::span<Channel* const> channels, std::vector<Wake>& out);

  struct Counters {
    std::uint64_t ports = 0;    // ports read
    std::uint64_t unknown = 0;  // of them, owned by no channel
  };
  const Counters& counters() const { return counters_; }

  // More than this many ports in one take: the rest wait for the next turn of the loop (each
  // port is queued once until unmasked, so only a handle with this many bound ports gets here).
  static constexpr unsigned kMaxPerTake = 1024;

 private:
  hv::Hypervisor& hv_;
  Counters counters_;
};

}  // namespace xenprobes::channel
