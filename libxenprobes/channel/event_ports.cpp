// EventPorts: which port fired on the hypervisor handle, and whose it is.
#include "channel/event_ports.hpp"

#include <algorithm>

#include "common/log.hpp"

namespace xenprobes::channel {

Result<void> EventPorts::take(std::span<Channel* const> channels, std::vector<Wake>& out) {
  std::vector<hv::EvtchnPort> read;
  std::optional<Error> first;
  while (read.size() < kMaxPerTake) {
    auto p = hv_.evtchn_pending();
    if (!p) {
      first = p.error();
      break;
    }
    if (!*p) break;
    read.push_back(**p);
  }
  for (hv::EvtchnPort port : read) {
    ++counters_.ports;
    std::optional<Wake> wake;
    for (Channel* c : channels)
      if (auto use = c ? c->port_use(port) : std::nullopt) {
        wake = Wake{c, use->domain};
        break;
      }
    auto acked = hv_.evtchn_unmask(port);
    if (!wake) {
      ++counters_.unknown;
      XP_LOG_RATELIMITED(Info,
                         "event channel port %u fired, but no channel owns it (just unbound, or bound "
                         "behind the session's back): ignored",
                         port);
      if (!acked) XP_LOG(Debug, "port %u: unmask: %s", port, acked.error().what.c_str());
      continue;
    }
    if (!acked && !first) first = acked.error();
    if (std::find(out.begin(), out.end(), *wake) == out.end()) out.push_back(*wake);
  }
  if (first) return std::unexpected(*first);
  return {};
}

}  // namespace xenprobes::channel
