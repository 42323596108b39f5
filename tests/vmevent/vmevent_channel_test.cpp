// The vm_event channel over the simulated Xen, with a fake engine (FakeSink, vmevent_rig.hpp):
// opening and attaching, and the refusals; what a stop carries and how it is answered, a full
// ring; foreign traps handed back to the guest.
#include <map>

#include "vmevent/vmevent_rig.hpp"

namespace xenprobes::testing {
namespace {

// ---- opening and attaching -----------------------------------------------------------

TEST(VmEventChannel, RefusesAHypervisorWithoutTheMonitor) {
  Dom0Guest g(hvm(1, 1));
  RecordingHv rec(*g.hv);
  rec.vm_event = false;
  auto ch = VmEventChannel::open(rec);
  ASSERT_FALSE(ch);
  EXPECT_EQ(ch.error().code, Errc::NotSupported);
  EXPECT_NE(ch.error().what.find("guest channel"), std::string::npos) << ch.error().what;
}

TEST(VmEventChannel, ModesPickTheirTrapByte) {
  Rig icebp(hvm(1, 1), Mode::Icebp);
  EXPECT_EQ(icebp.ch->traits().trap_byte, 0xf1);
  EXPECT_FALSE(icebp.ch->traits().can_emulate);
  EXPECT_FALSE(icebp.ch->traits().stops_found_by_rip);
  EXPECT_FALSE(icebp.ch->traits().guest_int3);
  EXPECT_EQ(icebp.ch->trap_table(), nullptr) << "the engine keeps no trap table for it";
  EXPECT_EQ(icebp.ch->poll_interval_ms(), 0);
  EXPECT_GE(icebp.ch->fd(), 0);
  auto dflt = VmEventChannel::open(*icebp.g.hv);
  ASSERT_TRUE(dflt);
  EXPECT_EQ((*dflt)->mode(), Mode::Icebp) << "ICEBP is the default";

  Rig int3(hvm(1, 1), Mode::Int3);
  EXPECT_EQ(int3.ch->traits().trap_byte, 0xcc);
  EXPECT_TRUE(int3.ch->traits().can_emulate);
  // The mode decides which monitoring goes on.
  int3.attach();
  icebp.attach();
  EXPECT_EQ(int3.g.host->op_count(Op::MonitorSoftwareBreakpoint), 1u);
  EXPECT_EQ(int3.g.host->op_count(Op::MonitorDebugExceptions), 0u);
  EXPECT_EQ(icebp.g.host->op_count(Op::MonitorDebugExceptions), 1u);
  EXPECT_EQ(icebp.g.host->op_count(Op::MonitorSoftwareBreakpoint), 0u);
}

TEST(VmEventChannel, PvDomainIsRefusedNamingWhatWouldWork) {
  DomainConfig c = hvm(1, 1);
  c.type = GuestType::Pv;
  Rig r(c, Mode::Icebp);
  auto a = r.ch->attach(r.g.dom);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Errc::NotSupported);
  EXPECT_NE(a.error().what.find("PV"), std::string::npos) << a.error().what;
  EXPECT_NE(a.error().what.find("guest channel"), std::string::npos) << a.error().what;
  EXPECT_NE(a.error().what.find("debugger channel"), std::string::npos) << a.error().what;
  EXPECT_EQ(r.g.host->op_count(Op::MonitorEnable), 0u) << "refused before touching the domain";
}

TEST(VmEventChannel, BusyMonitorIsRefused) {
  Rig r(hvm(1, 1), Mode::Icebp);
  auto other = r.g.host->open();  // another tool holds the domain's one monitor ring
  auto ring = other->monitor_enable(r.g.dom);
  ASSERT_TRUE(ring);
  auto a = r.ch->attach(r.g.dom);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Errc::Busy);
  EXPECT_NE(a.error().what.find("already has a vm_event monitor"), std::string::npos) << a.error().what;
  ASSERT_TRUE(other->monitor_disable(r.g.dom));
  r.attach();  // free again: works
}

TEST(VmEventChannel, DomainInDebuggingModeIsRefused) {
  Rig r(hvm(1, 1), Mode::Int3);
  ASSERT_TRUE(r.g.hv->set_debugging(r.g.dom, true));
  auto a = r.ch->attach(r.g.dom);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Errc::Busy);
  EXPECT_NE(a.error().what.find("debugging mode"), std::string::npos) << a.error().what;
  EXPECT_EQ(r.g.host->op_count(Op::MonitorEnable), 0u);
}

TEST(VmEventChannel, FailedMonitoringSetupLeavesNoRing) {
  Rig r(hvm(1, 1), Mode::Icebp);
  r.g.host->fail_op(Op::MonitorDebugExceptions, Errc::Io);
  ASSERT_FALSE(r.ch->attach(r.g.dom));
  r.attach();  // the ring was disabled again: a second attach can enable it
}

// ---- stops ---------------------------------------------------------------------------

TEST(VmEventChannel, StopsCarryTheVcpuTheTrapAndTheRegisters) {
  const std::uint64_t iters = 4;
  auto ref = reference(2, iters);
  Rig r(hvm(2, iters), Mode::Icebp);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_unlink"), stacks = r.g.sym(DEMO_SYM_STACKS);
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);

  std::map<unsigned, unsigned> per_vcpu;
  for (const Stop& s : sink.stops) {
    EXPECT_EQ(s.domain, r.g.dom);
    EXPECT_EQ(s.trap.value, fn);
    EXPECT_EQ(s.regs.rip, fn) << "the stop is reported at the ICEBP, not after it";
    ASSERT_LT(s.vcpu.value, 2u);
    EXPECT_GE(s.regs.rsp, stacks + s.vcpu.value * DEMO_STACK_SIZE) << "the registers of that vCPU";
    EXPECT_LT(s.regs.rsp, stacks + (s.vcpu.value + 1) * DEMO_STACK_SIZE);
    EXPECT_NE(s.regs.cr3, 0u);
    per_vcpu[s.vcpu.value]++;
  }
  for (unsigned v = 0; v < 2; ++v) {
    EXPECT_EQ(per_vcpu[v], expected_calls(DEMO_FN_UNLINK, iters));
    EXPECT_EQ(r.g.stats(v).calls[DEMO_FN_UNLINK], ref[v].calls[DEMO_FN_UNLINK]);
    EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
  }
  EXPECT_EQ(r.ch->counters().stops, sink.stops.size());
  EXPECT_TRUE(r.rec.injected.empty());
  // Each answer: unpause + SET_REGISTERS with the sink's rip.
  ASSERT_EQ(r.rec.responses.size(), sink.stops.size());
  for (const auto& rsp : r.rec.responses) {
    EXPECT_EQ(rsp.flags, kPaused | hv::kVmEventFlagSetRegisters);
    EXPECT_EQ(rsp.regs.rip, fn + 5);
    EXPECT_EQ(rsp.reason, hv::VmEventReason::DebugException);
  }
  EXPECT_EQ(r.ch->poll_interval_ms(), 0) << "nothing to poll for";
}

TEST(VmEventChannel, FdIsReadableWhileAStopWaits) {
  Rig r(hvm(1, 2), Mode::Int3);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_read");
  r.patch(fn, 0xcc);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  pollfd p{r.ch->fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "nothing yet";
  r.start();
  ASSERT_EQ(::poll(&p, 1, 10000), 1) << "a stop makes the channel's fd readable";
  EXPECT_TRUE(p.revents & POLLIN);
  ASSERT_TRUE(r.run_to_completion(sink));
  EXPECT_EQ(sink.stops.size(), expected_calls(DEMO_FN_READ, 2));
  ASSERT_TRUE(r.ch->process(sink));
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "quiet again once everything is answered";
}

// The sink's registers are what the vCPU resumes with: here sys_getppid returns 42 at once.
TEST(VmEventChannel, AnswersResumeWhereTheSinkSays) {
  auto ref42 = reference(1, 5, 42);
  Rig r(hvm(1, 5), Mode::Int3);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_getppid");
  r.patch(fn, 0xcc);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = [&](Stop& s) {
    auto ra = r.gm->read_u64(Gva{s.regs.rsp});
    EXPECT_TRUE(ra);
    s.regs.rip = *ra;
    s.regs.rsp += 8;
    s.regs.rax = 42;
    return Verdict::Resume;
  };
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  EXPECT_EQ(sink.stops.size(), expected_calls(DEMO_FN_GETPPID, 5));
  EXPECT_EQ(r.g.stats(0).calls[DEMO_FN_GETPPID], 0u) << "the body never ran";
  EXPECT_EQ(r.g.stats(0).checksum, ref42[0].checksum) << "the guest saw 42 every time";
}

// NotOurs: the engine put the original byte back; the vCPU re-executes it at the trap.
TEST(VmEventChannel, NotOursResumesAtTheTrapUnchanged) {
  auto ref = reference(1, 3);
  Rig r(hvm(1, 3), Mode::Icebp);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_open");
  const std::uint8_t orig = r.byte_at(fn);
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = [&](Stop& s) {
    EXPECT_TRUE(r.gm->write_u8(Gva{fn}, orig));  // disarmed while the vCPU was stopped on it
    s.regs.rax = 0xbad;                          // must not be applied
    return Verdict::NotOurs;
  };
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  ASSERT_EQ(sink.stops.size(), 1u);
  ASSERT_EQ(r.rec.responses.size(), 1u);
  EXPECT_EQ(r.rec.responses[0].flags, kPaused) << "no registers set: the vCPU stays on the trap address";
  EXPECT_EQ(r.g.stats(0).checksum, ref[0].checksum);
  EXPECT_EQ(r.g.stats(0).calls[DEMO_FN_OPEN], expected_calls(DEMO_FN_OPEN, 3));
}

// More vCPUs trapping at once than the ring has slots: the others wait for room, and every
// stop still arrives exactly once.
TEST(VmEventChannel, MoreStoppedVcpusThanRingSlots) {
  SimOptions o;
  o.ring_slots = 2;
  const std::uint64_t iters = 3;
  auto ref = reference(4, iters);
  Rig r(hvm(4, iters), Mode::Icebp, o);
  r.attach();
  const std::uint64_t fn = r.g.sym("demo_classify");
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  r.start();
  // Nothing answered yet: all four reach the trap, two in the ring and two waiting.
  ASSERT_TRUE(eventually([&] { return r.all_stopped_at(fn, 4); }));
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(r.all_stopped_at(fn, 4));
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  std::map<unsigned, unsigned> per_vcpu;
  for (const Stop& s : sink.stops) per_vcpu[s.vcpu.value]++;
  for (unsigned v = 0; v < 4; ++v) {
    EXPECT_EQ(per_vcpu[v], expected_calls(DEMO_FN_CLASSIFY, iters)) << "vcpu " << v;
    EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
  }
}

// No room for an answer in the ring, even after a notify: it is kept and delivered on the
// next round, its vCPU stays paused meanwhile, and the sink is not asked twice.
TEST(VmEventChannel, AnswerWithoutRoomIsKeptNotLost) {
  auto ref = reference(2, 3);
  Rig r(hvm(2, 3), Mode::Icebp);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_write");
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = skip_nop;
  r.start();
  ASSERT_TRUE(eventually([&] { return r.all_stopped_at(fn, 2); }));
  // The first answer gets in; the second finds no room, nor after the notify that follows.
  r.g.host->fail_op(Op::RingPutResponse, Errc::NoSpace, 1, 2);
  auto n = r.ch->process(sink);
  ASSERT_TRUE(n) << n.error().what;
  EXPECT_EQ(*n, 2u);
  ASSERT_EQ(sink.stops.size(), 2u);
  EXPECT_EQ(r.ch->counters().deferred, 1u);
  EXPECT_EQ(r.g.host->op_count(Op::RingNotify), 1u) << "a notify to make room before giving up";
  EXPECT_EQ(r.ch->poll_interval_ms(), 1) << "the loop must come back for the kept answer";
  const unsigned held = sink.stops[1].vcpu.value;
  std::this_thread::sleep_for(50ms);
  auto regs = r.g.hv->get_vcpu_regs(r.g.dom, VcpuId{held});
  EXPECT_EQ(regs->rip, fn) << "still paused: its answer is not in the ring";

  // An answer that fails otherwise is kept as well, and the error is reported.
  r.g.host->fail_op(Op::RingPutResponse, Errc::Io);
  auto bad = r.ch->process(sink);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::Io);
  EXPECT_EQ(r.g.hv->get_vcpu_regs(r.g.dom, VcpuId{held})->rip, fn);

  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  EXPECT_EQ(sink.stops.size(), 2 * expected_calls(DEMO_FN_WRITE, 3)) << "one stop per call, none twice";
  for (unsigned v = 0; v < 2; ++v) {
    EXPECT_EQ(r.g.stats(v).calls[DEMO_FN_WRITE], expected_calls(DEMO_FN_WRITE, 3));
    EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
  }
  EXPECT_EQ(r.ch->poll_interval_ms(), 0);
}

// ---- traps that are not ours ---------------------------------------------------------

// The guest's own int3 (int3 mode intercepts them all): handed back as the #BP the guest
// would have taken. The demo guest has no IDT, so the simulated Xen crashes it on delivery.
TEST(VmEventChannel, ForeignInt3IsHandedBackToTheGuest) {
  Rig r(hvm(1, 2), Mode::Int3);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_write");
  r.patch(fn, 0xcc);
  FakeSink sink;  // owns nothing
  r.start();
  ASSERT_FALSE(r.run(
      sink, [] { return false; }, 10s))
      << "the guest took its #BP";
  EXPECT_TRUE(sink.stops.empty());
  ASSERT_EQ(r.rec.injected.size(), 1u);
  const Injected& i = r.rec.injected[0];
  EXPECT_EQ(i.vector, 3);
  EXPECT_EQ(i.type, 6) << "software exception: delivered with RIP after the int3";
  EXPECT_EQ(i.insn_len, 1);
  EXPECT_EQ(i.error_code, ~0u);
  EXPECT_EQ(r.ch->counters().injected, 1u);
  EXPECT_NE(r.g.host->crash_reason(r.g.dom).find("injected exception 3"), std::string::npos)
      << r.g.host->crash_reason(r.g.dom);
  ASSERT_EQ(r.rec.responses.size(), 1u);
  EXPECT_EQ(r.rec.responses[0].flags, kPaused) << "unpaused, RIP left on the int3 for the injection";
}

TEST(VmEventChannel, ForeignIcebpIsHandedBackToTheGuest) {
  Rig r(hvm(1, 2), Mode::Icebp);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_write");
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {r.g.sym("sys_read")};  // ours are elsewhere
  r.start();
  ASSERT_FALSE(r.run(
      sink, [] { return false; }, 10s));
  EXPECT_TRUE(sink.stops.empty());
  ASSERT_EQ(r.rec.injected.size(), 1u);
  EXPECT_EQ(r.rec.injected[0].vector, 1);
  EXPECT_EQ(r.rec.injected[0].type, 5) << "privileged software exception, as ICEBP raises it";
  EXPECT_EQ(r.rec.injected[0].insn_len, 1);
  EXPECT_NE(r.g.host->crash_reason(r.g.dom).find("injected exception 1"), std::string::npos);
}

// The guest single-steps itself (TF): a hardware #DB, trap-like, never ours.
TEST(VmEventChannel, GuestSingleStepIsHandedBack) {
  Rig r(hvm(1, 2), Mode::Icebp);
  r.attach();
  auto regs = r.g.hv->get_vcpu_regs(r.g.dom, VcpuId{0});
  ASSERT_TRUE(regs);
  regs->rflags |= 0x100;  // TF
  ASSERT_TRUE(r.g.hv->set_vcpu_regs(r.g.dom, VcpuId{0}, *regs));
  FakeSink sink;
  sink.own_everything = true;  // a #DB after a step is no stop, whatever the sink claims
  r.start();
  ASSERT_FALSE(r.run(
      sink, [] { return false; }, 10s));
  EXPECT_TRUE(sink.stops.empty());
  ASSERT_EQ(r.rec.injected.size(), 1u);
  EXPECT_EQ(r.rec.injected[0].vector, 1);
  EXPECT_EQ(r.rec.injected[0].type, 3);
  EXPECT_EQ(r.rec.injected[0].insn_len, 0);
}

// A stop whose trap the engine no longer knows, and whose byte is gone from memory (it was
// restored while the request waited): re-executed, not handed to the guest.
TEST(VmEventChannel, ForeignLookingTrapWhoseByteIsGoneIsReexecuted) {
  auto ref = reference(1, 2);
  Rig r(hvm(1, 2), Mode::Int3);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_read");
  const std::uint8_t orig = r.byte_at(fn);
  r.patch(fn, 0xcc);
  FakeSink sink;  // the engine forgot the probe
  r.start();
  ASSERT_TRUE(eventually([&] { return r.all_stopped_at(fn, 1); }));
  r.patch(fn, orig);
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  EXPECT_TRUE(r.rec.injected.empty());
  EXPECT_EQ(r.ch->counters().retried, 1u);
  EXPECT_EQ(r.g.stats(0).calls[DEMO_FN_READ], expected_calls(DEMO_FN_READ, 2));
  EXPECT_EQ(r.g.stats(0).checksum, ref[0].checksum);
}

}  // namespace
}  // namespace xenprobes::testing
