// doctor(): what can probe what, read without touching any guest.
#include "xenprobes/doctor.hpp"

#include <cstdio>

#include "channel/eligibility.hpp"
#include "common/result.hpp"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"
#include "guestmod/module_info.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes {
namespace {

const char* type_name(const DomainReport& d) {
  if (d.type == hv::GuestType::Pv) return d.guest_width == 4 ? "PV (32-bit)" : "PV";
  return "HVM/PVH";
}

// Reads and validates the module's keys the way an attach would (hostile input), through a
// read-only view of the guest's page tables.
void check_module(hv::Hypervisor& hv, const hv::DomainInfo& info, DomainReport& r) {
  auto version = hv.xs_read(guestmod::module_key(info.domid, XENPROBES_XS_VERSION));
  if (!version) {
    r.module_problem = version.error().code == Errc::NotFound
                           ? "not loaded (no " + guestmod::module_dir(info.domid) + ")"
                           : version.error().what;
    return;
  }
  mem::HypervisorFrameSource source(hv, info.domid);
  mem::GuestMemory memory(source);
  auto regs = hv.get_vcpu_regs(info.domid, VcpuId{0});
  if (!regs) {
    r.module_problem = "cannot read vCPU 0's registers: " + regs.error().what;
    return;
  }
  auto ctx = mem::paging_context(info, *regs);
  if (!ctx) {
    r.module_problem = "cannot tell the guest's paging mode: " + ctx.error().what;
    return;
  }
  memory.set_context(*ctx);
  auto mi = guestmod::read_module_info(hv, info.domid, guestmod::check_mapped_via(memory));
  if (!mi) {
    r.module_problem = mi.error().what;
    return;
  }
  r.module = true;
  r.module_version = mi->version;
  r.module_release = mi->release;
}

ChannelCheck check_guest(hv::Hypervisor& hv, const hv::DomainInfo& info, const DomainReport& r) {
  ChannelCheck c{ChannelKind::Guest, false, {}};
  if (auto e = channel::guest_domain_eligible(info); !e) {
    c.detail = e.error().what;
  } else if (!r.module) {
    c.detail = "needs the xenprobesU module in the guest: " + r.module_problem;
  }
  if (!c.detail.empty()) return c;
  for (const char* key : {XENPROBES_XS_CONTROL_ADDR, XENPROBES_XS_EVTCHN}) {
    if (!hv.xs_read(guestmod::module_key(r.domid, key))) {
      c.detail = std::string("the module publishes no ") + key + " (a module without the guest channel)";
      return c;
    }
  }
  c.available = true;
  c.detail = "module protocol " + std::to_string(r.module_version) + "; no domain pause per hit";
  return c;
}

ChannelCheck check_vmevent(const hv::Capabilities& caps, const hv::DomainInfo& info, const DomainReport& r) {
  ChannelCheck c{ChannelKind::VmEvent, false, {}};
  if (auto h = channel::vmevent_host_eligible(caps); !h) {
    c.detail = h.error().what;
  } else if (auto e = channel::vmevent_domain_eligible(info); !e) {
    c.detail = e.error().what;
  } else {
    c.available = true;
    c.detail = r.module ? "ICEBP traps, slots from the guest module"
                        : "agentless: int3 traps, Xen emulates the original instructions (no post-handlers, "
                          "no return probes without the module; needs the CPU's #BP intercept, which QEMU's TCG "
                          "does not give a nested Xen)";
  }
  return c;
}

ChannelCheck check_debugger(const hv::Capabilities& caps, const DoctorReport& host, const hv::DomainInfo& info,
                            const DomainReport& r) {
  ChannelCheck c{ChannelKind::Debugger, false, {}};
  if (auto h = channel::debugger_host_eligible(caps); !h) {
    c.detail = h.error().what;
  } else if (host.virq_debugger != "free") {
    c.detail = "VIRQ_DEBUGGER " + host.virq_debugger;
  } else if (auto e = channel::debugger_domain_eligible(info); !e) {
    c.detail = e.error().what;
  } else if (!r.module) {
    c.detail = "needs the guest module's out-of-line area: " + r.module_problem;
  } else {
    c.available = true;
    c.detail = "ICEBP traps; the domain pauses on every hit";
  }
  return c;
}

}  // namespace

Result<DoctorReport> doctor(hv::Hypervisor& hv, std::optional<DomId> only) {
  DoctorReport rep;
  rep.backend = hv.name();
  rep.xen_version = hv.version().value_or("unknown");
  hv::Capabilities caps = XP_TRY(hv.capabilities());
  rep.gdbsx = caps.gdbsx;
  rep.vm_event = caps.vm_event;
  rep.virq_debugger = "not checked (no GDBSX)";
  if (caps.gdbsx) {
    // One binder per host: find out whether it is free by binding it for a moment.
    if (auto port = hv.evtchn_bind_virq(hv::kVirqDebugger)) {
      best_effort(hv.evtchn_unbind(*port), "doctor: unbinding the VIRQ_DEBUGGER port it bound for a moment",
                  log::Level::Warn);
      rep.virq_debugger = "free";
    } else {
      rep.virq_debugger = port.error().code == Errc::Exists
                              ? "is bound by another process (a xenprobes program or gdbsx)"
                              : "cannot be bound: " + port.error().what;
    }
  }
  std::vector<hv::DomainInfo> infos;
  if (only) {
    infos.push_back(XP_TRY(hv.domain_info(*only)));
  } else {
    infos = XP_TRY(hv.list_domains());
  }
  for (const hv::DomainInfo& info : infos) {
    if (info.domid.value == 0) continue;
    DomainReport r;
    r.domid = info.domid;
    r.name = info.name;
    r.type = info.type;
    r.guest_width = info.guest_width;
    r.vcpus = info.vcpus;
    if (info.dying || info.crashed) {
      r.module_problem = "the domain is dying or crashed";
    } else {
      check_module(hv, info, r);
    }
    // In Auto's order: the first available is what Auto picks.
    for (ChannelKind k : channel::kAutoOrder) {
      switch (k) {
        case ChannelKind::Guest: r.channels.push_back(check_guest(hv, info, r)); break;
        case ChannelKind::VmEvent: r.channels.push_back(check_vmevent(caps, info, r)); break;
        case ChannelKind::Debugger: r.channels.push_back(check_debugger(caps, rep, info, r)); break;
        case ChannelKind::Auto: break;
      }
    }
    for (const ChannelCheck& c : r.channels)
      if (c.available && !r.auto_choice) r.auto_choice = c.kind;
    rep.domains.push_back(std::move(r));
  }
  return rep;
}

std::string format(const DoctorReport& rep) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  line("hypervisor: " + rep.backend + " " + rep.xen_version + "; GDBSX " + (rep.gdbsx ? "yes" : "no") + "; vm_event " +
       (rep.vm_event ? "yes" : "no") + "; VIRQ_DEBUGGER " + rep.virq_debugger);
  if (rep.domains.empty()) line("no guest domains");
  for (const DomainReport& d : rep.domains) {
    line("domain " + std::to_string(d.domid.value) + (d.name.empty() ? "" : " (" + d.name + ")") + ": " + type_name(d) +
         ", " + std::to_string(d.vcpus) + " vCPUs");
    if (d.module) line("  guest module: protocol " + std::to_string(d.module_version) + ", kernel " + d.module_release);
    else line("  guest module: " + d.module_problem);
    for (const ChannelCheck& c : d.channels)
      line(std::string("  ") + channel_kind_name(c.kind) + ": " + (c.available ? "yes" : "no") + " - " + c.detail);
    line(std::string("  auto picks: ") + (d.auto_choice ? channel_kind_name(*d.auto_choice) : "nothing (see above)"));
  }
  return out;
}

}  // namespace xenprobes
