// The guest channel end to end over the simulated Xen: hits, several vCPUs at once, the
// registers both ways, refusals at attach, detaching and quiescence. The trap and return tables
// are in guestch_tables_test.cpp, a Dom0 that dies or never answers in guestch_no_answer_test.cpp.
#include <algorithm>
#include <set>

#include "guestch/guestch_fixture.hpp"

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
