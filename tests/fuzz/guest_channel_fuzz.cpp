// Fuzz target: the guest channel's control area and mailboxes (channel/guest.cpp, and
// channel/guest_hits.cpp for process() and flush()). The area is guest memory mapped writable
// into Dom0: its header, mailboxes and tables are hostile.
// A fake hypervisor holds a guest with real page tables, the module's keys and the area; the
// input picks the header (the module's layout, a mutation of it, or raw bytes), then a
// sequence of operations: the guest writing hits or noise into the area, the engine adding
// and removing traps and return entries, process()/flush() with handlers that change
// registers, detach from inside a handler, remove entries, or decline, and detach/re-attach.
//
// Invariants (beyond no crash, leak or UB):
//  - Dom0 writes only where the validated layout lets it (nr_traps, its tables, the
//    mailboxes), never outside the area (every other frame byte-identical), and nothing at
//    all when attach refuses or the module has withdrawn `state`;
//  - every stop handed to the engine is for a trap in the table or one the engine owns, on a
//    vCPU with a mailbox, with rip on the trap; each is answered exactly as the protocol says
//    (state DONE, answer_seq = seq, the handler's registers, cs/ss/seq/trap untouched);
//  - a mailbox whose hit was not handed over is not written;
//  - while the guest leaves the tables alone, the shared trap table is Dom0's sorted copy
//    followed by zeros, and the return table holds exactly the live return entries;
//  - an EMULATE entry is armed only when the module's own decoder accepts it;
//  - no port stays bound and no mapping stays alive once the channel is gone.
#include <cstddef>

#include "channel/event_ports.hpp"
#include "channel/guest.hpp"
#include "fuzz/fuzz_common.hpp"
#include "guestmod/module_info.hpp"
#include "xenprobes/protocol.h"
#include "xp_logic.h"

using namespace xenprobes;
using channel::GuestChannel;
using channel::TrapEntry;
using fuzz::FakeHv;
using fuzz::Input;

namespace {

constexpr DomId kDom{3};
constexpr std::uint64_t kText = 0xffffffff81000000ull;
constexpr std::uint64_t kOea = 0xffffffffa0000000ull, kOeaPages = 2;
constexpr std::uint64_t kCtl = 0xffffc90000100000ull;
constexpr std::uint64_t kTablesFrame = 0x1000, kCtlFrame = 0x2000, kOeaFrame = 0x3000;
constexpr std::uint64_t kTables = 8;  // the root, then 3 tables for each of the two mappings

struct Layout {
  std::uint32_t mb_off = 0, nr_mb = 0, trap_off = 0, trap_cap = 0, ret_off = 0, ret_cap = 0;
};

struct Harness;

struct Sink final : channel::StopSink {
  Harness* h = nullptr;
  std::set<std::uint64_t> owned;  // disarmed traps the "engine" still owns
  struct Seen {
    unsigned vcpu;
    std::uint64_t trap, rip;
    bool detached;
  };
  std::vector<Seen> seen;  // this round
  bool owns_trap(DomId, Gva a) const override;
  channel::Verdict on_stop(channel::Stop& s) override;
  void on_channel_failure(DomId, const Error&) override {}
};

struct Harness {
  Input in;
  FakeHv hv;
  std::byte* ctl = nullptr;
  std::size_t ctl_size = 0;
  std::unique_ptr<GuestChannel> ch;
  Sink sink;
  bool attached = false;
  Layout lay;                                     // the attached layout
  std::map<std::uint64_t, xenprobes_trap> traps;  // what Dom0 should have in its table
  std::map<std::uint64_t, std::uint64_t> rets;    // slot -> ret
  bool guest_touched_tables = false;
  bool register_branches = false;
  std::set<std::uint64_t> answered_rips;

  explicit Harness(const std::uint8_t* d, std::size_t n) : in(d, n) { sink.h = this; }

  std::uint64_t pick_addr() {
    switch (in.u8() % 6) {
      case 0: return in.u64();
      case 1: return kOea + in.range(0, kOeaPages * kPageSize - 1);
      case 2:
        if (!traps.empty()) {
          auto it = traps.begin();
          std::advance(it, in.range(0, traps.size() - 1));
          return it->first;
        }
        [[fallthrough]];
      case 3:
        if (!sink.owned.empty()) return *sink.owned.begin();
        [[fallthrough]];
      default: return kText + in.range(0, 0xff) * 0x10;
    }
  }

  TrapEntry entry() {
    TrapEntry e;
    e.addr = Gva{pick_addr()};
    const std::uint8_t k = in.u8();
    e.fallback = k % 3 == 0   ? TrapEntry::Fallback::ResumeAt
                 : k % 3 == 1 ? TrapEntry::Fallback::Emulate
                              : TrapEntry::Fallback::Return;
    e.resume_at = Gva{k & 0x80 ? 0 : kOea + in.range(0, kOeaPages * kPageSize - 1)};
    e.len = static_cast<std::uint8_t>(in.range(0, 16));
    static const std::uint8_t forms[][5] = {{0xc3},       {0xeb, 0x10},       {0xe8, 1, 2, 3, 4},
                                            {0xff, 0xe0}, {0xff, 0x24, 0x25}, {0x0f, 0x1f, 0x44, 0, 0}};
    const auto& f = forms[in.range(0, std::size(forms) - 1)];
    std::memcpy(e.insn, f, sizeof f);
    auto b = in.bytes(in.range(0, 15));
    std::memcpy(e.insn, b.data(), b.size());
    return e;
  }

  std::vector<std::uint8_t> area() const {
    return std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(ctl),
                                     reinterpret_cast<const std::uint8_t*>(ctl) + ctl_size);
  }
  template <typename T>
  T at(std::size_t off) const {
    T v;
    std::memcpy(&v, ctl + off, sizeof v);
    return v;
  }

  // Dom0's writes since `before`: only inside what the attached layout gives it.
  // `release_only`: nothing but header.dom0_hold, and that RELEASED (protocol.h "Letting go").
  void check_writes(const std::vector<std::uint8_t>& before, const char* op, bool none_allowed = false,
                    bool release_only = false) {
    if (std::memcmp(before.data(), ctl, ctl_size) == 0) return;
    const auto now = area();
    const std::size_t hold = offsetof(xenprobes_ctl_header, dom0_hold);
    for (std::size_t i = 0; i < ctl_size; ++i) {
      if (now[i] == before[i]) continue;
      if (release_only && i >= hold && i < hold + 4) {
        FUZZ_CHECK(at<std::uint32_t>(hold) == XENPROBES_DOM0_RELEASED, std::string(op) + ": dom0_hold is not RELEASED");
        continue;
      }
      FUZZ_CHECK(!none_allowed && !release_only,
                 std::string(op) + ": Dom0 wrote byte " + std::to_string(i) + " of the area");
      const bool ok =
          (i >= offsetof(xenprobes_ctl_header, nr_traps) && i < offsetof(xenprobes_ctl_header, nr_traps) + 4) ||
          // dom0_polling: Dom0's (protocol.h "Spinning"; cleared at attach and detach)
          (i >= offsetof(xenprobes_ctl_header, dom0_polling) && i < offsetof(xenprobes_ctl_header, dom0_polling) + 4) ||
          // dom0_hold: Dom0's (protocol.h "Letting go"; MAPPED at attach, RELEASED last at detach)
          (i >= hold && i < hold + 4) ||
          (i >= lay.mb_off && i < lay.mb_off + std::size_t{lay.nr_mb} * sizeof(xenprobes_mailbox)) ||
          (i >= lay.trap_off && i < lay.trap_off + std::size_t{lay.trap_cap} * sizeof(xenprobes_trap)) ||
          (i >= lay.ret_off && i < lay.ret_off + std::size_t{lay.ret_cap} * sizeof(xenprobes_ret));
      FUZZ_CHECK(ok, std::string(op) + ": Dom0 wrote byte " + std::to_string(i) + " outside its fields");
    }
  }

  // While the guest leaves them alone, the shared tables are exactly Dom0's.
  void check_tables() {
    if (!attached || guest_touched_tables) return;
    FUZZ_CHECK(ch->traps(kDom) == traps.size());
    FUZZ_CHECK(at<std::uint32_t>(offsetof(xenprobes_ctl_header, nr_traps)) == traps.size());
    std::size_t i = 0;
    for (const auto& [addr, t] : traps) {
      const auto e = at<xenprobes_trap>(lay.trap_off + i * sizeof(xenprobes_trap));
      FUZZ_CHECK(std::memcmp(&e, &t, sizeof e) == 0, "trap entry " + std::to_string(i) + " is not Dom0's copy");
      ++i;
    }
    std::map<std::uint64_t, std::uint64_t> shared;
    for (std::size_t k = 0; k < lay.ret_cap; ++k) {
      const auto r = at<xenprobes_ret>(lay.ret_off + k * sizeof(xenprobes_ret));
      if (r.slot) {
        FUZZ_CHECK(!shared.contains(r.slot), "a stack slot twice in the return table");
        shared[r.slot] = r.ret;
      } else {
        FUZZ_CHECK(r.ret == 0, "a free return entry with a return address");
      }
    }
    FUZZ_CHECK(shared == rets, "the return table is not Dom0's");
  }

  // After a detach that wrote (state ready): the entries that were live and the return table
  // are zeros, and so is the count.
  void check_tables_after_detach(std::size_t old_n) {
    if (guest_touched_tables) return;
    FUZZ_CHECK(at<std::uint32_t>(offsetof(xenprobes_ctl_header, nr_traps)) == 0);
    const xenprobes_trap zt{};
    for (std::size_t i = 0; i < old_n; ++i) {
      const auto e = at<xenprobes_trap>(lay.trap_off + i * sizeof(xenprobes_trap));
      FUZZ_CHECK(std::memcmp(&e, &zt, sizeof e) == 0, "detach left a trap entry");
    }
    for (std::size_t k = 0; k < lay.ret_cap; ++k) {
      const auto r = at<xenprobes_ret>(lay.ret_off + k * sizeof(xenprobes_ret));
      FUZZ_CHECK(r.slot == 0 && r.ret == 0, "detach left a return entry");
    }
  }

  void plausible_hit() {
    if (!lay.nr_mb) return;
    const unsigned v = static_cast<unsigned>(in.range(0, lay.nr_mb - 1));
    if (std::uint64_t{lay.mb_off} + (std::uint64_t{v} + 1) * sizeof(xenprobes_mailbox) > ctl_size) return;
    xenprobes_mailbox m{};
    m.state = in.u8() % 8 ? XENPROBES_MBOX_HIT : in.u32();
    m.seq = in.u32();
    m.answer_seq = in.flag() ? m.seq : in.u32();
    m.trap = pick_addr();
    m.regs.rip = in.u8() % 8 ? m.trap : in.u64();
    m.regs.rbx = m.seq;
    m.regs.cs = in.u64();
    m.regs.ss = in.u64();
    m.reserved[0] = in.u64();
    std::memcpy(ctl + lay.mb_off + v * sizeof m, &m, sizeof m);
  }

  void noise() {
    const std::size_t off = in.range(0, ctl_size - 1);
    auto b = in.bytes(std::min<std::size_t>(in.range(1, 64), ctl_size - off));
    std::memcpy(ctl + off, b.data(), b.size());
    const std::size_t end = off + b.size();
    auto hits = [&](std::size_t lo, std::size_t hi) { return off < hi && lo < end; };
    if (hits(offsetof(xenprobes_ctl_header, nr_traps), offsetof(xenprobes_ctl_header, nr_traps) + 4) ||
        hits(lay.trap_off, lay.trap_off + std::size_t{lay.trap_cap} * sizeof(xenprobes_trap)) ||
        hits(lay.ret_off, lay.ret_off + std::size_t{lay.ret_cap} * sizeof(xenprobes_ret)))
      guest_touched_tables = true;
  }

  void run_stops(bool flush) {
    if (in.flag()) hv.pending.push_back(static_cast<hv::EvtchnPort>(in.range(0, 12)));
    // The event loop's side: the pending ports read and acknowledged (EventPorts), and the
    // domain whose port fired looked at alone; otherwise the look at every domain.
    channel::EventPorts ports(hv);
    channel::Channel* c = ch.get();
    std::vector<channel::EventPorts::Wake> woken;
    FUZZ_CHECK(ports.take(std::span(&c, 1), woken).has_value(), "EventPorts::take failed");
    FUZZ_CHECK(woken.size() <= 1, "one domain, one wake-up");
    FUZZ_CHECK(woken.empty() || woken.front().domain == kDom, "a port woke a domain that is not ours");
    const bool port_fired = !woken.empty();
    const auto before = area();
    const bool was_attached = attached;
    sink.seen.clear();
    auto r = flush ? ch->flush(kDom, sink) : port_fired ? ch->process_domain(kDom, sink) : ch->process(sink);
    FUZZ_TRACE("%s: %s, %zu stops", flush ? "flush" : "process", r ? "ok" : r.error().what.c_str(), sink.seen.size());
    check_writes(before, flush ? "flush" : "process", !was_attached);
    FUZZ_CHECK(was_attached || sink.seen.empty(), "a stop from a domain not attached");
    for (const auto& st : sink.seen) answered_rips.insert(st.rip);  // (a failed notify comes after the answers)
    if (!r) {
      FUZZ_CHECK(r.error().code == Errc::Io, r.error().what);
      return;
    }
    bool detached = false;
    for (const auto& s : sink.seen) detached |= s.detached;
    if (detached || !was_attached) return;  // a claim given back follows detach's own rules
    const auto now = area();
    std::set<unsigned> stopped;
    for (const auto& s : sink.seen) {
      FUZZ_CHECK(!stopped.contains(s.vcpu), "a vCPU handed over twice in one round");
      stopped.insert(s.vcpu);
      const std::size_t off = lay.mb_off + std::size_t{s.vcpu} * sizeof(xenprobes_mailbox);
      xenprobes_mailbox a, b;
      std::memcpy(&a, now.data() + off, sizeof a);
      std::memcpy(&b, before.data() + off, sizeof b);
      FUZZ_CHECK(a.state == XENPROBES_MBOX_DONE, "an answered hit is not DONE");
      FUZZ_CHECK(a.answer_seq == a.seq && a.seq == b.seq, "answer_seq is not the hit's seq");
      FUZZ_CHECK(a.trap == b.trap && a.regs.cs == b.regs.cs && a.regs.ss == b.regs.ss && a.spinning == b.spinning &&
                     a.stack_top == b.stack_top && std::memcmp(a.reserved, b.reserved, sizeof a.reserved) == 0,
                 "Dom0 changed a field of the mailbox that is the module's");
      // This sink asks for no return-slot write (protocol.h "Return slots written by the module").
      FUZZ_CHECK(a.ret_slot == b.ret_slot, "Dom0 asked for a return-slot write nobody asked it for");
      FUZZ_CHECK(a.regs.rip == s.rip, "the answer's rip is not the handler's");
    }
    for (unsigned v = 0; v < lay.nr_mb; ++v) {
      if (stopped.contains(v)) continue;
      const std::size_t off = lay.mb_off + std::size_t{v} * sizeof(xenprobes_mailbox);
      FUZZ_CHECK(std::memcmp(now.data() + off, before.data() + off, sizeof(xenprobes_mailbox)) == 0,
                 "a mailbox not handed over was written");
    }
    for (std::uint64_t rip : ch->resumes_in_flight(kDom))
      FUZZ_CHECK(answered_rips.contains(rip), "a resume in flight Dom0 never answered: " + fuzz::hexs(rip));
  }

  void trap_added(const TrapEntry& e) {
    const auto before = area();
    const std::size_t n = ch->traps(kDom);
    auto r = ch->trap_added(kDom, e);
    FUZZ_TRACE("trap_added %s len %u: %s", fuzz::hexs(e.addr.value).c_str(), e.len, r ? "ok" : r.error().what.c_str());
    if (!r) {
      FUZZ_CHECK(r.error().code == Errc::InvalidArgument || r.error().code == Errc::NotSupported ||
                     r.error().code == Errc::NoSpace,
                 r.error().what);
      FUZZ_CHECK(fuzz::printable(r.error().what));
      FUZZ_CHECK(ch->traps(kDom) == n, "a refused entry changed the table");
      check_writes(before, "refused trap_added", true);
      return;
    }
    FUZZ_CHECK(attached && e.len <= 15);
    if (e.fallback == TrapEntry::Fallback::Emulate) {
      xp_branch br;
      FUZZ_CHECK(xp_decode_branch(e.insn, e.len, &br), "an EMULATE entry the module cannot decode was armed");
      FUZZ_CHECK(register_branches || (br.kind != XP_BR_CALL_REG && br.kind != XP_BR_JMP_REG));
    }
    if (e.len == 0)
      FUZZ_CHECK(e.fallback != TrapEntry::Fallback::Emulate, "an entry without bytes armed for emulation");
    xenprobes_trap t{};
    t.addr = e.addr.value;
    t.flags = e.fallback == TrapEntry::Fallback::ResumeAt  ? XENPROBES_TRAP_FALLBACK
              : e.fallback == TrapEntry::Fallback::Emulate ? XENPROBES_TRAP_EMULATE
                                                           : XENPROBES_TRAP_RETURN;
    if (e.fallback == TrapEntry::Fallback::ResumeAt) {
      FUZZ_CHECK(e.resume_at.value != 0);
      t.fallback = e.resume_at.value;
    }
    t.len = e.len;
    std::memcpy(t.insn, e.insn, e.len);
    traps[t.addr] = t;
    check_writes(before, "trap_added", false);
  }

  void run();
};

bool Sink::owns_trap(DomId, Gva a) const { return owned.contains(a.value); }

channel::Verdict Sink::on_stop(channel::Stop& s) {
  FUZZ_CHECK(s.domain == kDom);
  FUZZ_CHECK(s.vcpu.value < h->lay.nr_mb, "a stop on a vCPU without a mailbox");
  FUZZ_CHECK(s.regs.rip == s.trap.value, "a stop whose rip is not its trap");
  FUZZ_CHECK(h->traps.contains(s.trap.value) || owned.contains(s.trap.value), "a stop on a trap nobody owns");
  FUZZ_CHECK(s.regs.kernel_mode);
  Seen seen{s.vcpu.value, s.trap.value, s.trap.value, false};
  channel::Verdict v = channel::Verdict::Resume;
  Input& in = h->in;
  switch (in.u8() % 10) {
    case 0: v = channel::Verdict::NotOurs; break;
    case 1: s.regs.rip = in.u64(); break;
    case 2: s.regs.rax = in.u64(), s.regs.rip = s.trap.value + 1; break;
    case 3: {  // the engine detaches from inside a handler
      (void)h->ch->detach(kDom);
      h->attached = false;
      h->traps.clear();
      h->rets.clear();
      seen.detached = true;
      break;
    }
    case 4:  // and removes the trap it runs for
      h->ch->trap_removed(kDom, s.trap);
      h->traps.erase(s.trap.value);
      s.regs.rip = s.trap.value + 2;
      break;
    case 5: h->trap_added(h->entry()); break;
    default: s.regs.rip = s.trap.value + 1; break;
  }
  seen.rip = v == channel::Verdict::NotOurs ? s.trap.value : s.regs.rip;
  this->seen.push_back(seen);
  return v;
}

void Harness::run() {
  // ---- the guest: type, vCPUs, page tables, the module's keys.
  const std::uint8_t b0 = in.u8(), b1 = in.u8(), b2 = in.u8();
  const unsigned vcpus = 1 + (b0 >> 1) % 4;
  hv.add_domain(kDom, (b0 & 1) ? hv::GuestType::Hvm : hv::GuestType::Pv, vcpus);
  fuzz::PageTables pt(hv, kTablesFrame, kTables);
  const unsigned pages = 1 + b1 % 4;
  ctl_size = pages * kPageSize;
  ctl = hv.add_region(kCtlFrame, pages);
  hv.add_region(kOeaFrame, kOeaPages);
  const bool writable = !(b1 & 0x40) || (b1 & 0x80);
  for (unsigned p = 0; p < pages; ++p)
    FUZZ_CHECK(pt.map(kCtl + p * kPageSize, kCtlFrame + p,
                      fuzz::PageTables::kP | (writable ? fuzz::PageTables::kRw : 0) | fuzz::PageTables::kNx));
  for (unsigned p = 0; p < kOeaPages; ++p) FUZZ_CHECK(pt.map(kOea + p * kPageSize, kOeaFrame + p));
  for (unsigned v = 0; v < vcpus; ++v) hv.regs(kDom, v) = fuzz::long_mode_regs(pt.cr3());

  auto key = [&](std::string_view k, std::string v) { hv.xs[guestmod::module_key(kDom, k)] = std::move(v); };
  key(XENPROBES_XS_VERSION, "1");
  key(XENPROBES_XS_STATE, "ready");
  key(XENPROBES_XS_KERNEL_TEXT, fuzz::hexs(kText));
  key(XENPROBES_XS_RELEASE, "6.1.0-fuzz");
  key(XENPROBES_XS_NR_CPUS, std::to_string(vcpus));
  key(XENPROBES_XS_OEA_COUNT, "1");
  key("oea/0/addr", fuzz::hexs(kOea));
  key("oea/0/size", std::to_string(kOeaPages * kPageSize));
  register_branches = b2 & 1;
  if (register_branches) {
    key(XENPROBES_XS_MODULE_TEXT_START, fuzz::hexs(kOea));
    key(XENPROBES_XS_MODULE_TEXT_END, fuzz::hexs(kOea + 0x10000));
  }
  key(XENPROBES_XS_CONTROL_ADDR, fuzz::hexs(kCtl));
  key(XENPROBES_XS_CONTROL_PAGES, std::to_string(b1 & 0x20 ? pages + 1 : pages));
  key(XENPROBES_XS_EVTCHN, std::to_string(1 + (b2 >> 4)));
  if (b2 & 2) hv.bind_fails = Errc::Busy;
  if (b2 & 4) hv.notify_fails = Errc::Io;

  // ---- the header: the module's layout, mutated, or raw bytes.
  Layout good;
  good.nr_mb = vcpus;
  good.mb_off = 192;
  good.trap_off = good.mb_off + vcpus * sizeof(xenprobes_mailbox);
  good.trap_cap = 1 + in.u8() % 32;
  good.ret_off = good.trap_off + good.trap_cap * sizeof(xenprobes_trap);
  good.ret_cap = in.u8() % 16;
  xenprobes_ctl_header hdr{};
  hdr.magic = XENPROBES_CTL_MAGIC;
  hdr.version = XENPROBES_PROTOCOL_VERSION;
  hdr.nr_mailboxes = good.nr_mb;
  hdr.mailbox_offset = good.mb_off;
  hdr.trap_capacity = good.trap_cap;
  hdr.trap_offset = good.trap_off;
  hdr.ret_capacity = good.ret_cap;
  hdr.ret_offset = good.ret_off;
  hdr.timeout_ms = 100;
  const std::uint8_t mode = in.u8() % 8;
  if (mode >= 4 && mode < 7) {
    auto* w = reinterpret_cast<std::uint32_t*>(&hdr);
    for (unsigned k = 1 + in.u8() % 3; k-- > 0;) {
      const unsigned f = in.u8() % 12;
      const std::uint32_t vals[] = {0,    1,          7,          8,          136,        192,      4095,
                                    4096, 0x7fffffff, 0x80000000, 0xfffffff8, 0xffffffff, w[f] + 8, w[f] - 8};
      const unsigned c = in.u8() % (std::size(vals) + 1);
      w[f] = c < std::size(vals) ? vals[c] : in.u32();
    }
  } else if (mode == 7) {
    auto raw = in.bytes(sizeof hdr);
    std::memcpy(&hdr, raw.data(), raw.size());
  }
  std::memcpy(ctl, &hdr, sizeof hdr);
  lay = Layout{hdr.mailbox_offset, hdr.nr_mailboxes, hdr.trap_offset,
               hdr.trap_capacity,  hdr.ret_offset,   hdr.ret_capacity};

  // Every frame but the control area's, to compare at the end.
  std::vector<std::uint64_t> others;
  for (std::uint64_t f = kTablesFrame; f < kTablesFrame + kTables; ++f) others.push_back(f);
  for (std::uint64_t f = kOeaFrame; f < kOeaFrame + kOeaPages; ++f) others.push_back(f);
  std::vector<std::byte> before_all(others.size() * kPageSize);
  for (std::size_t i = 0; i < others.size(); ++i)
    std::memcpy(&before_all[i * kPageSize], hv.frame_ptr(others[i]), kPageSize);

  ch = std::make_unique<GuestChannel>(hv);
  auto attach = [&] {
    const auto before = area();
    auto r = ch->attach(kDom);
    FUZZ_TRACE("attach: %s", r ? "ok" : r.error().what.c_str());
    if (attached) {  // a second attach is a no-op
      FUZZ_CHECK(r.has_value(), r.error().what);
      check_writes(before, "attach again", true);
      return;
    }
    if (!r) {
      FUZZ_CHECK(fuzz::printable(r.error().what), r.error().what);
      FUZZ_CHECK(r.error().code != Errc::NoMemory, r.error().what);
      check_writes(before, "refused attach", true);
      return;
    }
    attached = true;
    traps.clear();
    rets.clear();
    guest_touched_tables = false;
    const auto h = at<xenprobes_ctl_header>(0);
    lay = Layout{h.mailbox_offset, h.nr_mailboxes, h.trap_offset, h.trap_capacity, h.ret_offset, h.ret_capacity};
    FUZZ_CHECK(h.magic == XENPROBES_CTL_MAGIC && h.version == XENPROBES_PROTOCOL_VERSION && h.nr_mailboxes == vcpus);
    FUZZ_CHECK(h.trap_capacity > 0 && h.nr_traps == 0 && h.dom0_gone == 0);
    FUZZ_CHECK(std::uint64_t{lay.mb_off} + std::uint64_t{lay.nr_mb} * sizeof(xenprobes_mailbox) <= ctl_size);
    FUZZ_CHECK(std::uint64_t{lay.trap_off} + std::uint64_t{lay.trap_cap} * sizeof(xenprobes_trap) <= ctl_size);
    FUZZ_CHECK(std::uint64_t{lay.ret_off} + std::uint64_t{lay.ret_cap} * sizeof(xenprobes_ret) <= ctl_size);
    FUZZ_CHECK(lay.mb_off % 8 == 0 && lay.trap_off % 8 == 0 && lay.ret_off % 8 == 0);
    check_writes(before, "attach", false);
    check_tables();
  };
  attach();

  for (unsigned ops = 0; ops < 200 && !in.empty(); ++ops) {
    switch (in.u8() % 14) {
      case 0:
      case 1: plausible_hit(); break;
      case 2: noise(); break;
      case 3:
      case 4: run_stops(false); break;
      case 5: run_stops(true); break;
      case 6:
        trap_added(entry());
        check_tables();
        break;
      case 7: {
        const std::uint64_t a = pick_addr();
        const auto before = area();
        ch->trap_removed(kDom, Gva{a});
        traps.erase(a);
        check_writes(before, "trap_removed", !attached);
        check_tables();
        break;
      }
      case 8: {
        const std::uint64_t slot = in.u8() % 4 ? 0xffffc90000200000ull + 8 * in.range(0, 31) : in.u64();
        const std::uint64_t ret = in.u64();
        const auto before = area();
        auto r = ch->return_added(kDom, Gva{slot}, Gva{ret});
        FUZZ_TRACE("return_added %s: %s", fuzz::hexs(slot).c_str(), r ? "ok" : r.error().what.c_str());
        if (r) {
          FUZZ_CHECK(attached && slot != 0);
          rets[slot] = ret;
        } else {
          FUZZ_CHECK(r.error().code == Errc::InvalidArgument || r.error().code == Errc::NoSpace, r.error().what);
          FUZZ_CHECK(!attached || slot == 0 || rets.size() >= lay.ret_cap, "return_added refused with room left");
        }
        check_writes(before, "return_added", !r);
        check_tables();
        break;
      }
      case 9: {
        const std::uint64_t slot = rets.empty() || in.flag() ? in.u64() : rets.begin()->first;
        const auto before = area();
        ch->return_removed(kDom, Gva{slot});
        rets.erase(slot);
        check_writes(before, "return_removed", !attached);
        check_tables();
        break;
      }
      case 10: {  // the module withdraws `state` (unloading), or the engine just detaches
        const bool leaving = in.flag();
        if (leaving) hv.xs.erase(guestmod::module_key(kDom, XENPROBES_XS_STATE));
        const auto before = area();
        const bool was = attached;
        const std::size_t old_n = traps.size();
        auto r = ch->detach(kDom);
        FUZZ_CHECK(r.has_value(), r.error().what);
        check_writes(before, "detach", !was, was && leaving);
        if (was) FUZZ_CHECK(at<std::uint32_t>(offsetof(xenprobes_ctl_header, dom0_hold)) == XENPROBES_DOM0_RELEASED);
        if (was && !leaving) check_tables_after_detach(old_n);
        attached = false;
        traps.clear();
        rets.clear();
        FUZZ_CHECK(ch->traps(kDom) == 0);
        if (leaving) hv.xs[guestmod::module_key(kDom, XENPROBES_XS_STATE)] = "ready";
        break;
      }
      case 11: attach(); break;
      case 12: sink.owned.insert(pick_addr()); break;
      case 13: {  // the module grows a second area (in_oea re-reads the keys)
        hv.xs[guestmod::module_key(kDom, XENPROBES_XS_OEA_COUNT)] = in.flag() ? "2" : "1";
        hv.xs[guestmod::module_key(kDom, "oea/1/addr")] = fuzz::hexs(kOea + 0x100000);
        hv.xs[guestmod::module_key(kDom, "oea/1/size")] = "4096";
        // The module's counters are its words, read as they are (never relied on):
        // notify_skipped (protocol.h "Spinning") among them, at its own offset.
        if (auto c = ch->module_counters(kDom)) {
          FUZZ_CHECK(c->async_bad == at<std::uint64_t>(offsetof(xenprobes_ctl_header, async_bad)));
          FUZZ_CHECK(c->notify_skipped == at<std::uint64_t>(offsetof(xenprobes_ctl_header, notify_skipped)));
        }
        (void)ch->stats(kDom);
        break;
      }
    }
  }
  ch.reset();
  FUZZ_CHECK(hv.bound.empty(), "a port stayed bound after the channel went");
  FUZZ_CHECK(hv.live_mappings() == 0, "a mapping outlived the channel");
  for (std::size_t i = 0; i < others.size(); ++i)
    FUZZ_CHECK(std::memcmp(&before_all[i * kPageSize], hv.frame_ptr(others[i]), kPageSize) == 0,
               "Dom0 wrote outside the control area, in frame " + fuzz::hexs(others[i]));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  if (size > 4096) return 0;
  Harness h(data, size);
  h.run();
  return 0;
}
