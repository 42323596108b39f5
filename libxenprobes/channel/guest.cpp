// The guest channel: attach and detach, the trap and return tables, the reports (its hits are
// in guest_hits.cpp).
#include "channel/guest.hpp"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "channel/eligibility.hpp"
#include "channel/guest_internal.hpp"
#include "common/hex.hpp"
#include "common/log.hpp"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"
#include "guestmod/module_info.hpp"
#include "xp_logic.h"  // the guest module's own decoder (guest-module/, linked into xp_common)

namespace xenprobes::channel {
namespace {

struct Range {
  const char* what;
  std::uint64_t first, end;  // [first, end)
};

// "ff 24 fd 00 10 00 81": a trap entry's original bytes, for messages.
std::string insn_bytes(const TrapEntry& t) {
  std::string s;
  char b[4];
  for (unsigned i = 0; i < t.len && i < sizeof t.insn; ++i) {
    std::snprintf(b, sizeof b, "%s%02x", i ? " " : "", t.insn[i]);
    s += b;
  }
  return s;
}

// Whether the module's EMULATE fallback can run `t`'s instruction: decided by the module's own
// decoder (xp_decode_branch, the function its hook calls), so the two can never disagree. A
// module older than that decoder's register forms (register_branches false: it publishes no
// module-text, which came with them) cannot run `jmp/call *%reg` either. The refusal says what
// the module cannot do and what works instead.
Result<void> module_can_emulate(DomId dom, const TrapEntry& t, bool register_branches) {
  xp_branch br;
  const std::string what = dom_str(dom) + ": trap at " + hex(t.addr.value) + " (" + insn_bytes(t) + "): ";
  // The fallback runs whenever Dom0 does not answer: Dom0 killed, detach, a timeout, a hit
  // nested in the module's hook. One the module cannot run leaves it only die("int3").
  const std::string why =
      "; use the vmevent or debugger channel (the module emulates the instruction itself whenever Dom0 does not "
      "answer a hit, e.g. once Dom0 is gone, and would oops the guest on one it cannot emulate)";
  if (xp_decode_branch(t.insn, t.len, &br)) {
    if (register_branches || (br.kind != XP_BR_CALL_REG && br.kind != XP_BR_JMP_REG)) return {};
    return fail(Errc::NotSupported, what +
                                        "the guest module is too old to emulate a jmp/call through a register (it "
                                        "publishes no " XENPROBES_XS_MODULE_TEXT_START
                                        "); install the current "
                                        "xenprobesU in the guest, or" +
                                        why.substr(1));
  }
  if (xp_is_mem_indirect_branch(t.insn, t.len))
    return fail(Errc::NotSupported, what + "the guest module's fallback cannot emulate a memory-indirect branch" + why);
  return fail(Errc::NotSupported,
              what +
                  "the guest module's fallback cannot emulate this instruction (it emulates relative jmp/jcc/call/"
                  "loop/jrcxz, jmp/call through a register and near ret, with no 66 prefix and 67 only on jrcxz)" +
                  why);
}

}  // namespace

GuestChannel::~GuestChannel() {
  // A process going away lets go of the areas, then of the port (protocol.h "Letting go"); a
  // killed one (abandon(), the tests' stand-in) says nothing: its port and mappings just go.
  for (auto& [dom, a] : domains_) {
    if (!abandoned_) release(a);
    best_effort(hv_.evtchn_unbind(a.port), "guest channel: unbinding a port");
  }
}

void GuestChannel::release(Attached& a) {
  if (!a.map) return;
  // Every write of ours to the area came before this one; the full barrier orders them, and
  // this store before the unbind that follows (protocol.h "Letting go").
  std::atomic_thread_fence(std::memory_order_seq_cst);
  store<std::uint32_t>(a.map.data() + offsetof(xenprobes_ctl_header, dom0_hold), XENPROBES_DOM0_RELEASED,
                       std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  a.map.reset();  // nothing left to write with
}

Result<void> GuestChannel::hold(DomId dom, const hv::ForeignMapping& map, const guestmod::GuestChannelInfo& gc) {
  const std::string ds = dom_str(dom);
  XP_TRY(hv_.pause(dom));
  auto why = [&]() -> std::optional<std::string> {
    auto st = hv_.xs_read(guestmod::module_key(dom, XENPROBES_XS_STATE));
    if (!st || *st != XENPROBES_XS_STATE_READY) return "it no longer says " XENPROBES_XS_STATE " = ready";
    auto now = hv_.xs_read(guestmod::module_key(dom, XENPROBES_XS_CONTROL_ADDR));
    if (!now || guestmod::parse_hex(*now) != gc.control.value)
      return "its control area moved (the module was loaded anew)";
    if (load<std::uint64_t>(map.data() + offsetof(xenprobes_ctl_header, closing)) != 0)
      return "its control area says closing";
    return std::nullopt;
  }();
  if (!why)
    store<std::uint32_t>(map.data() + offsetof(xenprobes_ctl_header, dom0_hold), XENPROBES_DOM0_MAPPED,
                         std::memory_order_seq_cst);
  auto u = hv_.unpause(dom);
  if (why)
    return fail(Errc::Busy, ds + ": the guest module is detaching (" + *why +
                                "): nothing was written; attach again once it is loaded and published anew");
  return u;
}

GuestChannel::Attached* GuestChannel::find(DomId dom) {
  auto it = domains_.find(dom);
  return it == domains_.end() ? nullptr : &it->second;
}

const GuestChannel::Attached* GuestChannel::find(DomId dom) const {
  auto it = domains_.find(dom);
  return it == domains_.end() ? nullptr : &it->second;
}

Result<void> GuestChannel::attach(DomId dom) {
  if (domains_.contains(dom)) return {};
  const std::string ds = dom_str(dom);
  hv::DomainInfo info = XP_TRY(hv_.domain_info(dom));
  XP_TRY(guest_domain_eligible(info));

  // The module's keys, through the guest's own page tables (vCPU 0's, as the engine does).
  mem::HypervisorFrameSource source(hv_, dom);
  mem::GuestMemory memory(source);
  hv::VcpuRegs r0 = XP_TRY(hv_.get_vcpu_regs(dom, VcpuId{0}));
  memory.set_context(XP_TRY(mem::paging_context(info, r0)));
  auto mi = guestmod::read_module_info(hv_, dom, guestmod::check_mapped_via(memory));
  if (!mi) {
    Error e = mi.error();
    e.what = "the guest channel needs the guest module: " + e.what;
    return std::unexpected(e);
  }
  guestmod::GuestChannelInfo gc = XP_TRY(guestmod::read_guest_channel_info(hv_, dom, *mi));
  const std::string where = ds + ": the guest module's control area at " + hex(gc.control.value);

  // Translate every page; each must be mapped writable by the guest, and no frame twice
  // (aliased pages would let one table's writes land in another).
  std::vector<Frame> frames;
  for (unsigned p = 0; p < gc.pages; ++p) {
    const Gva va{gc.control.value + std::uint64_t{p} * kPageSize};
    auto t = memory.translate(va);
    if (!t) return fail(Errc::Fault, where + ": page " + hex(va.value) + " is not mapped: " + t.error().what);
    if (!t->writable) return fail(Errc::Fault, where + ": page " + hex(va.value) + " is mapped read-only");
    if (std::find(frames.begin(), frames.end(), t->frame()) != frames.end())
      return fail(Errc::InvalidArgument, where + ": page " + hex(va.value) + " maps a frame of the area twice");
    frames.push_back(t->frame());
  }
  hv::ForeignMapping map = XP_TRY(hv_.map_frames(dom, frames, hv::MapAccess::ReadWrite));
  if (map.pages() != gc.pages) return fail(Errc::Io, where + ": mapped " + std::to_string(map.pages()) + " pages");

  // The header, read once.
  xenprobes_ctl_header h;
  std::memcpy(&h, map.data(), sizeof h);
  auto bad = [&](const std::string& why) { return fail(Errc::InvalidArgument, where + ": " + why); };
  if (h.magic != XENPROBES_CTL_MAGIC)
    return bad("magic " + hex(h.magic) + " is not " + hex(XENPROBES_CTL_MAGIC) + " (not a control area)");
  if (h.version != XENPROBES_PROTOCOL_VERSION)
    return bad("header version " + std::to_string(h.version) + ", this library speaks " +
               std::to_string(XENPROBES_PROTOCOL_VERSION));
  if (h.nr_mailboxes != info.vcpus)
    return bad(std::to_string(h.nr_mailboxes) + " mailboxes for " + std::to_string(info.vcpus) + " vCPUs");
  if (h.trap_capacity == 0) return bad("a trap table of 0 entries");
  const std::uint64_t size = map.pages() * kPageSize;
  const Range ranges[] = {
      {"the header", 0, sizeof h},
      {"the mailboxes", h.mailbox_offset, h.mailbox_offset + std::uint64_t{h.nr_mailboxes} * sizeof(xenprobes_mailbox)},
      {"the trap table", h.trap_offset, h.trap_offset + std::uint64_t{h.trap_capacity} * sizeof(xenprobes_trap)},
      {"the return table", h.ret_offset, h.ret_offset + std::uint64_t{h.ret_capacity} * sizeof(xenprobes_ret)},
  };
  for (std::size_t i = 1; i < std::size(ranges); ++i) {
    const Range& r = ranges[i];
    // Naturally aligned fields: atomic accesses, no torn reads.
    if (r.first % 8)
      return bad(std::string(r.what) + " at offset " + std::to_string(r.first) + " is not 8-byte aligned");
    if (r.end > size)
      return bad(std::string(r.what) + " [" + std::to_string(r.first) + ", " + std::to_string(r.end) +
                 ") do not fit in " + std::to_string(gc.pages) + " pages");
    for (std::size_t j = 0; j < i; ++j) {
      const Range& o = ranges[j];
      if (r.first < r.end && o.first < o.end && r.first < o.end && o.first < r.end)
        return bad(std::string(r.what) + " overlap " + o.what);
    }
  }
  if (h.dom0_gone)
    return fail(Errc::Busy, ds + ": the guest module gave up on Dom0 earlier (dom0_gone: after " +
                                std::to_string(XENPROBES_DEAD_AFTER) +
                                " unanswered hits it restored the text) and hands no hits over any more: "
                                "reload xenprobesU in the guest");
  if (h.nr_traps != 0)
    return fail(Errc::Busy, ds + ": the guest module's trap table still lists " + std::to_string(h.nr_traps) +
                                " traps of another Dom0 session (still attached, or gone without detaching; "
                                "the module restores their bytes itself after " +
                                std::to_string(XENPROBES_DEAD_AFTER) + " unanswered hits)");

  auto port = hv_.evtchn_bind_interdomain(dom, gc.evtchn);
  if (!port) {
    if (port.error().code == Errc::Busy)
      return fail(Errc::Busy, ds + ": the guest module's event channel (port " + std::to_string(gc.evtchn) +
                                  ") is bound by another Dom0 process: one guest channel per domain");
    return fail(port.error().code, ds + ": binding the guest module's event channel (port " +
                                       std::to_string(gc.evtchn) + "): " + port.error().what);
  }

  // Our first write, with the domain paused and only if the module is not leaving: from here
  // on the module frees nothing before we let go (protocol.h "Letting go").
  if (auto held = hold(dom, map, gc); !held) {
    best_effort(hv_.evtchn_unbind(*port), "guest channel: unbinding the port of an attach refused");
    return std::unexpected(held.error());
  }

  Attached a;
  a.map = std::move(map);
  a.layout = Layout{h.nr_mailboxes, h.mailbox_offset, h.trap_capacity, h.trap_offset, h.ret_capacity, h.ret_offset};
  a.port = *port;
  a.oea = mi->areas;
  a.register_branches = mi->has_module_text();
  a.jump_entry = mi->jump_entry;
  a.ret_write = (gc.features & XENPROBES_FEATURE_RET_WRITE) != 0;
  a.islands = a.jump_entry && (gc.features & XENPROBES_FEATURE_JUMP_ISLAND) != 0;
  a.rets.assign(h.ret_capacity, xenprobes_ret{0, 0});
  a.answered.assign(h.nr_mailboxes, std::nullopt);
  a.answered_rip.assign(h.nr_mailboxes, 0);
  a.rejected.assign(h.nr_mailboxes, std::nullopt);
  a.claimed.assign(h.nr_mailboxes, std::nullopt);
  a.overwritten.assign(h.nr_mailboxes, Attached::SeqRange{});
  // The return table is ours from now on: start it empty, as our copy is.
  for (std::size_t i = 0; i < a.rets.size(); ++i) write_ret(a, i);
  // Not polling (a session killed while it polled leaves the flag set: the module would skip
  // every hit's notification and each hit would wait out its timeout).
  store<std::uint32_t>(a.map.data() + offsetof(xenprobes_ctl_header, dom0_polling), 0u);
  domains_.emplace(dom, std::move(a));
  XP_LOG(Debug, "%s: guest channel attached (control area %s, %u pages, port %u)", ds.c_str(),
         hex(gc.control.value).c_str(), gc.pages, gc.evtchn);
  return {};
}

Result<void> GuestChannel::detach(DomId dom) {
  auto it = domains_.find(dom);
  if (it == domains_.end()) return {};
  Attached& a = it->second;
  // A module that removed `state` or set closing is leaving and restores everything itself
  // (protocol.h "Detaching"): no write to the tables then, only our release. (The engine,
  // which forgot the domain before this, no longer maps its rings or writes its OEA.)
  auto st = hv_.xs_read(guestmod::module_key(dom, XENPROBES_XS_STATE));
  const bool leaving = load<std::uint64_t>(a.map.data() + offsetof(xenprobes_ctl_header, closing)) != 0;
  if (st && *st == XENPROBES_XS_STATE_READY && !leaving) {
    store<std::uint32_t>(a.map.data() + offsetof(xenprobes_ctl_header, dom0_polling), 0u);
    // Count first: from then on the module sees no entry, whatever the entries still hold.
    set_nr_traps(a, 0);
    const std::size_t n = a.traps.size();
    a.traps.clear();
    for (std::size_t i = 0; i < n; ++i) write_trap(a, i);  // zeroes
    std::fill(a.rets.begin(), a.rets.end(), xenprobes_ret{0, 0});
    for (std::size_t i = 0; i < a.rets.size(); ++i) write_ret(a, i);
    // Detached from inside a handler: nobody will answer the hit it runs for. Given back, it
    // is resumed by the module's timeout instead of waiting out the claim bound.
    bool gave_back = false;
    for (std::uint32_t v = 0; v < a.layout.nr_mailboxes; ++v) {
      if (!a.claimed[v]) continue;
      std::byte* mb = mailbox_at(a, v);
      std::uint32_t expected = XENPROBES_MBOX_CLAIMED;
      if (load<std::uint32_t>(mb + offsetof(xenprobes_mailbox, seq)) == a.claimed[v]->seq)
        gave_back |= state_of(mb).compare_exchange_strong(expected, XENPROBES_MBOX_HIT, std::memory_order_release,
                                                          std::memory_order_relaxed);
    }
    // Without the event the module finds the hits at its next poll slice.
    if (gave_back) best_effort(hv_.evtchn_notify(a.port), "guest channel: notifying the hits given back");
  }
  release(a);  // last: the module may free the area from now on
  auto r = hv_.evtchn_unbind(a.port);
  domains_.erase(it);
  if (!r && r.error().code != Errc::NoSuchDomain) return r;
  return {};
}

std::byte* GuestChannel::mailbox_at(const Attached& a, std::uint32_t v) {
  return a.map.data() + a.layout.mailbox_offset + std::size_t{v} * sizeof(xenprobes_mailbox);
}

// ---- tables --------------------------------------------------------------------------

void GuestChannel::write_trap(Attached& a, std::size_t i) {
  if (i >= a.layout.trap_capacity) return;
  xenprobes_trap e = i < a.traps.size() ? a.traps[i] : xenprobes_trap{};
  std::memcpy(a.map.data() + a.layout.trap_offset + i * sizeof e, &e, sizeof e);
}

void GuestChannel::write_ret(Attached& a, std::size_t i) {
  if (i >= a.layout.ret_capacity || i >= a.rets.size()) return;
  std::byte* p = a.map.data() + a.layout.ret_offset + i * sizeof(xenprobes_ret);
  // ret before slot: the module matches on slot, then takes ret.
  store<std::uint64_t>(p + offsetof(xenprobes_ret, ret), a.rets[i].ret);
  store<std::uint64_t>(p + offsetof(xenprobes_ret, slot), a.rets[i].slot, std::memory_order_release);
}

void GuestChannel::set_nr_traps(Attached& a, std::size_t n) {
  store<std::uint32_t>(a.map.data() + offsetof(xenprobes_ctl_header, nr_traps), static_cast<std::uint32_t>(n),
                       std::memory_order_release);
}

bool GuestChannel::in_oea(DomId dom, Attached& a, Gva addr) {
  auto known = [&] {
    return std::any_of(a.oea.begin(), a.oea.end(), [&](const guestmod::OeaArea& o) { return o.contains(addr); });
  };
  if (known()) return true;
  // Only the bounds matter here (the engine checked the pages when it took the area).
  auto mi = guestmod::read_module_info(hv_, dom, [](Gva) -> Result<void> { return {}; });
  if (!mi) return false;
  a.oea = mi->areas;
  return known();
}

Result<void> GuestChannel::trap_added(DomId dom, const TrapEntry& t) {
  Attached* a = find(dom);
  if (!a) return fail(Errc::InvalidArgument, dom_str(dom) + " is not attached to the guest channel");
  // protocol.h "Detaching": the module's restore pass may have read the table already, so a
  // trap added now would outlive the module. The domain is paused (Patcher): this look and
  // the writes that follow are one step for the guest.
  if (load<std::uint64_t>(a->map.data() + offsetof(xenprobes_ctl_header, closing)) != 0)
    return fail(Errc::Busy, dom_str(dom) +
                                ": the guest module is detaching (its control area says closing): no "
                                "trap is added, nothing was written; register again once it is loaded "
                                "and published anew");
  if (t.len > sizeof t.insn)
    return fail(Errc::InvalidArgument,
                "trap at " + hex(t.addr.value) + ": " + std::to_string(t.len) + " original bytes (at most 15)");
  // The bytes are what the module emulates, and insn[0] is what it writes back at a trap
  // outside its OEA once Dom0 is gone: only a trap in a slot (never restored) may go without.
  const bool jump = t.fallback == TrapEntry::Fallback::Jump || t.fallback == TrapEntry::Fallback::AsyncJump;
  if ((jump || t.fallback == TrapEntry::Fallback::Redirect) && !a->jump_entry)
    return fail(Errc::NotSupported, dom_str(dom) +
                                        ": the guest module publishes no jump entry: it makes no jump "
                                        "probes (install the current xenprobesU in the guest)");
  if (jump && (t.len != 0 || !in_oea(dom, *a, t.addr)))
    return fail(Errc::InvalidArgument, "jump entry key " + hex(t.addr.value) +
                                           ": must be a detour's call inside the out-of-line execution area, "
                                           "with no original bytes");
  if (t.fallback == TrapEntry::Fallback::Island && !a->islands)
    return fail(Errc::NotSupported, dom_str(dom) +
                                        ": the guest module does not publish the jump-island feature: it "
                                        "makes no short jumps (install the current xenprobesU in the guest)");
  const unsigned region_min = a->islands ? 2 : 5;  // a short region (eb rel8) only on a module that knows it
  if (t.fallback == TrapEntry::Fallback::Redirect && (t.len < region_min || in_oea(dom, *a, t.addr)))
    return fail(Errc::InvalidArgument, "jump region at " + hex(t.addr.value) + ": needs its " +
                                           std::to_string(region_min) +
                                           "..15 original bytes and lies outside the out-of-line execution area");
  if (t.fallback == TrapEntry::Fallback::Island && (t.len != 5 || in_oea(dom, *a, t.addr)))
    return fail(Errc::InvalidArgument, "island at " + hex(t.addr.value) +
                                           ": needs its 5 original bytes and lies outside the out-of-line "
                                           "execution area");
  if (t.len == 0 && (t.fallback == TrapEntry::Fallback::Emulate || !in_oea(dom, *a, t.addr)))
    return fail(Errc::InvalidArgument, "trap at " + hex(t.addr.value) +
                                           ": no original bytes (needed to emulate it, and to restore "
                                           "a trap outside the out-of-line execution area)");
  if (t.fallback == TrapEntry::Fallback::Emulate) XP_TRY(module_can_emulate(dom, t, a->register_branches));
  xenprobes_trap e{};
  e.addr = t.addr.value;
  switch (t.fallback) {
    case TrapEntry::Fallback::ResumeAt:
      if (!t.resume_at.value)
        return fail(Errc::InvalidArgument, "trap at " + hex(t.addr.value) + ": resume-at fallback without an address");
      e.flags = XENPROBES_TRAP_FALLBACK;
      e.fallback = t.resume_at.value;
      break;
    case TrapEntry::Fallback::Emulate: e.flags = XENPROBES_TRAP_EMULATE; break;
    case TrapEntry::Fallback::Return: e.flags = XENPROBES_TRAP_RETURN; break;
    case TrapEntry::Fallback::Jump:
    case TrapEntry::Fallback::AsyncJump:
    case TrapEntry::Fallback::Redirect:
    case TrapEntry::Fallback::Island:
      if (!t.resume_at.value)
        return fail(Errc::InvalidArgument, "trap at " + hex(t.addr.value) + ": a jump entry without its address");
      e.flags = t.fallback == TrapEntry::Fallback::Redirect ? XENPROBES_TRAP_REDIRECT
                : t.fallback == TrapEntry::Fallback::Island ? XENPROBES_TRAP_ISLAND
                : t.fallback == TrapEntry::Fallback::Jump   ? XENPROBES_TRAP_JUMP
                                                            : XENPROBES_TRAP_JUMP | XENPROBES_TRAP_ASYNC;
      e.fallback = t.resume_at.value;
      break;
  }
  e.len = t.len;
  e.module = t.module;
  // An async key's bytes are its record key, not original bytes (len stays 0).
  std::memcpy(e.insn, t.insn, t.fallback == TrapEntry::Fallback::AsyncJump ? sizeof e.insn : t.len);

  auto pos = lower_bound(a->traps, e.addr);
  const auto i = static_cast<std::size_t>(pos - a->traps.begin());
  if (pos != a->traps.end() && pos->addr == e.addr) {  // re-armed or changed: in place
    *pos = e;
    write_trap(*a, i);
    return {};
  }
  if (a->traps.size() >= a->layout.trap_capacity)
    return fail(Errc::NoSpace, dom_str(dom) + ": the guest module's trap table is full (" +
                                   std::to_string(a->layout.trap_capacity) +
                                   " entries: one per armed probe point and per slot with a trap): remove "
                                   "probes, or load xenprobesU with a larger table");
  a->traps.insert(pos, e);
  // The domain is paused, so the module does not search meanwhile. Were it searching, the
  // order keeps every old entry findable: the new last entry and the count first, then the
  // rest downwards (an entry may be seen twice, never not at all).
  const std::size_t n = a->traps.size();
  write_trap(*a, n - 1);
  set_nr_traps(*a, n);
  for (std::size_t k = n - 1; k-- > i;) write_trap(*a, k);
  return {};
}

void GuestChannel::trap_removed(DomId dom, Gva addr) {
  Attached* a = find(dom);
  if (!a) return;
  auto pos = find_trap(a->traps, addr.value);
  if (pos == a->traps.end()) return;
  const auto i = static_cast<std::size_t>(pos - a->traps.begin());
  retire(*a, *pos);
  a->traps.erase(pos);
  // Upwards, then the count, then clear the old last entry (see trap_added).
  const std::size_t n = a->traps.size();
  for (std::size_t k = i; k < n; ++k) write_trap(*a, k);
  set_nr_traps(*a, n);
  write_trap(*a, n);
}

void GuestChannel::retire(Attached& a, const xenprobes_trap& e) {
  // A trap byte in text (the engine restores it before the entry goes); not a slot's trap in
  // the OEA, whose slot may be reused, nor a jump's key or redirect (never a mailbox hit of
  // their own address). Areas Dom0 has not seen hold no trap of Dom0's: no re-read.
  if ((e.flags != XENPROBES_TRAP_FALLBACK && e.flags != XENPROBES_TRAP_EMULATE) || e.len == 0 ||
      std::any_of(a.oea.begin(), a.oea.end(), [&](const guestmod::OeaArea& o) { return o.contains(Gva{e.addr}); }))
    return;
  a.retired_order.push_back(e.addr);
  ++a.retired[e.addr];
  while (a.retired_order.size() > kRetiredTraps) {
    auto it = a.retired.find(a.retired_order.front());
    if (--it->second == 0) a.retired.erase(it);
    a.retired_order.pop_front();
  }
}

Result<void> GuestChannel::return_added(DomId dom, Gva stack_slot, Gva ret) {
  Attached* a = find(dom);
  if (!a) return fail(Errc::InvalidArgument, dom_str(dom) + " is not attached to the guest channel");
  if (!stack_slot.value)
    return fail(Errc::InvalidArgument, "a return-table entry for stack slot 0 (0 marks a free entry)");
  std::optional<std::size_t> free;
  for (std::size_t i = 0; i < a->rets.size(); ++i) {
    if (a->rets[i].slot == stack_slot.value) {
      a->rets[i].ret = ret.value;
      write_ret(*a, i);
      return {};
    }
    if (!free && a->rets[i].slot == 0) free = i;
  }
  if (!free)
    return fail(Errc::NoSpace, dom_str(dom) + ": the guest module's return table is full (" +
                                   std::to_string(a->layout.ret_capacity) +
                                   " live return-probe instances): lower maxactive, or load xenprobesU with "
                                   "a larger table");
  a->rets[*free] = xenprobes_ret{stack_slot.value, ret.value};
  write_ret(*a, *free);
  return {};
}

void GuestChannel::return_removed(DomId dom, Gva stack_slot) {
  Attached* a = find(dom);
  if (!a || !stack_slot.value) return;
  for (std::size_t i = 0; i < a->rets.size(); ++i) {
    if (a->rets[i].slot != stack_slot.value) continue;
    a->rets[i] = xenprobes_ret{0, 0};
    write_ret(*a, i);
    return;
  }
}

// ---- reports -------------------------------------------------------------------------

Result<GuestChannel::ModuleCounters> GuestChannel::module_counters(DomId dom) const {
  const Attached* a = find(dom);
  if (!a) return fail(Errc::InvalidArgument, dom_str(dom) + " is not attached to the guest channel");
  const std::byte* h = a->map.data();
  ModuleCounters c;
  c.hits = load<std::uint64_t>(h + offsetof(xenprobes_ctl_header, hits));
  c.timeouts = load<std::uint64_t>(h + offsetof(xenprobes_ctl_header, timeouts));
  c.foreign = load<std::uint64_t>(h + offsetof(xenprobes_ctl_header, foreign));
  c.nested = load<std::uint64_t>(h + offsetof(xenprobes_ctl_header, nested));
  c.async_bad = load<std::uint64_t>(h + offsetof(xenprobes_ctl_header, async_bad));
  c.notify_skipped = load<std::uint64_t>(h + offsetof(xenprobes_ctl_header, notify_skipped));
  c.wait_ns = load<std::uint64_t>(h + offsetof(xenprobes_ctl_header, wait_ns));
  c.wait_max_ns = load<std::uint64_t>(h + offsetof(xenprobes_ctl_header, wait_max_ns));
  c.over_budget = load<std::uint64_t>(h + offsetof(xenprobes_ctl_header, over_budget));
  c.ret_refused = load<std::uint32_t>(h + offsetof(xenprobes_ctl_header, ret_refused));
  c.dom0_gone = load<std::uint32_t>(h + offsetof(xenprobes_ctl_header, dom0_gone)) != 0;
  return c;
}

void GuestChannel::set_polling(bool on) {
  for (auto& [dom, a] : domains_)
    store<std::uint32_t>(a.map.data() + offsetof(xenprobes_ctl_header, dom0_polling), on ? 1u : 0u);
  // The store before any later look at a mailbox (protocol.h "Spinning").
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

GuestChannel::Stats GuestChannel::stats(DomId dom) const {
  const Attached* a = find(dom);
  return a ? a->stats : Stats{};
}

std::size_t GuestChannel::traps(DomId dom) const {
  const Attached* a = find(dom);
  return a ? a->traps.size() : 0;
}

}  // namespace xenprobes::channel
