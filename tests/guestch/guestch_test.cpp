// The guest channel end to end over the simulated Xen: hits, several vCPUs at once, the
// registers both ways, refusals at attach, the trap and return tables, quiescence, and a Dom0
// that dies or never answers (the module's fallbacks and self-disarm).
#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <set>

#include "common/hex.hpp"
#include "guestch/guestch_fixture.hpp"
#include "x86/analysis.hpp"

namespace xenprobes::testing {
namespace {

using channel::GuestChannel;
using hv::sim::Op;

// ---- hits -----------------------------------------------------------------------------

void hits_equal_calls(hv::GuestType type, unsigned vcpus) {
  constexpr std::uint64_t kIters = 5;
  auto cfg = guest_config(vcpus, kIters);
  cfg.type = type;
  ChannelGuest g(cfg);
  g.attach();
  FakeSink sink;
  auto& open = sink.skip(g.sym("sys_open"));
  auto& recurse = sink.skip(g.sym("demo_recurse"));
  g.arm_skip("sys_open");
  g.arm_skip("demo_recurse");
  EXPECT_EQ(g.ch->traps(g.dom), 2u);
  g.host->reset_counts();
  g.start();
  ASSERT_TRUE(g.run_to_completion(sink)) << g.host->crash_reason(g.dom);

  EXPECT_EQ(open.hits, vcpus * expected_calls(DEMO_FN_OPEN, kIters));
  EXPECT_EQ(recurse.hits, vcpus * expected_calls(DEMO_FN_RECURSE, kIters));
  for (unsigned v = 0; v < vcpus; ++v) {
    EXPECT_EQ(open.per_vcpu[v], expected_calls(DEMO_FN_OPEN, kIters)) << "vcpu " << v;
    EXPECT_EQ(g.stats(v).checksum, reference_stats(v, kIters, vcpus).checksum) << "vcpu " << v;
  }
  EXPECT_EQ(sink.unknown, 0u);
  auto c = g.ch->module_counters(g.dom);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->hits, open.hits + recurse.hits);
  EXPECT_EQ(c->timeouts, 0u);
  EXPECT_FALSE(c->dom0_gone);
  EXPECT_EQ(g.ch->stats(g.dom).answered, open.hits + recurse.hits);
  EXPECT_EQ(g.ch->stats(g.dom).rejected, 0u);
  // The hit path needs no pause and no vCPU context: only event channels.
  EXPECT_EQ(g.host->op_count(Op::Pause), 0u);
  EXPECT_EQ(g.host->op_count(Op::GetRegs), 0u);
  EXPECT_EQ(g.host->op_count(Op::SetRegs), 0u);
  EXPECT_EQ(g.host->op_count(Op::MapFrames), 0u);
  EXPECT_LE(g.host->op_count(Op::EvtchnNotify), open.hits + recurse.hits);
}

TEST(GuestChannel, PvHitsEqualCallsAndTheGuestIsUnchanged) { hits_equal_calls(hv::GuestType::Pv, 1); }
TEST(GuestChannel, HvmHitsEqualCallsAndTheGuestIsUnchanged) { hits_equal_calls(hv::GuestType::Hvm, 2); }

TEST(GuestChannel, SeveralVcpusHitAtOnce) {
  constexpr unsigned kVcpus = 4;
  constexpr std::uint64_t kIters = 4;
  ChannelGuest g(guest_config(kVcpus, kIters));
  g.attach();
  FakeSink sink;
  const char* fns[] = {"sys_open", "sys_read", "sys_write", "demo_classify"};
  const unsigned idx[] = {DEMO_FN_OPEN, DEMO_FN_READ, DEMO_FN_WRITE, DEMO_FN_CLASSIFY};
  for (const char* f : fns) {
    sink.skip(g.sym(f));
    g.arm_skip(f);
  }
  g.start();
  // Dom0 looks only once several vCPUs wait: the other vCPUs ran on meanwhile and hit too.
  ASSERT_TRUE(eventually([&] { return g.mailboxes_in(XENPROBES_MBOX_HIT, kVcpus) >= 2; }, 20s));
  ASSERT_TRUE(g.run_to_completion(sink)) << g.host->crash_reason(g.dom);
  EXPECT_GE(g.max_batch, 2u) << "one process() answers every waiting mailbox";
  for (unsigned i = 0; i < 4; ++i) {
    const auto& p = sink.probes[g.sym(fns[i])];
    EXPECT_EQ(p.hits, kVcpus * expected_calls(idx[i], kIters)) << fns[i];
    for (unsigned v = 0; v < kVcpus; ++v) EXPECT_EQ(p.per_vcpu.at(v), expected_calls(idx[i], kIters)) << fns[i];
  }
  for (unsigned v = 0; v < kVcpus; ++v)
    EXPECT_EQ(g.stats(v).checksum, reference_stats(v, kIters, kVcpus).checksum) << "vcpu " << v;
  EXPECT_EQ(g.ch->module_counters(g.dom)->timeouts, 0u);
}

TEST(GuestChannel, RegistersGoBothWays) {
  constexpr std::uint64_t kIters = 3;
  ChannelGuest g(guest_config(1, kIters));
  g.attach();
  FakeSink sink;
  const std::uint64_t fn = g.sym("sys_getppid");
  // Return 42 from sys_getppid without running it: rip, rsp and rax come from Dom0.
  sink.probes[fn].on_hit = [&](channel::Stop& s) {
    EXPECT_EQ(s.vcpu.value, 0u);
    EXPECT_TRUE(s.regs.kernel_mode);
    EXPECT_NE(s.regs.cs, 0u);
    auto ra = g.memory->read_u64(Gva{s.regs.rsp});
    ASSERT_TRUE(ra);
    s.regs.rip = *ra;
    s.regs.rsp += 8;
    s.regs.rax = 42;
  };
  // sys_open's first argument is a path: the registers Dom0 sees are the guest's.
  std::set<std::string> paths;
  sink.skip(g.sym("sys_open")).on_hit = [&](channel::Stop& s) {
    auto str = g.memory->read_string(Gva{s.regs.rdi}, 64);
    ASSERT_TRUE(str);
    paths.insert(*str);
    s.regs.rip = s.trap.value + 5;
  };
  g.arm_skip("sys_getppid");
  g.arm_skip("sys_open");
  g.start();
  ASSERT_TRUE(g.run_to_completion(sink)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(sink.probes[fn].hits, expected_calls(DEMO_FN_GETPPID, kIters));
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], 0u) << "the body never ran";
  EXPECT_EQ(g.stats(0).iterations, kIters);
  EXPECT_NE(g.stats(0).checksum, reference_stats(0, kIters).checksum) << "42 instead of 1 changed it";
  ASSERT_FALSE(paths.empty());
  for (const auto& p : paths) EXPECT_EQ(p.front() == '/' || p == "relative/path", true) << p;
}

TEST(GuestChannel, NotOursResumesAtTheRestoredInstruction) {
  constexpr std::uint64_t kIters = 3;
  ChannelGuest g(guest_config(1, kIters));
  g.attach();
  FakeSink sink;
  const std::uint64_t fn = g.sym("sys_write");
  const auto original = g.peek(fn, 1);
  auto& p = sink.probes[fn];
  p.verdict = channel::Verdict::NotOurs;
  // The engine restores the byte, then says "not ours": the vCPU re-executes the original.
  p.on_hit = [&](channel::Stop& s) {
    s.regs.rip = 0xdeadbeef;  // ignored with NotOurs
    ASSERT_TRUE(g.memory->write(Gva{fn}, std::as_bytes(std::span(original))));
    g.ch->trap_removed(g.dom, Gva{fn});
  };
  g.arm_skip("sys_write");
  g.start();
  ASSERT_TRUE(g.run_to_completion(sink)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(p.hits, 1u);
  EXPECT_EQ(g.ch->traps(g.dom), 0u);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_WRITE], expected_calls(DEMO_FN_WRITE, kIters));
}

TEST(GuestChannel, AForeignInt3IsTheKernels) {
  // An int3 that is not in the table and still there: the module leaves it to the kernel
  // (the demo kernel has no IDT: it oopses, as it would without the module).
  ChannelGuest g(guest_config(1, 0));
  g.attach();
  const std::uint64_t fn = g.sym("sys_unlink");
  ASSERT_TRUE(g.hv->pause(g.dom));
  const std::uint8_t cc = 0xcc;
  ASSERT_TRUE(g.memory->write(Gva{fn}, std::as_bytes(std::span(&cc, 1))));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  g.start();
  ASSERT_TRUE(eventually([&] { return !g.host->crash_reason(g.dom).empty(); }));
  EXPECT_NE(g.host->crash_reason(g.dom).find("#BP"), std::string::npos) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.header().foreign, 1u);
}

// ---- attach --------------------------------------------------------------------------

void expect_refused(ChannelGuest& g, Errc code, std::initializer_list<std::string> parts) {
  GuestChannel ch(*g.hv);
  auto r = ch.attach(g.dom);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, code) << r.error().what;
  for (const auto& p : parts)
    EXPECT_NE(r.error().what.find(p), std::string::npos) << "'" << p << "' not in: " << r.error().what;
}

std::string key(ChannelGuest& g, const char* k) {
  return "/local/domain/" + std::to_string(g.dom.value) + "/" XENPROBES_XS_DIR "/" + k;
}

TEST(GuestChannelAttach, NoModule) {
  auto cfg = guest_config(1, 1);
  cfg.publish_module = false;
  ChannelGuest g(cfg);
  expect_refused(g, Errc::NotFound, {"guest channel needs the guest module", "not loaded", "insmod"});
}

TEST(GuestChannelAttach, ModuleNotReadyOrTooOld) {
  ChannelGuest g(guest_config(1, 1));
  ASSERT_TRUE(g.hv->xs_write(key(g, XENPROBES_XS_STATE), "starting"));
  expect_refused(g, Errc::Again, {"not ready"});
  ASSERT_TRUE(g.hv->xs_write(key(g, XENPROBES_XS_STATE), XENPROBES_XS_STATE_READY));
  const auto addr = *g.hv->xs_read(key(g, XENPROBES_XS_CONTROL_ADDR));
  ASSERT_TRUE(g.hv->xs_rm(key(g, XENPROBES_XS_CONTROL_ADDR)));
  expect_refused(g, Errc::NotFound, {"predates the guest channel", "debugger", "vmevent"});
  ASSERT_TRUE(g.hv->xs_write(key(g, XENPROBES_XS_CONTROL_ADDR), addr));
  ASSERT_TRUE(GuestChannel(*g.hv).attach(g.dom));
}

TEST(GuestChannelAttach, PagesMustBeMapped) {
  ChannelGuest g(guest_config(1, 1));
  const unsigned pages = static_cast<unsigned>(g.layout.control_size / 4096);
  ASSERT_TRUE(g.hv->xs_write(key(g, XENPROBES_XS_CONTROL_PAGES), std::to_string(pages + 1)));
  expect_refused(g, Errc::Fault, {"is not mapped"});
}

TEST(GuestChannelAttach, PortBoundByAnotherDom0) {
  ChannelGuest g(guest_config(1, 1));
  auto other = g.host->open();
  GuestChannel first(*other);
  ASSERT_TRUE(first.attach(g.dom));
  expect_refused(g, Errc::Busy, {"bound by another Dom0 process"});
}

TEST(GuestChannelAttach, HeaderRules) {
  ChannelGuest g(guest_config(2, 1));
  const auto good = g.header();
  auto with = [&](auto&& change, Errc code, std::initializer_list<std::string> parts) {
    auto h = good;
    change(h);
    ASSERT_TRUE(g.memory->write(Gva{g.layout.control_addr}, std::as_bytes(std::span(&h, 1))));
    expect_refused(g, code, parts);
    ASSERT_TRUE(g.memory->write(Gva{g.layout.control_addr}, std::as_bytes(std::span(&good, 1))));
  };
  const std::uint32_t size = static_cast<std::uint32_t>(g.layout.control_size);
  with([](auto& h) { h.magic ^= 1; }, Errc::InvalidArgument, {"magic"});
  with([](auto& h) { h.version = 2; }, Errc::InvalidArgument, {"header version 2"});
  with([](auto& h) { h.nr_mailboxes = 1; }, Errc::InvalidArgument, {"1 mailboxes for 2 vCPUs"});
  with([](auto& h) { h.trap_capacity = 0; }, Errc::InvalidArgument, {"0 entries"});
  with([](auto& h) { h.mailbox_offset = 8; }, Errc::InvalidArgument, {"overlap the header"});
  with([](auto& h) { h.mailbox_offset = 260; }, Errc::InvalidArgument, {"8-byte aligned"});
  with([&](auto& h) { h.trap_offset = size - 8; }, Errc::InvalidArgument, {"trap table", "do not fit"});
  with([](auto& h) { h.trap_capacity = 0xffffffff; }, Errc::InvalidArgument, {"do not fit"});
  with([](auto& h) { h.ret_offset = 0xfffffff8; }, Errc::InvalidArgument, {"return table", "do not fit"});
  with([&](auto& h) { h.ret_offset = h.trap_offset + 8; }, Errc::InvalidArgument, {"overlap the trap table"});
  with([&](auto& h) { h.trap_offset = h.mailbox_offset + 224; }, Errc::InvalidArgument, {"overlap the mailboxes"});
  with([](auto& h) { h.dom0_gone = 1; }, Errc::Busy, {"gave up on Dom0", "reload xenprobesU"});
  with([](auto& h) { h.nr_traps = 3; }, Errc::Busy, {"still lists 3 traps"});
  // An empty return table is allowed (no return probes then).
  auto h = good;
  h.ret_capacity = 0;
  ASSERT_TRUE(g.memory->write(Gva{g.layout.control_addr}, std::as_bytes(std::span(&h, 1))));
  GuestChannel ch(*g.hv);
  ASSERT_TRUE(ch.attach(g.dom));
  auto r = ch.return_added(g.dom, Gva{0xffff888000001000}, Gva{0xffffffff81000000});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::NoSpace);
}

TEST(GuestChannelAttach, DetachWritesNothingOnceTheModuleLeaves) {
  ChannelGuest g(guest_config(1, 1));
  g.attach();
  TrapEntry e;
  e.addr = Gva{g.sym("sys_open")};
  e.fallback = TrapEntry::Fallback::ResumeAt;
  e.resume_at = Gva{e.addr.value + 5};
  e.len = 5;
  ASSERT_TRUE(g.ch->trap_added(g.dom, e));
  ASSERT_TRUE(g.hv->xs_rm(key(g, XENPROBES_XS_STATE)));  // the module unloads: state goes first
  auto area = g.peek(g.layout.control_addr, g.layout.control_size);
  ASSERT_TRUE(g.ch->detach(g.dom));
  // Only the release (protocol.h "Letting go"): the module frees the area once it reads it.
  auto after = g.peek(g.layout.control_addr, g.layout.control_size);
  const std::size_t at = offsetof(xenprobes_ctl_header, dom0_hold);
  EXPECT_EQ(after[at], XENPROBES_DOM0_RELEASED);
  after[at] = area[at];
  EXPECT_EQ(after, area) << "more than the release was written";
  EXPECT_EQ(g.ch->traps(g.dom), 0u);
}

TEST(GuestChannelAttach, DetachAndAttachAgain) {
  ChannelGuest g(guest_config(1, 1));
  g.attach();
  ASSERT_TRUE(g.ch->detach(g.dom));
  ASSERT_TRUE(g.ch->detach(g.dom));  // twice is fine
  g.attach();
  GuestChannel other(*g.hv);
  EXPECT_FALSE(other.attach(g.dom));  // the port is ours again
}

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

// ---- Dom0 gone ---------------------------------------------------------------------------

struct FallbackCase {
  const char* name;
  const char* function;
  x86::BranchKind kind;  // None: the nop5 at the entry, resumed after it
};

class GuestChannelNoAnswer : public ::testing::TestWithParam<FallbackCase> {};

// Dom0 attached, armed, then never answers: each hit waits for the timeout and resumes as
// the entry says (the fallback runs the real instruction: the results are exact); after
// XENPROBES_DEAD_AFTER of them the module restores the text and the guest runs on unprobed.
TEST_P(GuestChannelNoAnswer, TheGuestFinishesOnItsOwn) {
  constexpr std::uint64_t kIters = 4;
  ChannelGuest g(guest_config(1, kIters, 20));
  g.attach();
  std::uint64_t addr = 0;
  if (GetParam().kind == x86::BranchKind::None) {
    addr = g.sym(GetParam().function);
    g.arm_skip(GetParam().function);
  } else {
    for (const auto& i : g.function(GetParam().function))
      if (i.branch == GetParam().kind) {
        addr = i.address.value;
        break;
      }
    ASSERT_NE(addr, 0u) << "no such instruction in " << GetParam().function;
    g.arm(addr, TrapEntry::Fallback::Emulate);
  }
  const auto original = g.peek(addr, 1);
  ASSERT_EQ(g.peek(addr, 1)[0], 0xcc);
  g.start();
  ASSERT_TRUE(g.advance_until_halted(20ms)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(g.stats(0).iterations, kIters);
  const auto h = g.header();
  EXPECT_EQ(h.timeouts, unsigned{XENPROBES_DEAD_AFTER});
  EXPECT_EQ(h.hits, unsigned{XENPROBES_DEAD_AFTER});
  EXPECT_EQ(h.dom0_gone, 1u);
  EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_ABANDONED);
  auto insn = x86::decode(g.peek(addr, 15), Gva{addr});
  ASSERT_TRUE(insn);
  EXPECT_NE(g.peek(addr, 1)[0], 0xcc) << "the module restored the byte";
  EXPECT_NE(g.host->console(g.dom).find("xenprobesU: Dom0 did not answer 3 hits in a row"), std::string::npos);
  // Dom0 coming back finds a module that gave up, and is told so.
  GuestChannel again(*g.hv);
  ASSERT_TRUE(g.ch->detach(g.dom));
  auto r = again.attach(g.dom);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Busy) << r.error().what;
}

INSTANTIATE_TEST_SUITE_P(Fallbacks, GuestChannelNoAnswer,
                         ::testing::Values(FallbackCase{"ResumeAt", "sys_open", x86::BranchKind::None},
                                           FallbackCase{"EmulateRet", "sys_getppid", x86::BranchKind::Ret},
                                           FallbackCase{"EmulateCall", "demo_recurse", x86::BranchKind::Call},
                                           FallbackCase{"EmulateJcc", "demo_recurse", x86::BranchKind::Jcc},
                                           FallbackCase{"EmulateJcc2", "demo_classify", x86::BranchKind::Jcc},
                                           FallbackCase{"EmulateJmp", "demo_dispatch", x86::BranchKind::Jmp}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(GuestChannelDom0Gone, KilledWhileVcpusWait) {
  constexpr unsigned kVcpus = 2;
  constexpr std::uint64_t kIters = 6;
  ChannelGuest g(guest_config(kVcpus, kIters, 30));
  g.attach();
  FakeSink sink;
  const char* fns[] = {"sys_open", "sys_read", "demo_recurse"};
  std::vector<std::uint64_t> addrs;
  std::vector<std::vector<std::uint8_t>> originals;
  for (const char* f : fns) {
    addrs.push_back(g.sym(f));
    originals.push_back(g.peek(g.sym(f), 5));
    sink.skip(g.sym(f));
    g.arm_skip(f);
  }
  g.start();
  // Dom0 serves a while, then dies with a vCPU waiting in the hook.
  ASSERT_TRUE(g.pump_until(sink, [&] { return sink.total >= 20; })) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.header().timeouts, 0u) << "the clock stood still while Dom0 served";
  ASSERT_TRUE(eventually([&] { return g.mailboxes_in(XENPROBES_MBOX_HIT, kVcpus) >= 1; }));
  g.kill_dom0();
  ASSERT_TRUE(g.advance_until_halted(30ms)) << g.host->crash_reason(g.dom);
  for (unsigned v = 0; v < kVcpus; ++v) {
    EXPECT_EQ(g.stats(v).checksum, reference_stats(v, kIters, kVcpus).checksum) << "vcpu " << v;
    EXPECT_EQ(g.stats(v).calls[DEMO_FN_OPEN], expected_calls(DEMO_FN_OPEN, kIters));
  }
  const auto h = g.header();
  EXPECT_EQ(h.dom0_gone, 1u);
  // The third timeout in a row declares Dom0 gone; a vCPU waiting at that moment is released
  // as one more.
  EXPECT_GE(h.timeouts, unsigned{XENPROBES_DEAD_AFTER});
  EXPECT_LE(h.timeouts, unsigned{XENPROBES_DEAD_AFTER} + kVcpus - 1);
  for (std::size_t i = 0; i < addrs.size(); ++i) EXPECT_EQ(g.peek(addrs[i], 5), originals[i]) << fns[i];
}

TEST(GuestChannelDom0Gone, ReturnsFinishThroughTheReturnTable) {
  // A return probe the way the engine does it: at the entry the return address on the stack
  // becomes the trampoline (a trap byte in the OEA) and the real one goes into the return
  // table; at the trampoline Dom0 sends the vCPU back. Dom0 dies right after an entry: the
  // module finishes that return from the table.
  constexpr std::uint64_t kIters = 4;
  ChannelGuest g(guest_config(1, kIters, 30));
  g.attach();
  const std::uint64_t fn = g.sym("sys_getppid");
  const std::uint64_t tramp = g.layout.oea_addr + 0x40;
  std::map<std::uint64_t, std::uint64_t> live;  // stack slot -> real return address
  std::uint64_t entries = 0, returns = 0;
  bool kill = false;
  FakeSink sink;
  sink.probes[fn].on_hit = [&](channel::Stop& s) {
    auto ra = g.memory->read_u64(Gva{s.regs.rsp});
    ASSERT_TRUE(ra);
    ASSERT_TRUE(g.ch->return_added(g.dom, Gva{s.regs.rsp}, Gva{*ra}));
    ASSERT_TRUE(g.memory->write_u64(Gva{s.regs.rsp}, tramp));
    live[s.regs.rsp] = *ra;
    s.regs.rip = fn + 5;
    if (++entries == 5) kill = true;
  };
  sink.probes[tramp].on_hit = [&](channel::Stop& s) {
    const std::uint64_t slot = s.regs.rsp - 8;
    ASSERT_TRUE(live.contains(slot));
    s.regs.rip = live[slot];
    live.erase(slot);
    g.ch->return_removed(g.dom, Gva{slot});
    ++returns;
  };
  // The trampoline: one trap byte in a slot, with the return fallback.
  ASSERT_TRUE(g.hv->pause(g.dom));
  TrapEntry t;
  t.addr = Gva{tramp};
  t.fallback = TrapEntry::Fallback::Return;
  t.len = 1;
  t.insn[0] = 0xcc;
  ASSERT_TRUE(g.ch->trap_added(g.dom, t));
  const std::uint8_t cc = 0xcc;
  ASSERT_TRUE(g.memory->write(Gva{tramp}, std::as_bytes(std::span(&cc, 1))));
  ASSERT_TRUE(g.hv->unpause(g.dom));
  g.arm_skip("sys_getppid");
  g.start();
  ASSERT_TRUE(g.pump_until(sink, [&] { return kill; })) << g.host->crash_reason(g.dom);
  EXPECT_EQ(returns, entries - 1);
  EXPECT_EQ(live.size(), 1u);
  EXPECT_EQ(g.header().timeouts, 0u);
  g.kill_dom0();
  ASSERT_TRUE(g.advance_until_halted(30ms)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], expected_calls(DEMO_FN_GETPPID, kIters));
  const auto h = g.header();
  EXPECT_EQ(h.dom0_gone, 1u);
  const auto rets = g.return_table();
  ASSERT_EQ(rets.size(), h.ret_capacity);
  for (const auto& r : rets) EXPECT_EQ(r.slot, 0u) << "the module used and cleared the entry";
  EXPECT_EQ(g.peek(fn, 1)[0], 0x0f) << "the entry's byte is restored";
  EXPECT_EQ(g.peek(tramp, 1)[0], 0xcc) << "the trampoline is in the OEA: left alone";
}

// ---- the claim ----------------------------------------------------------------------------

TEST(GuestChannelClaim, ASlowHandlerIsWaitedFor) {
  // The module waits timeout_ms (30) for Dom0 to claim a hit, and a claimed hit up to the
  // claim bound (600 ms here). Handlers that take three timeouts of the module's clock -- one
  // of them after writing guest memory, as a call Dom0 emulates pushes its return address --
  // are waited for: every answer is applied and nothing times out.
  constexpr std::uint64_t kIters = 2;
  constexpr unsigned kTimeoutMs = 30;
  ChannelGuest g(guest_config(1, kIters, kTimeoutMs));
  g.attach();
  FakeSink sink;
  std::optional<x86::Insn> call;
  for (const auto& i : g.function("demo_recurse"))
    if (i.branch == x86::BranchKind::Call) {
      call = i;
      break;
    }
  ASSERT_TRUE(call);
  unsigned slow_getppid = 0, slow_call = 0;
  auto take_long = [&](unsigned& slow) {
    if (slow >= 2) return;
    ++slow;
    EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED);
    g.advance(std::chrono::milliseconds(3 * kTimeoutMs));  // past timeout_ms, within the bound
    EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED) << "the module waits on for a claimed hit";
  };
  // sys_getppid returns 42 without running: only Dom0's answer does that (the module's
  // fallback would run the body).
  const std::uint64_t getppid = g.sym("sys_getppid");
  sink.probes[getppid].on_hit = [&](channel::Stop& s) {
    take_long(slow_getppid);
    auto ra = g.memory->read_u64(Gva{s.regs.rsp});
    ASSERT_TRUE(ra);
    s.regs.rip = *ra;
    s.regs.rsp += 8;
    s.regs.rax = 42;
  };
  sink.probes[call->address.value].on_hit = [&](channel::Stop& s) {
    const std::uint64_t ret = s.trap.value + call->length;
    ASSERT_TRUE(g.memory->write_u64(Gva{s.regs.rsp - 8}, ret));
    take_long(slow_call);  // after the write: without the claim the module would have moved on
    s.regs.rsp -= 8;
    s.regs.rip = call->branch_target.value;
  };
  g.arm_skip("sys_getppid");
  g.arm(call->address.value, TrapEntry::Fallback::Emulate);
  g.start();
  ASSERT_TRUE(g.run_to_completion(sink)) << g.host->crash_reason(g.dom);
  EXPECT_EQ(slow_getppid, 2u);
  EXPECT_EQ(slow_call, 2u);
  EXPECT_EQ(g.stats(0).iterations, kIters);
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_GETPPID], 0u) << "every answer was applied";
  EXPECT_EQ(sink.probes[getppid].hits, expected_calls(DEMO_FN_GETPPID, kIters));
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_RECURSE], expected_calls(DEMO_FN_RECURSE, kIters));
  EXPECT_EQ(g.stats(0).calls[DEMO_FN_OPEN], expected_calls(DEMO_FN_OPEN, kIters));
  const auto h = g.header();
  EXPECT_EQ(h.timeouts, 0u);
  EXPECT_EQ(h.dom0_gone, 0u);
  const auto st = g.ch->stats(g.dom);
  EXPECT_EQ(st.answered, sink.total);
  EXPECT_EQ(st.late, 0u);
  EXPECT_EQ(st.abandoned, 0u);
}

TEST(GuestChannelClaim, AHandlerPastTheClaimBoundIsGivenUpOnAndItsAnswerDropped) {
  // Dom0 hangs in a handler: the module waits the claim bound (1 s for a 50 ms timeout,
  // counted from the hit), then resumes on its own (counted as a timeout); Dom0's answer, when
  // it comes, is dropped as late and written nowhere. Dom0 answers everything else.
  constexpr std::uint64_t kIters = 2;
  constexpr unsigned kTimeoutMs = 50;
  ChannelGuest g(guest_config(1, kIters, kTimeoutMs));
  g.attach();
  FakeSink sink;
  bool hung = false;
  std::uint32_t hung_seq = 0;
  sink.skip(g.sym("sys_open")).on_hit = [&](channel::Stop& s) {
    s.regs.rip = s.trap.value + 5;
    if (hung) return;
    hung = true;
    hung_seq = g.mailbox(0).seq;
    EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED);
    g.advance(claim_bound(kTimeoutMs) - 1ms);
    EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED) << "still within the bound";
    EXPECT_EQ(g.header().timeouts, 0u);
    g.advance(1ms);  // given up on: the vCPU runs on (and may hit again at once)
    EXPECT_NE(g.mailbox(0).state, XENPROBES_MBOX_CLAIMED) << "the bound has passed";
    EXPECT_EQ(g.header().timeouts, 1u);
  };
  g.arm_skip("sys_open");
  g.start();
  ASSERT_TRUE(g.run_to_completion(sink)) << g.host->crash_reason(g.dom);
  ASSERT_TRUE(hung);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  const auto h = g.header();
  EXPECT_EQ(h.timeouts, 1u);
  EXPECT_EQ(h.dom0_gone, 0u);
  const auto st = g.ch->stats(g.dom);
  EXPECT_EQ(st.late, 1u);
  EXPECT_EQ(st.answered, sink.total - 1);
  EXPECT_NE(g.mailbox(0).answer_seq, hung_seq) << "the late answer was not written";
}

TEST(GuestChannelClaim, ADom0ThatDiesHoldingAClaimLeavesTheGuestRunning) {
  // Another Dom0 claims a hit and dies in its handler: the vCPU waits the claim bound, then
  // the module resumes it and every later hit on its own, and restores the text.
  constexpr std::uint64_t kIters = 3;
  constexpr unsigned kTimeoutMs = 50;
  ChannelGuest g(guest_config(1, kIters, kTimeoutMs));
  g.attach();
  g.arm_skip("sys_open");
  g.arm_skip("demo_recurse");
  const auto h = g.header();
  auto other = g.host->open();
  const hv::ForeignMapping map = g.map_control(*other);
  auto state = ChannelGuest::mailbox_word(map, h, 0, offsetof(xenprobes_mailbox, state));
  g.kill_dom0();  // the channel never answers anything
  ASSERT_TRUE(other->unpause(g.dom));
  // Claim the first hit (the module's clock stands still: it cannot give up on it first).
  ASSERT_TRUE(eventually(
      [&] {
        std::uint32_t expected = XENPROBES_MBOX_HIT;
        return state.compare_exchange_strong(expected, XENPROBES_MBOX_CLAIMED);
      },
      20s));
  g.advance(claim_bound(kTimeoutMs) - 1ms);
  EXPECT_EQ(state.load(), XENPROBES_MBOX_CLAIMED) << "the claim is honoured up to the bound";
  EXPECT_EQ(g.header().timeouts, 0u);
  g.advance(1ms);
  EXPECT_NE(state.load(), XENPROBES_MBOX_CLAIMED) << "and given up on once it has passed";
  EXPECT_EQ(g.header().timeouts, 1u);
  ASSERT_TRUE(g.advance_until_halted(std::chrono::milliseconds(kTimeoutMs))) << g.host->crash_reason(g.dom);
  EXPECT_EQ(g.stats(0).checksum, reference_stats(0, kIters).checksum);
  EXPECT_EQ(g.stats(0).iterations, kIters);
  const auto after = g.header();
  EXPECT_EQ(after.timeouts, unsigned{XENPROBES_DEAD_AFTER}) << "the expired claim counts as a timeout";
  EXPECT_EQ(after.dom0_gone, 1u);
  EXPECT_EQ(g.peek(g.sym("sys_open"), 5), (std::vector<std::uint8_t>{0x0f, 0x1f, 0x44, 0x00, 0x00}));
}

TEST(GuestChannelClaim, ResumesInFlightWhileClaimedAndUntilTakenUp) {
  ChannelGuest g(guest_config(1, 0, 10000));
  g.attach();
  FakeSink sink;
  const std::uint64_t fn = g.sym("sys_open");
  const std::uint64_t fallback = g.layout.oea_addr + 0x100;  // as if a slot held the nop
  std::vector<std::uint64_t> during;
  sink.skip(fn).on_hit = [&](channel::Stop& s) {
    during = g.ch->resumes_in_flight(g.dom);
    s.regs.rip = fn + 5;
  };
  g.arm(fn, TrapEntry::Fallback::ResumeAt, fallback);
  g.start();
  ASSERT_TRUE(eventually([&] { return g.mailboxes_in(XENPROBES_MBOX_HIT, 1) == 1; }));
  ASSERT_TRUE(g.hv->pause(g.dom));  // a paused guest takes up no answer
  EXPECT_TRUE(g.ch->resumes_in_flight(g.dom).empty()) << "an unclaimed hit is the module's";
  auto n = g.ch->flush(g.dom, sink);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 1u);
  // Claimed: the vCPU resumes at the answer being made, or at the entry's fallback.
  EXPECT_EQ(during, (std::vector<std::uint64_t>{fn, fallback}));
  // Answered, not taken up yet.
  EXPECT_EQ(g.ch->resumes_in_flight(g.dom), std::vector<std::uint64_t>{fn + 5});
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(eventually([&] { return g.ch->resumes_in_flight(g.dom).empty(); }));
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty());
}

TEST(GuestChannelClaim, DetachFromAHandlerGivesTheClaimBack) {
  // The engine lets go of the domain inside a handler: the hit is given back (HIT), so the
  // module resumes it after timeout_ms instead of waiting out the claim bound.
  constexpr unsigned kTimeoutMs = 100;
  ChannelGuest g(guest_config(1, 0, kTimeoutMs));
  g.attach();
  FakeSink sink;
  const std::uint64_t fn = g.sym("sys_open");
  std::uint32_t seq = 0;
  const auto original = g.peek(fn, 1);
  sink.skip(fn).on_hit = [&](channel::Stop& s) {
    seq = g.mailbox(0).seq;
    // As the engine does: the byte first, then the channel lets go.
    ASSERT_TRUE(g.memory->write(Gva{fn}, std::as_bytes(std::span(original))));
    ASSERT_TRUE(g.ch->detach(g.dom));
    s.regs.rip = fn + 5;
  };
  g.arm_skip("sys_open");
  g.start();
  ASSERT_TRUE(g.pump_until(
      sink, [&] { return sink.total == 1; }, 10s));
  EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_HIT) << "the claim was given back";
  // Resumed by the module's timeout, not after the claim bound (2 s).
  g.advance(std::chrono::milliseconds(kTimeoutMs) - 1ms);
  EXPECT_EQ(g.header().timeouts, 0u);
  g.advance(1ms);
  EXPECT_EQ(g.header().timeouts, 1u);
  EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_ABANDONED);
  EXPECT_EQ(g.mailbox(0).seq, seq);
  EXPECT_NE(g.mailbox(0).answer_seq, seq);
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
}

// ---- the module's clock -------------------------------------------------------------------

TEST(GuestChannelClock, AHitTimesOutWhenTheModulesClockSaysSoNotTheMachine) {
  // The fixture's hosts run the module on a manual clock: real time passing (a loaded
  // machine, a slow Dom0) times nothing out; advancing the clock past timeout_ms does, at once.
  constexpr unsigned kTimeoutMs = 30;
  ChannelGuest g(guest_config(1, 0, kTimeoutMs));
  g.attach();
  g.arm_skip("sys_open");
  g.start();
  ASSERT_TRUE(eventually([&] { return g.mailboxes_in(XENPROBES_MBOX_HIT, 1) == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(5 * kTimeoutMs));
  EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_HIT) << "real time does not time a hit out";
  g.advance(std::chrono::milliseconds(kTimeoutMs) - 1ms);
  EXPECT_EQ(g.mailbox(0).state, XENPROBES_MBOX_HIT);
  EXPECT_EQ(g.header().timeouts, 0u);
  g.advance(1ms);
  EXPECT_EQ(g.header().timeouts, 1u) << "the clock passed timeout_ms";
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
  // Only a manual clock moves on demand.
  auto real = hv::sim::SimHost::create();
  auto r = real->advance_clock(1ms);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::InvalidArgument);
}

TEST(GuestChannelClock, TheModuleSumsItsWaitsForDom0AndKeepsTheLongest) {
  // protocol.h, header.wait_ns and wait_max_ns: each hit's wait from its mailbox write to its
  // answer taken or its timeout, on the module's clock. Three hits: answered after 7 ms and
  // after 3 ms, then one left to time out at 30 ms.
  constexpr unsigned kTimeoutMs = 30;
  ChannelGuest g(guest_config(1, 0, kTimeoutMs));
  g.attach();
  FakeSink sink;
  const TrapEntry e = g.arm_skip("sys_open");
  sink.skip(e.addr.value);
  g.start();
  ASSERT_TRUE(hit_with_seq(g, 1));
  g.advance(7ms);
  EXPECT_EQ(g.pump(sink), 1u);
  ASSERT_TRUE(hit_with_seq(g, 2)) << "the answer to the first hit taken up, the next hit made";
  EXPECT_EQ(g.header().wait_ns, 7'000'000u);
  g.advance(3ms);
  EXPECT_EQ(g.pump(sink), 1u);
  ASSERT_TRUE(hit_with_seq(g, 3));
  g.advance(std::chrono::milliseconds(kTimeoutMs));  // the third: no answer
  EXPECT_EQ(g.header().timeouts, 1u);
  EXPECT_EQ(g.header().wait_ns, 40'000'000u);
  EXPECT_EQ(g.header().wait_max_ns, 30'000'000u);
  auto c = g.ch->module_counters(g.dom);  // Dom0 reads the module's figures as they are
  ASSERT_TRUE(c) << c.error().what;
  EXPECT_EQ(c->wait_ns, 40'000'000u);
  EXPECT_EQ(c->wait_max_ns, 30'000'000u);
}

TEST(GuestChannelClock, AVcpuThatSpentItsWaitingBudgetResumesWithoutDom0UntilItSwitches) {
  // protocol.h "Waiting budget": the waits of a vCPU's hits since its last context switch add
  // up; past the budget its hits take the fallback without a mailbox write, counted in
  // over_budget (not in timeouts), until the vCPU switches.
  constexpr unsigned kTimeoutMs = 30;
  ChannelGuest g(guest_config(1, 0, kTimeoutMs));
  ASSERT_TRUE(g.host->set_module_wait_budget(g.dom, 20ms));
  g.attach();
  FakeSink sink;
  const TrapEntry e = g.arm_skip("sys_open");
  sink.skip(e.addr.value);
  g.start();
  for (std::uint32_t seq = 1; seq <= 2; ++seq) {  // 7 + 7 ms: within the budget
    ASSERT_TRUE(hit_with_seq(g, seq));
    g.advance(7ms);
    EXPECT_EQ(g.pump(sink), 1u);
  }
  ASSERT_TRUE(hit_with_seq(g, 3));
  EXPECT_EQ(g.header().over_budget, 0u);
  g.advance(6ms);  // 20 ms in all: spent
  EXPECT_EQ(g.pump(sink), 1u);
  // The guest runs on through sys_open, each hit resumed by the fallback with no mailbox write.
  ASSERT_TRUE(eventually([&] { return g.header().over_budget >= 3; }));
  EXPECT_EQ(g.mailbox(0).seq, 3u) << "no hit went to the mailbox";
  EXPECT_NE(g.mailbox(0).state, XENPROBES_MBOX_HIT);
  EXPECT_EQ(g.header().timeouts, 0u) << "an over-budget hit says nothing about Dom0";
  EXPECT_EQ(g.header().dom0_gone, 0u);
  EXPECT_EQ(g.header().hits, 3u);
  auto c = g.ch->module_counters(g.dom);
  ASSERT_TRUE(c) << c.error().what;
  EXPECT_GE(c->over_budget, 3u);
  // The guest kernel switches tasks on the vCPU: its hits go to Dom0 again.
  ASSERT_TRUE(g.host->vcpu_switched(g.dom, VcpuId{0}));
  ASSERT_TRUE(hit_with_seq(g, 4));
  const std::uint64_t over = g.header().over_budget;
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(g.header().over_budget, over) << "the vCPU waits in its mailbox, over budget no more";
  auto n = g.host->module_over_budget(g.dom);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, over);
  EXPECT_EQ(g.header().wait_ns, 20'000'000u);
  EXPECT_TRUE(g.host->crash_reason(g.dom).empty()) << g.host->crash_reason(g.dom);
}

// ---- detaching --------------------------------------------------------------------------

TEST(GuestChannelDetach, ATrapAddedOnceTheModuleBeganDetachingIsRefusedWithNothingWritten) {
  // protocol.h "Detaching": the module sets closing before its restore pass reads the trap
  // table; Dom0 learns of the detach from its xenstore watch only later, so a trap added in
  // between would outlive the module. Dom0 reads closing with the domain paused and refuses.
  ChannelGuest g(guest_config(1, 0));
  g.attach();
  const TrapEntry armed = g.arm_skip("sys_open");  // before: the restore pass takes it out
  const std::uint64_t other = g.sym("sys_read");
  const auto original = g.peek(other, 16);
  auto restored = g.host->module_detach(g.dom);
  ASSERT_TRUE(restored) << restored.error().what;
  EXPECT_EQ(*restored, 1u);
  EXPECT_EQ(g.header().closing, 1u);
  EXPECT_EQ(g.peek(armed.addr.value, 5), (std::vector<std::uint8_t>{0x0f, 0x1f, 0x44, 0x00, 0x00}));
  const auto nr = g.header().nr_traps;
  // The watch on `state` has fired, but Dom0 has not read it (no loop ran): a registration
  // under way meanwhile reaches the channel, which must refuse the entry.
  try {
    g.arm(other, TrapEntry::Fallback::Emulate);
    ADD_FAILURE() << "a trap was added to the table of a module that is detaching";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("detaching"), std::string::npos) << e.what();
  }
  EXPECT_EQ(g.header().nr_traps, nr) << "the table is unchanged";
  EXPECT_EQ(g.peek(other, 16), original) << "nothing was written";
  // A trap already in the table is not changed either (re-armed in place).
  TrapEntry again = armed;
  again.resume_at = Gva{armed.resume_at.value + 1};
  ASSERT_TRUE(g.hv->pause(g.dom));
  auto r = g.ch->trap_added(g.dom, again);
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::Busy);
}

// ---- quiescence --------------------------------------------------------------------------

TEST(GuestChannelQuiesce, DoneOnlyOnceNoVcpuIsInTheHook) {
  ChannelGuest g(guest_config(1, 0, 10000));
  g.attach();
  FakeSink sink;
  const std::uint64_t fn = g.sym("sys_open");
  sink.skip(fn);
  g.arm_skip("sys_open");
  const std::string req = key(g, XENPROBES_XS_QUIESCE_REQUEST), done = key(g, XENPROBES_XS_QUIESCE_DONE);
  ASSERT_TRUE(g.hv->xs_watch(done, "q"));
  g.start();
  ASSERT_TRUE(eventually([&] { return g.mailboxes_in(XENPROBES_MBOX_HIT, 1) == 1; }));
  ASSERT_TRUE(g.hv->xs_write(req, "17"));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(g.hv->xs_read(done).error().code, Errc::NotFound) << "a vCPU is still in the hook";
  // Answered, the vCPU leaves the hook (and comes back: Dom0 keeps answering).
  ASSERT_TRUE(g.pump_until(
      sink, [&] { return g.hv->xs_read(done).value_or("") == "17"; }, 10s));
  // A paused guest cannot quiesce (nothing runs); it answers once it runs again.
  ASSERT_TRUE(g.hv->pause(g.dom));
  ASSERT_TRUE(g.hv->xs_write(req, "18"));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(*g.hv->xs_read(done), "17");
  ASSERT_TRUE(g.hv->unpause(g.dom));
  ASSERT_TRUE(g.pump_until(
      sink, [&] { return g.hv->xs_read(done).value_or("") == "18"; }, 10s));
  auto ev = g.hv->xs_read_watches();
  ASSERT_TRUE(ev);
  EXPECT_TRUE(std::any_of(ev->begin(), ev->end(), [&](const auto& e) { return e.path == done; }));
}

}  // namespace
}  // namespace xenprobes::testing
