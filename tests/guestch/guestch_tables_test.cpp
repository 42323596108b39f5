// The guest channel's trap and return tables over the simulated Xen: what Dom0 writes there and
// when, what the module may emulate, and branches through a register taken by its fallback.
#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include "common/hex.hpp"
#include "guestch/guestch_fixture.hpp"
#include "x86/analysis.hpp"

namespace xenprobes::testing {
namespace {

using channel::GuestChannel;

// ---- tables --------------------------------------------------------------------------

std::vector<xenprobes_trap> shared_traps(ChannelGuest& g) {
  const auto h = g.header();
  return g.peek_array<xenprobes_trap>(g.layout.control_addr + h.trap_offset, std::min(h.nr_traps, h.trap_capacity));
}

TEST(GuestChannelTables, TrapTableSortedBoundedAndExact) {
  auto cfg = guest_config(1, 1);
  cfg.module_trap_capacity = 8;
  ChannelGuest g(cfg);
  g.attach();
  std::set<std::uint64_t> want;
  std::mt19937_64 rng(7);
  auto entry = [](std::uint64_t a) {
    TrapEntry e;
    e.addr = Gva{a};
    e.fallback = TrapEntry::Fallback::ResumeAt;
    e.resume_at = Gva{a + 5};
    e.len = 5;
    e.insn[0] = static_cast<std::uint8_t>(a);
    return e;
  };
  for (int i = 0; i < 400; ++i) {
    const std::uint64_t a = 0xffffffff81000000ull + (rng() % 12) * 16;
    if (rng() % 3 == 0) {
      g.ch->trap_removed(g.dom, Gva{a});
      want.erase(a);
    } else {
      auto r = g.ch->trap_added(g.dom, entry(a));
      if (want.size() == 8 && !want.contains(a)) {
        ASSERT_FALSE(r);
        EXPECT_EQ(r.error().code, Errc::NoSpace);
        EXPECT_NE(r.error().what.find("trap table is full (8 entries"), std::string::npos) << r.error().what;
      } else {
        ASSERT_TRUE(r) << r.error().what;
        want.insert(a);
      }
    }
    auto t = shared_traps(g);
    ASSERT_EQ(t.size(), want.size());
    ASSERT_EQ(g.header().nr_traps, want.size());
    std::size_t k = 0;
    for (std::uint64_t a2 : want) {
      EXPECT_EQ(t[k].addr, a2);
      EXPECT_EQ(t[k].flags, XENPROBES_TRAP_FALLBACK);
      EXPECT_EQ(t[k].fallback, a2 + 5);
      EXPECT_EQ(t[k].insn[0], static_cast<std::uint8_t>(a2));
      ++k;
    }
  }
  // Bad entries are refused; detach empties the table.
  TrapEntry bad = entry(0xffffffff81001000);
  bad.len = 0;
  EXPECT_EQ(g.ch->trap_added(g.dom, bad).error().code, Errc::InvalidArgument);
  bad = entry(0xffffffff81001000);
  bad.resume_at = Gva{0};
  EXPECT_EQ(g.ch->trap_added(g.dom, bad).error().code, Errc::InvalidArgument);
  EXPECT_EQ(g.ch->trap_added(DomId{77}, entry(0xffffffff81001000)).error().code, Errc::InvalidArgument);
  ASSERT_TRUE(g.ch->detach(g.dom));
  EXPECT_EQ(g.header().nr_traps, 0u);
  const auto all = g.peek_array<xenprobes_trap>(g.layout.control_addr + g.header().trap_offset, 8);
  for (const auto& e : all) EXPECT_EQ(e.addr, 0u);
}

TEST(GuestChannelTables, OnlySlotTrapsMayGoWithoutTheirBytes) {
  ChannelGuest g(guest_config(1, 1));
  g.attach();
  TrapEntry e;
  e.addr = Gva{g.layout.oea_addr + 0x27};  // a slot's trap byte, after the copied instruction
  e.fallback = TrapEntry::Fallback::ResumeAt;
  e.resume_at = Gva{g.sym("sys_open") + 5};
  EXPECT_TRUE(g.ch->trap_added(g.dom, e));
  e.fallback = TrapEntry::Fallback::Return;  // the return trampoline
  EXPECT_TRUE(g.ch->trap_added(g.dom, e));
  e.fallback = TrapEntry::Fallback::Emulate;  // nothing to emulate
  EXPECT_EQ(g.ch->trap_added(g.dom, e).error().code, Errc::InvalidArgument);
  e.addr = Gva{g.sym("sys_open")};  // text: the module restores insn[0] there
  e.fallback = TrapEntry::Fallback::ResumeAt;
  auto r = g.ch->trap_added(g.dom, e);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
  EXPECT_NE(r.error().what.find("no original bytes"), std::string::npos) << r.error().what;
  // An area the module published after attach counts too.
  ASSERT_TRUE(g.hv->xs_write(key(g, XENPROBES_XS_OEA_REQUEST), std::to_string(g.layout.oea_size)));
  const auto grown = std::stoull(*g.hv->xs_read(key(g, "oea/1/addr")), nullptr, 16);
  e.addr = Gva{grown + 0x47};
  EXPECT_TRUE(g.ch->trap_added(g.dom, e));
  EXPECT_EQ(g.ch->traps(g.dom), 2u);
}

// Hits published for traps that are gone (guest_hits.cpp, "Retired traps": a vCPU Xen paused
// in the module's hook between its lookup and its mailbox write). A trap in text among the
// last kRetiredTraps removed is answered at once: DONE, the vCPU's own registers, rip = the
// trap, no stop for the engine. A slot's trap in the OEA (its slot may be reused), an address
// never ours and a removal older than the last kRetiredTraps are left alone, as before.
TEST(GuestChannelTables, OnlyATrapInTextRemovedLatelyIsAnsweredOnceGone) {
  ChannelGuest g(guest_config(1, 1));
  g.attach();
  FakeSink sink;
  const auto h = g.header();
  auto ctl = g.map_control(*g.hv);
  std::uint32_t seq = 0;
  auto publish = [&](std::uint64_t trap) {
    xenprobes_mailbox m{};
    m.seq = ++seq;
    m.trap = trap;
    m.regs.rip = trap;
    m.regs.rax = 0x1234 + seq;
    m.regs.rflags = 0x246;
    m.regs.cs = 0xe033;
    m.state = XENPROBES_MBOX_HIT;
    std::memcpy(ctl.data() + h.mailbox_offset, &m, sizeof m);
    auto r = g.ch->process(sink);
    EXPECT_TRUE(r) << r.error().what;
    return std::pair{m, g.mailbox(0)};
  };
  auto remove = [&](const TrapEntry& e) {
    ASSERT_TRUE(g.hv->pause(g.dom));
    ASSERT_TRUE(g.memory->write(e.addr, std::as_bytes(std::span(e.insn, 1))));  // the byte back first
    g.ch->trap_removed(g.dom, e.addr);
    ASSERT_TRUE(g.hv->unpause(g.dom));
  };

  const TrapEntry text = g.arm_skip("sys_open");
  remove(text);
  auto [sent, got] = publish(text.addr.value);
  EXPECT_EQ(got.state, XENPROBES_MBOX_DONE);
  EXPECT_EQ(got.answer_seq, sent.seq);
  EXPECT_EQ(std::memcmp(&got.regs, &sent.regs, sizeof got.regs), 0) << "the vCPU's own registers, rip on the trap";
  EXPECT_EQ(sink.total, 0u) << "no stop for a trap that is gone";
  EXPECT_EQ(g.ch->stats(g.dom).retired, 1u);
  EXPECT_EQ(g.ch->stats(g.dom).rejected, 0u);

  TrapEntry slot;
  slot.addr = Gva{g.layout.oea_addr + 0x27};
  slot.fallback = TrapEntry::Fallback::ResumeAt;
  slot.resume_at = Gva{g.sym("sys_open") + 5};
  slot.len = 1;
  slot.insn[0] = 0x90;
  ASSERT_TRUE(g.ch->trap_added(g.dom, slot));
  g.ch->trap_removed(g.dom, slot.addr);
  for (std::uint64_t never : {slot.addr.value, std::uint64_t{g.sym("sys_read")}}) {
    auto [s2, got2] = publish(never);
    EXPECT_EQ(got2.state, XENPROBES_MBOX_HIT) << hex(never) << ": left to the module's timeout";
    EXPECT_EQ(std::memcmp(&got2, &s2, sizeof got2), 0) << hex(never) << ": nothing written";
  }
  EXPECT_EQ(g.ch->stats(g.dom).rejected, 2u);

  // kRetiredTraps later removals: sys_open's is forgotten.
  TrapEntry other = text;
  for (std::size_t i = 0; i < GuestChannel::kRetiredTraps; ++i) {
    other.addr = Gva{text.addr.value + 1 + i};
    ASSERT_TRUE(g.ch->trap_added(g.dom, other));
    g.ch->trap_removed(g.dom, other.addr);
  }
  auto [s3, got3] = publish(text.addr.value);
  EXPECT_EQ(got3.state, XENPROBES_MBOX_HIT);
  auto [s4, got4] = publish(other.addr.value);  // the latest is still answered
  EXPECT_EQ(got4.state, XENPROBES_MBOX_DONE);
  EXPECT_EQ(g.ch->stats(g.dom).retired, 2u);
  EXPECT_EQ(g.ch->stats(g.dom).rejected, 3u);
}

TEST(GuestChannelTables, ReturnTable) {
  auto cfg = guest_config(1, 1);
  cfg.module_ret_capacity = 2;
  ChannelGuest g(cfg);
  g.attach();
  auto rets = [&] {
    auto r = g.return_table();
    EXPECT_EQ(r.size(), 2u);
    return r;
  };
  ASSERT_TRUE(g.ch->return_added(g.dom, Gva{0x1000}, Gva{0xaaa}));
  ASSERT_TRUE(g.ch->return_added(g.dom, Gva{0x2000}, Gva{0xbbb}));
  auto full = g.ch->return_added(g.dom, Gva{0x3000}, Gva{0xccc});
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, Errc::NoSpace);
  EXPECT_NE(full.error().what.find("return table is full (2"), std::string::npos) << full.error().what;
  ASSERT_TRUE(g.ch->return_added(g.dom, Gva{0x2000}, Gva{0xddd}));  // same slot: updated
  EXPECT_EQ(rets()[1].ret, 0xdddu);
  g.ch->return_removed(g.dom, Gva{0x1000});
  EXPECT_EQ(rets()[0].slot, 0u);
  ASSERT_TRUE(g.ch->return_added(g.dom, Gva{0x3000}, Gva{0xccc}));
  EXPECT_EQ(rets()[0].slot, 0x3000u);
  EXPECT_EQ(rets()[0].ret, 0xcccu);
  EXPECT_EQ(g.ch->return_added(g.dom, Gva{0}, Gva{1}).error().code, Errc::InvalidArgument);
  ASSERT_TRUE(g.ch->detach(g.dom));
  for (const auto& r : rets()) EXPECT_EQ(r.slot, 0u);
}

// EMULATE entries are checked with the guest module's own decoder: what it could not run when
// Dom0 does not answer is never armed.
TEST(GuestChannelTables, EmulateOnlyWhatTheModuleCanRun) {
  ChannelGuest g(guest_config(1, 1));
  g.attach();
  auto entry = [](std::uint64_t a, std::initializer_list<std::uint8_t> bytes) {
    TrapEntry e;
    e.addr = Gva{a};
    e.fallback = TrapEntry::Fallback::Emulate;
    e.len = static_cast<std::uint8_t>(bytes.size());
    std::copy(bytes.begin(), bytes.end(), e.insn);
    return e;
  };
  const std::uint64_t a = 0xffffffff81001000ull;
  // Through memory: refused, saying why and what works instead.
  for (auto e : {entry(a, {0xff, 0x24, 0xfd, 0x00, 0x10, 0x00, 0x81}),  // jmp *table(,%rdi,8)
                 entry(a, {0xff, 0x15, 0x10, 0x00, 0x00, 0x00}),        // call *0x10(%rip)
                 entry(a, {0x41, 0xff, 0x13})}) {                       // call *(%r11)
    auto r = g.ch->trap_added(g.dom, e);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, Errc::NotSupported);
    EXPECT_NE(r.error().what.find("the guest module's fallback cannot emulate a memory-indirect branch; use the "
                                  "vmevent or debugger channel"),
              std::string::npos)
        << r.error().what;
    EXPECT_NE(r.error().what.find(hex(a)), std::string::npos) << r.error().what;
  }
  // Not a branch the module emulates at all (a boosted instruction without a slot, 66 prefixes).
  for (auto e : {entry(a, {0x55}), entry(a, {0x66, 0xff, 0xd0}), entry(a, {0xeb})}) {
    auto r = g.ch->trap_added(g.dom, e);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, Errc::NotSupported);
    EXPECT_NE(r.error().what.find("the guest module's fallback cannot emulate this instruction"), std::string::npos)
        << r.error().what;
  }
  EXPECT_EQ(g.ch->traps(g.dom), 0u);
  EXPECT_EQ(g.header().nr_traps, 0u) << "nothing refused reached the module's table";
  // Through a register, with and without REX.B, and the relative forms and ret: armed.
  std::uint64_t at = a;
  for (auto e : {entry(at, {0xff, 0xd0}), entry(at, {0x41, 0xff, 0xd3}), entry(at, {0xff, 0xe0}),
                 entry(at, {0x41, 0xff, 0xe3}), entry(at, {0x2e, 0x41, 0xff, 0xd3}), entry(at, {0xe8, 0, 0, 0, 0}),
                 entry(at, {0x74, 0x10}), entry(at, {0xc3})}) {
    e.addr = Gva{at += 0x10};
    ASSERT_TRUE(g.ch->trap_added(g.dom, e)) << hex(e.addr.value);
  }
  EXPECT_EQ(g.ch->traps(g.dom), 8u);
  // Only EMULATE entries are decoded: a slot's original bytes can be anything.
  TrapEntry boosted = entry(at + 0x10, {0xff, 0x24, 0xfd, 0x00, 0x10, 0x00, 0x81});
  boosted.fallback = TrapEntry::Fallback::ResumeAt;
  boosted.resume_at = Gva{g.layout.oea_addr};
  EXPECT_TRUE(g.ch->trap_added(g.dom, boosted));
}

TEST(GuestChannelTables, AModuleWithoutModuleTextEmulatesNoRegisterBranch) {
  // module-text came with the register forms: a module that does not publish it is older and
  // would oops on such a fallback. Relative branches and ret it has always emulated.
  ChannelGuest g(guest_config(1, 1));
  ASSERT_TRUE(g.hv->xs_rm(key(g, XENPROBES_XS_MODULE_TEXT_START)));
  ASSERT_TRUE(g.hv->xs_rm(key(g, XENPROBES_XS_MODULE_TEXT_END)));
  for (auto k : {XENPROBES_XS_FIXUP_SLOTS_ADDR, XENPROBES_XS_FIXUP_SLOTS_COUNT, XENPROBES_XS_FIXUP_SLOTS_TABLE,
                 XENPROBES_XS_JUMP_ENTRY})
    ASSERT_TRUE(g.hv->xs_rm(key(g, k)));  // newer still
  g.attach();
  TrapEntry e;
  e.addr = Gva{0xffffffff81001000ull};
  e.fallback = TrapEntry::Fallback::Emulate;
  e.len = 3;
  e.insn[0] = 0x41, e.insn[1] = 0xff, e.insn[2] = 0xd3;  // call *%r11
  auto r = g.ch->trap_added(g.dom, e);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::NotSupported);
  EXPECT_NE(r.error().what.find("too old to emulate a jmp/call through a register"), std::string::npos)
      << r.error().what;
  EXPECT_NE(r.error().what.find("install the current xenprobesU"), std::string::npos) << r.error().what;
  e.len = 1;
  e.insn[0] = 0xc3;  // ret
  EXPECT_TRUE(g.ch->trap_added(g.dom, e));
  e.len = 5;
  e.insn[0] = 0xe8, e.insn[1] = e.insn[2] = e.insn[3] = e.insn[4] = 0;  // call rel32
  EXPECT_TRUE(g.ch->trap_added(g.dom, e));
}

// Every instruction of the demo guest that Dom0's planner emulates (x86::analyze) is armed on the
// guest channel with an EMULATE fallback, except the branches through memory, which the module
// cannot run: those are refused. Register forms, absent from the demo guest, are decoded here.
TEST(GuestChannelTables, EveryBranchDom0EmulatesIsArmedUnlessThroughMemory) {
  ChannelGuest g(guest_config(1, 1));
  g.attach();
  unsigned armed = 0, refused = 0;
  auto check = [&](const x86::Insn& i) {
    auto plan = x86::analyze(i);
    if (!plan || (*plan != x86::Plan::EmulateBranch && *plan != x86::Plan::EmulateLoaded)) return;
    TrapEntry e;
    e.addr = i.address;
    e.fallback = TrapEntry::Fallback::Emulate;
    e.len = i.length;
    std::copy_n(i.bytes.begin(), i.length, e.insn);
    auto r = g.ch->trap_added(g.dom, e);
    const bool through_memory =
        (i.branch == x86::BranchKind::JmpIndirect || i.branch == x86::BranchKind::CallIndirect) && i.mem.present;
    if (through_memory) {
      ASSERT_FALSE(r) << i.describe();
      EXPECT_NE(r.error().what.find("memory-indirect branch"), std::string::npos) << r.error().what;
      ++refused;
    } else {
      ASSERT_TRUE(r) << i.describe() << ": " << r.error().what;
      g.ch->trap_removed(g.dom, e.addr);
      ++armed;
    }
  };
  for (const char* fn : {"sys_getppid", "sys_read", "sys_write", "sys_open", "sys_unlink", "demo_recurse",
                         "demo_classify", "demo_dispatch", "demo_main"})
    for (const auto& i : g.function(fn)) check(i);
  EXPECT_GT(armed, 20u);
  EXPECT_GE(refused, 1u) << "demo_dispatch's jump table";
  const std::uint64_t at = g.sym("demo_main");
  for (std::vector<std::uint8_t> b :
       {std::vector<std::uint8_t>{0xff, 0xd0}, {0x41, 0xff, 0xd3}, {0xff, 0xe0}, {0x41, 0xff, 0xe3}}) {
    auto i = x86::decode(b, Gva{at});
    ASSERT_TRUE(i);
    ASSERT_EQ(i->indirect_reg == x86::Reg::None, false) << i->describe();
    check(*i);
  }
  EXPECT_EQ(g.ch->traps(g.dom), 0u);
}

// ---- branches through a register, taken by the module's fallback ----------------------------

// The demo guest has no `call/jmp *%reg` (kernels do: retpoline sites on hosts that patch
// them to plain indirect calls). These tests make some: a call site `call callee` in `caller`
// is sent to a stub in the OEA that loads the callee's address into a register and branches
// through it. The register is caller-saved and dead at a call site (no argument is in rax or
// r11), so the guest computes what it computes unprobed.
struct ViaRegister {
  std::uint64_t site = 0;    // the redirected `call rel32`
  std::uint64_t stub = 0;    // the stub's first byte
  std::uint64_t branch = 0;  // the branch through the register (the trap)
  std::uint64_t after = 0;   // the byte after it (what a call pushes)
  std::uint64_t callee = 0;
};

// kind: 0xd0 `call *%reg`, 0xe0 `jmp *%reg` (a jmp stub ends the call there: the callee returns
// to the call site); r11: through %r11 (REX.B), else %rax.
ViaRegister via_register(ChannelGuest& g, const char* caller, const char* callee, std::uint64_t stub, std::uint8_t kind,
                         bool r11) {
  ViaRegister v;
  v.callee = g.sym(callee);
  for (const auto& i : g.function(caller))
    if (i.branch == x86::BranchKind::Call && i.branch_target.value == v.callee && i.length == 5) {
      v.site = i.address.value;
      break;
    }
  if (!v.site) throw std::runtime_error(std::string("no call to ") + callee + " in " + caller);
  std::vector<std::uint8_t> code = {static_cast<std::uint8_t>(r11 ? 0x49 : 0x48),
                                    static_cast<std::uint8_t>(r11 ? 0xbb : 0xb8)};  // movabs $callee, %reg
  for (int k = 0; k < 8; ++k) code.push_back(static_cast<std::uint8_t>(v.callee >> (8 * k)));
  v.stub = stub;
  v.branch = stub + code.size();
  if (r11) code.push_back(0x41);
  code.push_back(0xff);
  code.push_back(static_cast<std::uint8_t>(kind | (r11 ? 3 : 0)));
  v.after = stub + code.size();
  if (kind == 0xd0) code.push_back(0xc3);  // back to the call site's next instruction
  if (!g.memory->write(Gva{stub}, std::as_bytes(std::span(code)))) throw std::runtime_error("write stub");
  const auto rel = static_cast<std::uint32_t>(stub - (v.site + 5));
  const std::uint8_t call[5] = {0xe8, static_cast<std::uint8_t>(rel), static_cast<std::uint8_t>(rel >> 8),
                                static_cast<std::uint8_t>(rel >> 16), static_cast<std::uint8_t>(rel >> 24)};
  if (!g.memory->write(Gva{v.site}, std::as_bytes(std::span(call)))) throw std::runtime_error("write call");
  return v;
}

TEST(GuestChannelRegisterBranch, AnExpiredClaimOnACallThroughARegisterPushesTheAddressAfterIt) {
  // Dom0 holds the claim on a hit on `call *%r11` past the claim bound (a hung handler): the
  // module takes the EMULATE fallback on its own. The next stop, the callee's entry, shows
  // where the fallback sent the vCPU and what it pushed.
  constexpr std::uint64_t kIters = 2;
  constexpr unsigned kTimeoutMs = 100;  // claim bound 2 s
  ChannelGuest g(guest_config(1, kIters, kTimeoutMs));
  g.attach();
  const ViaRegister v = via_register(g, "demo_main", "sys_getppid", g.layout.oea_addr + 0x800, 0xd0, true);
  ASSERT_EQ(g.peek(v.branch, 3), (std::vector<std::uint8_t>{0x41, 0xff, 0xd3}));
  g.arm(v.branch, TrapEntry::Fallback::Emulate);
  struct Event {
    std::uint64_t trap, rsp, top, r11;
  };
  std::vector<Event> events;
  FakeSink sink;
  sink.observer = [&](channel::Stop& s) {
    auto top = g.memory->read_u64(Gva{s.regs.rsp});
    ASSERT_TRUE(top);
    events.push_back({s.trap.value, s.regs.rsp, *top, s.regs.r11});
  };
  bool held = false;
  sink.probes[v.branch].on_hit = [&](channel::Stop& s) {
    if (!held) {
      held = true;
      // Hung in the handler until the module gives the claim up (its bound) and moves on.
      g.advance(claim_bound(kTimeoutMs) - 1ms);
      EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED) << "a claimed hit is waited for up to the bound";
      EXPECT_EQ(g.header().timeouts, 0u);
      g.advance(1ms);  // given up on: the vCPU runs on (and may hit again at once)
      EXPECT_NE(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED) << "and not a moment longer";
      EXPECT_EQ(g.header().timeouts, 1u);
      return;
    }
    // Later hits: Dom0 emulates the call, as the engine does.
    s.regs.rsp -= 8;
    ASSERT_TRUE(g.memory->write_u64(Gva{s.regs.rsp}, v.after));
    s.regs.rip = s.regs.r11;
  };
  sink.skip(v.callee);
  g.arm_skip("sys_getppid");
  g.start();
  ASSERT_TRUE(g.run_to_completion(sink)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], expected_calls(DEMO_FN_GETPPID, kIters));
  EXPECT_EQ(sink.probes[v.callee].hits, expected_calls(DEMO_FN_GETPPID, kIters));
  EXPECT_EQ(sink.probes[v.branch].hits, kIters) << "one call through the stub per iteration";
  // The hit Dom0 held, then the callee's entry, reached through the module's fallback.
  auto held_at = std::find_if(events.begin(), events.end(), [&](const Event& e) { return e.trap == v.branch; });
  ASSERT_NE(held_at, events.end());
  ASSERT_NE(held_at + 1, events.end());
  const Event& hit = *held_at;
  const Event& next = *(held_at + 1);
  EXPECT_EQ(hit.r11, v.callee);
  EXPECT_EQ(next.trap, v.callee) << "the fallback jumped to %r11";
  EXPECT_EQ(next.rsp, hit.rsp - 8) << "and pushed one return address";
  EXPECT_EQ(next.top, v.after) << "the address after `call *%r11`";
  const auto st = g.ch->stats(g.dom);
  EXPECT_EQ(st.late, 1u);
  EXPECT_EQ(g.header().timeouts, 1u);
  EXPECT_EQ(g.header().dom0_gone, 0u);
}

TEST(GuestChannelRegisterBranch, Dom0GoneEveryBranchThroughARegisterFinishesThroughTheFallback) {
  // Dom0 arms traps on `call *%rax` and `jmp *%r11` in stubs, then dies without answering:
  // the module resumes every hit by emulating the branch itself (the first three after
  // timeout_ms, then at once), and traps inside the OEA stay armed, so every call through the
  // stubs takes the fallback. Wrong targets or return addresses would crash the guest or change
  // its results.
  constexpr std::uint64_t kIters = 4;
  ChannelGuest g(guest_config(1, kIters, 10));
  g.attach();
  const ViaRegister call = via_register(g, "demo_main", "sys_getppid", g.layout.oea_addr + 0x800, 0xd0, false);
  const ViaRegister jmp = via_register(g, "demo_main", "sys_unlink", g.layout.oea_addr + 0x840, 0xe0, true);
  ASSERT_EQ(g.peek(call.branch, 2), (std::vector<std::uint8_t>{0xff, 0xd0}));
  ASSERT_EQ(g.peek(jmp.branch, 3), (std::vector<std::uint8_t>{0x41, 0xff, 0xe3}));
  g.arm(call.branch, TrapEntry::Fallback::Emulate);
  g.arm(jmp.branch, TrapEntry::Fallback::Emulate);
  g.start();
  g.kill_dom0();  // never answered a hit
  ASSERT_TRUE(g.advance_until_halted(10ms)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(g.stats(0).iterations, kIters);
  for (unsigned f = 0; f < DEMO_NFUNCS; ++f)
    EXPECT_EQ(g.stats(0).calls[f], reference_stats(0, kIters).calls[f]) << "fn " << f;
  const auto h = g.header();
  EXPECT_EQ(h.dom0_gone, 1u);
  EXPECT_EQ(h.timeouts, unsigned{XENPROBES_DEAD_AFTER});
  EXPECT_EQ(g.peek(call.branch, 1)[0], 0xcc) << "slot traps stay: every later call took the fallback";
  EXPECT_EQ(g.peek(jmp.branch, 1)[0], 0xcc);
}

}  // namespace
}  // namespace xenprobes::testing
