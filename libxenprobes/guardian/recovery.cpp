#include "guardian/recovery.hpp"

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <optional>

#include "common/hex.hpp"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"

namespace xenprobes::guardian {
namespace {

class Account {
 public:
  Account(RecoveryReport& r, const RecoveryLog& sink) : r_(r), sink_(sink) {}
  [[gnu::format(printf, 3, 4)]] void say(log::Level l, const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (l >= log::level()) log::write(l, "%s", buf);
    if (sink_) sink_(l, buf);
  }
  // A step that failed: logged, counted, and the rest goes on.
  void failed(DomId d, const char* step, const Error& e) {
    r_.failures++;
    say(log::Level::Error, "domain %u: %s failed: %s", d.value, step, e.what.c_str());
  }

 private:
  RecoveryReport& r_;
  const RecoveryLog& sink_;
};

bool gone(const Error& e) { return e.code == Errc::NoSuchDomain; }

// 8-4-4-4-12 hex digits, as xl prints a domain's UUID.
// Why the module a patch's text belongs to is not the one the journal names (nullopt: it is):
// its struct module unreadable, its name no longer a NUL-terminated string, or the hash of name
// and text base different. The guest's bytes are hostile: bounded reads, nothing trusted.
std::optional<std::string> module_changed(mem::GuestMemory& memory, const JournalModule& m) {
  std::array<char, kJournalModuleNameMax> name{};
  if (!memory.read(m.address + m.name_off, std::as_writable_bytes(std::span(name))))
    return "its struct module at " + hex(m.address.value) + " cannot be read";
  const auto nul = std::find(name.begin(), name.end(), '\0');
  if (nul == name.begin() || nul == name.end()) return "no module name at " + hex(m.address.value);
  auto base = memory.read_u64(m.address + m.base_off);
  if (!base) return "its struct module at " + hex(m.address.value) + " cannot be read";
  if (module_hash(std::string_view(name.data(), static_cast<std::size_t>(nul - name.begin())), *base) != m.hash)
    return "the struct module at " + hex(m.address.value) + " is now another module's, or none";
  return std::nullopt;
}

std::string uuid(const hv::DomainHandle& h) {
  char s[40];
  std::snprintf(s, sizeof s, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", h[0], h[1], h[2],
                h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]);
  return s;
}

void recover_domain(hv::Hypervisor& hv, const JournalSnapshot& s, const JournalSnapshot::Domain& jd,
                    RecoveryReport& rep, Account& acc) {
  const DomId dom = jd.domid;
  const bool debugger = jd.channel == JournalChannel::Debugger;
  auto info = hv.domain_info(dom);
  if (!info || info->dying) {
    rep.gone++;
    acc.say(log::Level::Warn, "domain %u: %s; skipped", dom.value, info ? "dying" : "gone");
    return;
  }
  if (info->handle != jd.handle) {
    // The journaled domain is gone and another one was given its domid: nothing of ours is
    // in it, and pausing it, moving its vCPUs or turning its debugger/monitor off would
    // only harm it (or another tool using it).
    rep.reused++;
    acc.say(log::Level::Error,
            "domain %u: refusing to recover: its handle is %s, the journal's is %s (the journaled domain is gone "
            "and its domid was reused); not touched",
            dom.value, uuid(info->handle).c_str(), uuid(jd.handle).c_str());
    return;
  }
  rep.domains++;
  const unsigned vcpus = std::min(info->vcpus, 4096u);
  auto own = hv.pause(dom);
  if (!own) {
    if (gone(own.error())) {
      rep.gone++;
      acc.say(log::Level::Warn, "domain %u: gone; skipped", dom.value);
      return;
    }
    acc.failed(dom, "pausing it", own.error());  // go on: undoing beats leaving it as it is
  }

  std::vector<const JournalSnapshot::Patch*> patches;
  std::map<std::uint64_t, const JournalSnapshot::Patch*> traps;  // by trap address
  for (const auto& p : s.patches)
    if (p.domid == dom) {
      patches.push_back(&p);
      traps[p.gva.value] = &p;
    }
  std::map<std::uint64_t, const JournalSnapshot::Return*> returns;  // by stack slot
  for (const auto& r : s.returns)
    if (r.domid == dom) returns[r.slot.value] = &r;

  // ---- vCPUs: the debugger channel's stops first (rip == trap + 1), before anything moves.
  unsigned stops = 0;
  for (unsigned v = 0; v < vcpus; ++v) {
    auto regs = hv.get_vcpu_regs(dom, VcpuId{v});
    if (!regs) {
      acc.failed(dom, ("reading vCPU " + std::to_string(v)).c_str(), regs.error());
      continue;
    }
    hv::VcpuRegs r = *regs;
    const JournalSnapshot::Patch* at = nullptr;
    bool stopped = false;
    if (auto it = traps.find(r.rip - 1); debugger && r.rip != 0 && it != traps.end()) {
      at = it->second;  // executed our ICEBP: the domain holds a pause for it
      stopped = true;
    } else if (auto it2 = traps.find(r.rip); it2 != traps.end()) {
      at = it2->second;  // standing on it (vmevent stops, or about to execute it)
    }
    if (!at) continue;
    std::optional<std::uint64_t> to;
    switch (at->kind) {
      case PatchKind::Text:
        if (stopped) to = at->gva.value;  // re-executes the original instruction, put back below
        break;
      case PatchKind::SlotTrap:
        to = at->resume.value;  // the instruction after the probed one, in the kernel's text
        break;
      case PatchKind::Trampoline:
        if (auto rt = returns.find(r.rsp - 8); rt != returns.end()) {
          to = rt->second->ret;  // the function's ret popped the trampoline from rsp - 8
        } else {
          rep.failures++;
          acc.say(log::Level::Error,
                  "domain %u vCPU %u: on the return trampoline %s with rsp %s, and no journaled call returns "
                  "from there: left as it is",
                  dom.value, v, hex(at->gva.value).c_str(), hex(r.rsp).c_str());
        }
        break;
    }
    if (stopped) stops++;
    if (!to || *to == r.rip) continue;
    std::uint64_t from = r.rip;
    r.rip = *to;
    if (auto w = hv.set_vcpu_regs(dom, VcpuId{v}, r); !w) {
      acc.failed(dom, ("moving vCPU " + std::to_string(v)).c_str(), w.error());
      continue;
    }
    rep.vcpus_moved++;
    acc.say(log::Level::Warn, "domain %u vCPU %u: moved from %s to %s", dom.value, v, hex(from).c_str(),
            hex(*to).c_str());
  }
  // The guest's own int3s under debugging mode (a gdbsx record each, no VIRQ): rewound onto
  // the int3, as the channel does; with debugging mode off the guest takes its own #BP.
  if (debugger) {
    for (unsigned k = 0; k < 2 * vcpus + 8; ++k) {
      auto st = hv.gdbsx_domstatus(dom);
      if (!st) {
        if (st.error().code != Errc::NoSys) acc.failed(dom, "reading gdbsx records", st.error());
        break;
      }
      if (!st->vcpu) break;
      if (*st->vcpu >= vcpus) continue;
      auto regs = hv.get_vcpu_regs(dom, VcpuId{*st->vcpu});
      if (!regs) {
        acc.failed(dom, "reading a vCPU with a guest breakpoint", regs.error());
        continue;
      }
      regs->rip -= 1;
      if (auto w = hv.set_vcpu_regs(dom, VcpuId{*st->vcpu}, *regs); !w)
        acc.failed(dom, "rewinding a vCPU onto its own int3", w.error());
      stops++;
      acc.say(log::Level::Warn, "domain %u vCPU %u: stopped on the guest's own int3 at %s: rewound", dom.value,
              *st->vcpu, hex(regs->rip).c_str());
    }
  }

  // ---- memory: the patches, then the stacks.
  mem::HypervisorFrameSource source(hv, dom);
  mem::GuestMemoryOptions mo;
  mo.transient_data_writes = info->type == hv::GuestType::Pv;
  mem::GuestMemory memory(source, mo);
  bool memory_ok = false;
  if (auto r0 = hv.get_vcpu_regs(dom, VcpuId{0}); !r0) {
    acc.failed(dom, "reading vCPU 0 for its page tables", r0.error());
  } else if (auto ctx = mem::paging_context(*info, *r0); !ctx) {
    acc.failed(dom, "finding the paging mode", ctx.error());
  } else {
    // Through the kernel's page tables even when vCPU 0 runs a user task with page-table
    // isolation on (it holds the user half then, which maps no kernel text nor stacks).
    Gva kernel_addr{};
    for (const auto* p : patches)
      if (p->kind != PatchKind::Trampoline) {
        kernel_addr = p->gva;
        break;
      }
    if (!kernel_addr.value && !returns.empty()) kernel_addr = Gva{returns.begin()->first};  // a kernel stack
    if (auto k = mem::use_kernel_page_tables(memory, *ctx, info->type, kernel_addr); !k) {
      acc.failed(dom, "finding page tables that map the kernel", k.error());
    } else {
      memory_ok = true;
      if (*k) acc.say(log::Level::Info, "domain %u: vCPU 0 holds user page tables: their kernel half used", dom.value);
    }
  }
  if (memory_ok) {
    for (const auto* p : patches) {
      if (p->kind == PatchKind::Trampoline) continue;  // in the OEA area: nothing of the kernel's
      if (p->module) {
        if (auto why = module_changed(memory, *p->module)) {
          rep.left_alone++;
          acc.say(log::Level::Warn, "domain %u: %s is in the text of a module that is gone (%s): left alone", dom.value,
                  hex(p->gva.value).c_str(), why->c_str());
          continue;
        }
      }
      std::vector<std::uint8_t> now(p->written.size());
      if (auto r = memory.read(p->gva, std::as_writable_bytes(std::span(now))); !r) {
        acc.failed(dom, ("reading " + hex(p->gva.value)).c_str(), r.error());
        continue;
      }
      if (now == p->restore) {
        rep.already++;
        continue;
      }
      if (now != p->written) {
        rep.left_alone++;
        acc.say(log::Level::Warn, "domain %u: %s no longer holds what we wrote there: left alone", dom.value,
                hex(p->gva.value).c_str());
        continue;
      }
      if (auto w = memory.write(p->gva, std::as_bytes(std::span(p->restore))); !w) {
        acc.failed(dom, ("restoring " + hex(p->gva.value)).c_str(), w.error());
        continue;
      }
      rep.restored++;
      acc.say(log::Level::Info, "domain %u: %s %s restored", dom.value,
              p->kind == PatchKind::Text ? "text at" : "slot trap at", hex(p->gva.value).c_str());
    }
    for (const auto& [slot, r] : returns) {
      auto v = memory.read_u64(r->slot);
      if (!v) {
        acc.failed(dom, ("reading the stack slot " + hex(slot)).c_str(), v.error());
        continue;
      }
      if (*v != r->trampoline.value) continue;  // the call returned, or the frame is gone
      if (auto w = memory.write_u64_transient(r->slot, r->ret); !w) {
        acc.failed(dom, ("restoring the stack slot " + hex(slot)).c_str(), w.error());
        continue;
      }
      rep.returns_restored++;
      acc.say(log::Level::Info, "domain %u: return address %s put back at %s", dom.value, hex(r->ret).c_str(),
              hex(slot).c_str());
    }
  }

  // ---- the channel off.
  if (debugger) {
    if (auto r = hv.set_debugging(dom, false); !r) acc.failed(dom, "turning debugging mode off", r.error());
  } else {
    if (auto r = hv.monitor_recover(dom); !r) acc.failed(dom, "tearing down the vm_event monitor", r.error());
  }

  // ---- pauses: ours, then one per stop found, per stop the dead channel resumed without
  // releasing it, and the engine's own hold if it died holding one. Never below zero, and
  // never one more than the domain still holds (domain_info says whether it is paused).
  const unsigned unpaused_before = rep.unpaused;
  if (own) {
    if (auto u = hv.unpause(dom); u) rep.unpaused++;
    else acc.failed(dom, "releasing our pause", u.error());
  }
  unsigned extra = stops + jd.owed_unpauses + jd.held_pauses;
  for (unsigned k = 0; k < extra; ++k) {
    auto i = hv.domain_info(dom);
    if (!i || !i->paused) break;
    if (auto u = hv.unpause(dom); !u) {
      acc.failed(dom, "releasing a pause the dead process held", u.error());
      break;
    }
    rep.unpaused++;
  }
  acc.say(log::Level::Warn, "domain %u (%s channel): recovered: %u stops released, pauses released %u", dom.value,
          debugger ? "debugger" : "vmevent", stops, rep.unpaused - unpaused_before);
}

}  // namespace

RecoveryReport recover(hv::Hypervisor& hv, const JournalSnapshot& s, const RecoveryLog& sink) {
  RecoveryReport rep;
  Account acc(rep, sink);
  if (s.clean) return rep;
  if (s.torn || s.invalid)
    acc.say(log::Level::Warn, "journal: %u records caught mid-update and %u invalid ones ignored", s.torn, s.invalid);
  if (s.refused)
    acc.say(log::Level::Warn, "journal: %u records did not fit (their registrations were refused)", s.refused);
  for (const auto& d : s.domains) recover_domain(hv, s, d, rep, acc);
  return rep;
}

std::string describe_journal(const std::string& who, const JournalSnapshot& snap) {
  return who + " ended without cleaning up: recovering " + std::to_string(snap.domains.size()) + " domains (" +
         std::to_string(snap.patches.size()) + " patches, " + std::to_string(snap.returns.size()) +
         " return-probe calls in flight)";
}

std::string describe_report(const RecoveryReport& rep) {
  return "done: " + std::to_string(rep.domains) + " domains recovered, " + std::to_string(rep.gone) + " gone, " +
         std::to_string(rep.reused) + " refused (domid reused), " + std::to_string(rep.restored) +
         " patches restored, " + std::to_string(rep.left_alone) + " left alone (changed since), " +
         std::to_string(rep.vcpus_moved) + " vCPUs moved, " + std::to_string(rep.returns_restored) +
         " return addresses restored, " + std::to_string(rep.unpaused) + " pauses released, " +
         std::to_string(rep.failures) + " steps failed";
}

}  // namespace xenprobes::guardian
