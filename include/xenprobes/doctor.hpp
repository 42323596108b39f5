// What can probe what on this host: the hypervisor's abilities and, per domain, the guest
// module and every channel with the reason it can or cannot serve. Reads only: nothing in a
// guest is touched, no domain is paused, no channel is attached.
//
//   auto hv = xenprobes::hv::open_hypervisor();
//   auto r = xenprobes::doctor(**hv);
//   std::fputs(xenprobes::format(*r).c_str(), stdout);
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "xenprobes/export.h"
#include "xenprobes/hypervisor.hpp"
#include "xenprobes/result.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobes {

struct ChannelCheck {
  ChannelKind kind = ChannelKind::Auto;
  bool available = false;
  std::string detail;  // why not, and what would make it work; or what it will use
};

struct DomainReport {
  DomId domid;
  std::string name;
  hv::GuestType type = hv::GuestType::Pv;
  unsigned guest_width = 8;
  unsigned vcpus = 0;
  bool module = false;                     // the guest module's keys are there and valid
  unsigned module_version = 0;             // protocol version it speaks (0: none)
  std::string module_release;              // the guest kernel's uname -r, as the module published it
  std::string module_problem;              // why the module's keys are unusable ("" when fine)
  std::vector<ChannelCheck> channels;      // guest, vmevent, debugger: Auto's order
  std::optional<ChannelKind> auto_choice;  // what ChannelKind::Auto would pick
};

struct DoctorReport {
  std::string backend;  // "xen" or "sim"
  std::string xen_version;
  bool gdbsx = false;
  bool vm_event = false;
  std::string virq_debugger;          // "free", or who holds it
  std::vector<DomainReport> domains;  // Dom0 excluded
};

// Every domain, or only `only`.
[[nodiscard]] XENPROBES_API Result<DoctorReport> doctor(hv::Hypervisor&, std::optional<DomId> only = {});
// A human-readable report, one block per domain.
XENPROBES_API std::string format(const DoctorReport&);

}  // namespace xenprobes
