// The C API's access to a session's probes by id (the C++ API goes through Probe). These
// members are private and hidden: not part of the exported ABI (libxenprobes/xenprobes.abi).
#pragma once

#include "xenprobes/xenprobes.hpp"

namespace xenprobes {

struct SessionAccess {
  [[nodiscard]] static Result<void> set_enabled(Session& s, std::uint64_t id, bool on) { return s.set_enabled(id, on); }
  [[nodiscard]] static Result<void> unregister(Session& s, std::uint64_t id) { return s.unregister(id); }
  static ProbeStats stats(const Session& s, std::uint64_t id) { return s.stats(id); }
  [[nodiscard]] static Result<ProbeInfo> info(const Session& s, std::uint64_t id) { return s.info(id); }
};

}  // namespace xenprobes
