// The vm_event channel (vmevent_rig.hpp) agentless, in int3 mode: a stop answered with EMULATE
// (Xen runs the original bytes), edited registers taking two answers, EMULATE refused in ICEBP
// mode, and a forgotten trap dropping its pending emulation.
#include "vmevent/vmevent_rig.hpp"

namespace xenprobes::testing {
namespace {

// ---- agentless: Xen emulates the original bytes (int3 mode) --------------------------

TEST(VmEventChannel, AgentlessStopIsAnsweredWithEmulate) {
  auto ref = reference(2, 4);
  Rig r(hvm(2, 4), Mode::Int3);
  r.attach();
  const std::uint64_t ret = r.g.sym("sys_getppid") + 0x3f;  // ret: emulated by Xen
  ASSERT_EQ(r.byte_at(ret), 0xc3);
  r.patch(ret, 0xcc);
  FakeSink sink;
  sink.owned = {ret};
  sink.handler = [](Stop& s) {
    s.emulate = Stop::Emulate{1, {0xc3}};
    return Verdict::Resume;
  };
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  EXPECT_EQ(sink.stops.size(), 2 * expected_calls(DEMO_FN_GETPPID, 4));
  EXPECT_EQ(r.ch->counters().emulated, sink.stops.size());
  EXPECT_EQ(r.ch->counters().two_step, 0u);
  ASSERT_EQ(r.rec.responses.size(), sink.stops.size());
  for (const auto& rsp : r.rec.responses) {
    EXPECT_EQ(rsp.flags, kPaused | kEmulate) << "no SET_REGISTERS: it shares the union with the bytes";
    EXPECT_EQ(rsp.emul_insn[0], 0xc3);
    EXPECT_EQ(rsp.reason, hv::VmEventReason::SoftwareBreakpoint);
  }
  for (unsigned v = 0; v < 2; ++v) EXPECT_EQ(r.g.stats(v).checksum, ref[v].checksum);
  EXPECT_EQ(r.byte_at(ret), 0xcc) << "the breakpoint stayed armed throughout";
}

// A handler that edits registers and still wants the instruction emulated: the registers go
// first (SET_REGISTERS, rip on the int3), the vCPU traps again at once and that stop is
// answered with EMULATE without asking the sink again.
TEST(VmEventChannel, AgentlessWithEditedRegistersTakesTwoAnswers) {
  auto ref42 = reference(1, 4, 42);
  Rig r(hvm(1, 4), Mode::Int3);
  r.attach();
  const std::uint64_t ret = r.g.sym("sys_getppid") + 0x3f;
  r.patch(ret, 0xcc);
  FakeSink sink;
  sink.owned = {ret};
  sink.handler = [](Stop& s) {
    s.regs.rax = 42;  // sys_getppid now returns 42
    s.emulate = Stop::Emulate{1, {0xc3}};
    return Verdict::Resume;
  };
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  const std::uint64_t calls = expected_calls(DEMO_FN_GETPPID, 4);
  EXPECT_EQ(sink.stops.size(), calls) << "the handler ran once per call";
  EXPECT_EQ(r.ch->counters().two_step, calls);
  EXPECT_EQ(r.ch->counters().emulated, calls);
  ASSERT_EQ(r.rec.responses.size(), 2 * calls);
  for (std::size_t i = 0; i < r.rec.responses.size(); i += 2) {
    EXPECT_EQ(r.rec.responses[i].flags, kPaused | hv::kVmEventFlagSetRegisters);
    EXPECT_EQ(r.rec.responses[i].regs.rax, 42u);
    EXPECT_EQ(r.rec.responses[i].regs.rip, ret);
    EXPECT_EQ(r.rec.responses[i + 1].flags, kPaused | kEmulate);
  }
  EXPECT_EQ(r.g.stats(0).checksum, ref42[0].checksum) << "the edit took effect before the ret ran";
  EXPECT_EQ(r.g.stats(0).calls[DEMO_FN_GETPPID], calls);
}

// Xen emulates only in answer to a software breakpoint: in ICEBP mode the channel cannot, and
// gives the domain up to the engine (which disarms: the vCPU re-executes the original).
TEST(VmEventChannel, EmulateIsRefusedInIcebpMode) {
  auto ref = reference(1, 2);
  Rig r(hvm(1, 2), Mode::Icebp);
  r.attach();
  const std::uint64_t fn = r.g.sym("sys_read");
  const std::uint8_t orig = r.byte_at(fn);
  r.patch(fn, 0xf1);
  FakeSink sink;
  sink.owned = {fn};
  sink.handler = [](Stop& s) {
    s.emulate = Stop::Emulate{5, {0x0f, 0x1f, 0x44, 0x00, 0x00}};
    return Verdict::Resume;
  };
  sink.on_failure = [&] {
    EXPECT_TRUE(r.gm->write_u8(Gva{fn}, orig));
    sink.owned.clear();
  };
  r.start();
  ASSERT_TRUE(r.run_to_completion(sink)) << r.g.host->crash_reason(r.g.dom);
  ASSERT_EQ(sink.failures.size(), 1u);
  EXPECT_EQ(sink.failures[0].code, Errc::NotSupported);
  EXPECT_NE(sink.failures[0].what.find("int3 mode"), std::string::npos) << sink.failures[0].what;
  EXPECT_EQ(r.ch->counters().emulated, 0u);
  EXPECT_EQ(r.g.stats(0).checksum, ref[0].checksum);
}

// Once the engine has removed a trap, a pending second half of a two-step emulation is
// forgotten: the next stop there goes to the sink again.
TEST(VmEventChannel, AForgottenTrapDropsThePendingEmulation) {
  Rig r(hvm(1, 0), Mode::Int3);
  r.attach();
  const std::uint64_t ret = r.g.sym("sys_getppid") + 0x3f;
  r.patch(ret, 0xcc);
  FakeSink sink;
  sink.owned = {ret};
  sink.handler = [&](Stop& s) {
    if (sink.stops.size() == 1) {
      s.regs.rax = 7;
      // Hold the domain so that the vCPU cannot come back before the trap is removed.
      EXPECT_TRUE(r.g.hv->pause(r.g.dom));
    }
    s.emulate = Stop::Emulate{1, {0xc3}};
    return Verdict::Resume;
  };
  r.start();
  ASSERT_TRUE(r.run(sink, [&] { return r.ch->counters().two_step == 1; }));
  EXPECT_EQ(r.ch->counters().emulated, 0u);
  r.ch->trap_forgotten(r.g.dom, Gva{ret});
  ASSERT_TRUE(r.g.hv->unpause(r.g.dom));
  ASSERT_TRUE(r.run(sink, [&] { return sink.stops.size() >= 2; }));
  EXPECT_EQ(sink.stops[1].vcpu, sink.stops[0].vcpu);
  EXPECT_EQ(sink.stops[1].regs.rax, 7u) << "the same vCPU, back on the int3 with the edited registers";
  ASSERT_TRUE(r.run(sink, [&] { return r.ch->counters().emulated >= 1; }));
  r.patch(ret, 0xc3);
}

}  // namespace
}  // namespace xenprobes::testing
