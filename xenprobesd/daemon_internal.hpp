// The Daemon's private helpers, shared by its source files (xenprobesd/daemon*.cpp): not a
// header for anyone else.
#pragma once

#include <cstdint>
#include <string>

#include "daemon.hpp"

namespace xenprobesd {

inline DomainKey key_of(const xenprobes::hv::DomainInfo& d) { return DomainKey{d.domid.value, d.handle}; }

inline std::uint64_t missed_of(const ProbeEntry& p) {
  if (!p.probe) return p.missed_at_removal;
  auto st = p.probe.stats();
  return st.unhandled + st.untracked_calls;
}

// The records an instance prints go to the event log (daemon_actions.cpp).
class EventSink final : public xenprobe::Output {
 public:
  EventSink(Daemon& d, Attachment& a) : Output(xenprobe::OutputFormat::Json, nullptr, false), d_(d), a_(a) {}
  void text(const std::string&, std::string_view) override {}
  void flush() override {}
  void record(const std::string& domain, const char* type, const std::string& data_json) override;
  // Once per map and domain (the runtime says when a map first refuses a key): not rate-limited.
  void warning(const std::string& domain, const std::string& msg) override;

 private:
  Daemon& d_;
  Attachment& a_;
};

}  // namespace xenprobesd
