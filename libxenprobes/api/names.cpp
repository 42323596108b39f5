// The public enums' names, as tools print and parse them.
#include <string>

#include "common/result.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes {

const char* channel_kind_name(ChannelKind k) {
  switch (k) {
    case ChannelKind::Auto: return "auto";
    case ChannelKind::Debugger: return "debugger";
    case ChannelKind::Guest: return "guest";
    case ChannelKind::VmEvent: return "vmevent";
  }
  return "?";
}

const char* probe_method_name(ProbeMethod m) {
  switch (m) {
    case ProbeMethod::Trap: return "trap";
    case ProbeMethod::Jump: return "jump";
    case ProbeMethod::Fastest: return "fastest";
  }
  return "?";
}

Result<ChannelKind> parse_channel_kind(std::string_view s) {
  for (ChannelKind k : {ChannelKind::Auto, ChannelKind::Debugger, ChannelKind::Guest, ChannelKind::VmEvent})
    if (s == channel_kind_name(k)) return k;
  return fail(Errc::InvalidArgument, "unknown channel '" + std::string(s) + "': use auto, guest, vmevent or debugger");
}

}  // namespace xenprobes
